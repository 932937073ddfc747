"""Rank program of tests/test_misuse_hangs.py, run by
test_fork_after_init_raises_in_the_child_and_init_there_works."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)
import multiprocessing as mp


def main():
    hvd.init()


    def child(q):
        try:
            hvd.allreduce(np.ones(2), name="in.child")
            q.put("no error")
        except RuntimeError as e:
            q.put(str(e))
        q.put(hvd.is_initialized())
        hvd.init()                      # the child's own engine, a job of its own
        q.put(float(hvd.allreduce(np.ones(2), name="in.child")[0]))
        hvd.shutdown()


    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(q,))
    p.start()
    msg, inited, value = q.get(timeout=30), q.get(timeout=30), q.get(timeout=30)
    p.join(30)
    check(msg == "hvd.init() ran in the parent; call hvd.init() again in the child, or use "
                 "the spawn start method", "the child's first call", repr(msg))
    check(inited is False, "is_initialized() in the forked child", repr(inited))
    check(value == 1.0, "allreduce after init() in the child", repr(value))
    check(p.exitcode == 0, "the child's exit status", repr(p.exitcode))
    check_equal(hvd.allreduce(np.ones(2), name="in.parent"), np.ones(2), "the parent still works")
    finish()


if __name__ == "__main__":
    main()
