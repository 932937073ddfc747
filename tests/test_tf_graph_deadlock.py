"""No TensorFlow graph can deadlock the collectives (docs/tensorflow.md, "Why no graph
can deadlock"): 2 ranks run graphs whose independent collectives become ready in
OPPOSITE orders on the two ranks, at 1, 2 and 4 inter-op threads.

Each rank builds the same collectives in the same order, but their inputs wait on a
chain of plain ops that runs forwards on rank 0 and backwards on rank 1. A kernel that
held a TensorFlow thread until its collective finished on every rank would then hold
every thread of both ranks on ops the other rank cannot reach (that hang is what this
test was written against): each stage has a watchdog that names the stage and ends the
rank, so a hang fails in seconds, not at the suite's timeout.

- a TF1 graph run by a `tf.compat.v1.Session` with 24 independent allgathers and
  allreduces, run 20 times, and the same ops in a `tf.function` (there, collectives
  in `tf.cond` branches that read a variable, which TensorFlow's automatic control
  dependencies leave unordered);
- a graph mixing allreduce, allgather, broadcast, alltoall and reducescatter, grouped
  and not, in a Session and in a `tf.function`;
- `model.fit` with `jit_compile=False`, `hvd.DistributedOptimizer` and a
  `SyncBatchNormalization(fused=False)` layer;
- a step that fails after its collective: the next runs of the same graph still work.
"""
import importlib.util

import pytest

from harness import rank_program, run_ranks

from tf_support import TF_ENV  # noqa: E402  (skips the module without TensorFlow)

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(240)

BODY = rank_program("tf_graph_deadlock")


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_tf_graphs_never_deadlock(threads):
    env = dict(TF_ENV, TF_NUM_INTEROP_THREADS=str(threads))
    run_ranks(BODY, 2, "horovodlikerun", env=env, timeout=200).assert_ok()
