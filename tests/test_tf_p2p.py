"""hvd.send / hvd.recv / hvd.recv_ inside tf.function (horovodlike/tensorflow/p2p.py), at
2 real ranks under horovodlikerun: every dtype and a 0-size tensor, recv with its shape
fully known, partly known and unknown; both ranks sending to and receiving from each
other in one graph, below and above the 64 KiB eager threshold, with one inter-op
thread (a wait that held it, or a recv posted only after a large send completed, would
deadlock: a watchdog then names the stage) and with four; recv_ into a tf.Variable; a recv traced
without dtype; a message of another dtype or shape than declared (the engine's check and
the binding's); XLA refused; a two-stage pipeline step in tf.function against the same
step run eagerly. The eager API is tested by tests/test_p2p.py."""
import os

import pytest

from harness import leaked_segments, rank_program, run_ranks

from tf_support import TF_ENV  # noqa: E402  (skips the module without TensorFlow)

GRAPH = rank_program("p2p_tf_graph")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("threads", [1, 4])
def test_tf_function_send_recv(threads):
    """1 inter-op thread: every node of a step on one thread; 4: posts and waits of
    one step running at once."""
    before = set(os.listdir("/dev/shm"))
    env = dict(TF_ENV, TF_NUM_INTEROP_THREADS=str(threads), HOROVOD_STALL_CHECK_DISABLE="1")
    run_ranks(GRAPH, 2, "horovodlikerun", env=env, timeout=240).assert_ok()
    assert not leaked_segments(before), leaked_segments(before)
    left = [f for f in set(os.listdir("/dev/shm")) - before if f.startswith("hvdl-p2p")]
    assert not left, left
