"""Misuse that used to hang forever now ends in an error that says what happened:
a fork after init(), ops that can never match (a deadlock), a rank that leaves while
others wait on its ops. Each case runs real ranks under horovodlikerun (or one plain
python process) with a timeout far below the 60 s of a stall warning, so a hang fails
the test instead of passing it late.
"""
import importlib.util

import pytest

from harness import RANK_PRELUDE, run_ranks

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(120)

FORK = RANK_PRELUDE + r'''
import multiprocessing as mp

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
'''


def test_fork_after_init_raises_in_the_child_and_init_there_works():
    run_ranks(FORK, 1, "python", timeout=60).assert_ok()
