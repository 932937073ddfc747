"""Rank program of tests/test_security.py, run by test_handles_byte_order_and_names."""
import numpy as np
import horovodlike as hvd


def main():
    hvd.init()
    stale = hvd.allreduce_async(np.ones(3, np.float32), name="before")
    hvd.shutdown()
    hvd.init()
    fresh = hvd.allreduce_async(np.full(3, 7.0, np.float32), name="after")
    try:
        hvd.synchronize(stale)
        print("STALE-ANSWERED")
    except ValueError as e:
        print("STALE-REFUSED", e)
    print("FRESH", hvd.synchronize(fresh).tolist())
    try:
        hvd.allreduce(np.ones(3, ">f4"), name="big-endian")
    except TypeError as e:
        print("BYTEORDER", e)
    for name in ("a\0b", "a"):
        try:
            hvd.allreduce(np.ones(3, np.float32), name=name)
            print("NAME-OK", repr(name))
        except ValueError as e:
            print("NAME-REFUSED", repr(name), e)


if __name__ == "__main__":
    main()
