"""Rank program of tests/test_blocked_caller.py, run by
test_blocked_caller_does_not_hold_back_other_threads."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)
import threading


def main():
    hvd.init()
    R = hvd.rank()
    assert hvd.size() == 2


    def watchdog(what, seconds=30.0):
        def fire():
            sys.stderr.write(f"rank {R}: HANG in {what}\n")
            sys.stderr.flush()
            os._exit(3)
        t = threading.Timer(seconds, fire)
        t.daemon = True
        t.start()
        return t


    def collective(mode, x, name):
        if mode == "blocking":
            return hvd.allreduce(x, name=name, op=hvd.Sum)
        return hvd.synchronize(hvd.allreduce_async(x, name=name, op=hvd.Sum))


    def case(i, a_mode, b_mode):
        x = np.full(4, R + 1.0)
        if R == 1:                          # `other` first; `blocked` only once it is done
            b = collective(b_mode, x, f"other.{i}")
            a = collective(a_mode, x, f"blocked.{i}")
        else:
            got, started = {}, threading.Event()

            def waiter():
                if a_mode == "blocking":
                    started.set()
                    got["a"] = hvd.allreduce(x, name=f"blocked.{i}", op=hvd.Sum)
                else:
                    h = hvd.allreduce_async(x, name=f"blocked.{i}", op=hvd.Sum)
                    started.set()
                    got["a"] = hvd.synchronize(h)

            t = threading.Thread(target=waiter)
            t.start()
            started.wait()
            b = collective(b_mode, x, f"other.{i}")
            t.join()
            a = got.get("a")
        check_equal(b, np.full(4, 3.0), f"other.{i} ({a_mode}/{b_mode})")
        check_equal(a, np.full(4, 3.0), f"blocked.{i} ({a_mode}/{b_mode})")


    MODES = [("blocking", "blocking"), ("async", "blocking"), ("blocking", "async"),
             ("async", "async")]
    i = 0
    for a_mode, b_mode in MODES:
        dog = watchdog(f"A {a_mode}, B {b_mode}")
        for _ in range(30):
            case(i, a_mode, b_mode)
            i += 1
        dog.cancel()
    finish()


if __name__ == "__main__":
    main()
