"""Program of tests/test_engine_hostile.py, run by test_a_name_with_a_nul_byte_is_refused:
a one-rank engine asked for an allreduce whose name holds a NUL byte; prints
"refused: <error>" when enqueue refuses it."""
import numpy as np
from horovodlike.common import engine


def main():
    engine.start(0, 1, [engine.prepare("h", "127.0.0.1", "127.0.0.1", b"k" * 32)])
    x = np.ones(4, np.float32)
    try:
        engine.enqueue(engine.ALLREDUCE, "a\0b", engine.DTYPES["float32"], x.shape,
                       x.ctypes.data, x.ctypes.data)
    except ValueError as e:
        print("refused:", e)
    engine.shutdown()


if __name__ == "__main__":
    main()
