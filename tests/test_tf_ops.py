"""horovodlike.tensorflow collectives on real multi-process jobs: every op eagerly and
inside tf.function, every dtype TensorFlow has that the engine carries, Horovod's
gradients, DistributedGradientTape, variables and objects, process sets, join, and
the bad inputs that must give a clear error.

TensorFlow takes seconds to import, so each launch checks everything once and reports
every failing case (the harness prelude's check_* helpers).
"""
import importlib.util

import pytest

from harness import launcher_matrix, rank_program, run_ranks

from tf_support import TF_ENV  # noqa: E402  (skips the module without TensorFlow)

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(300)

BODY = rank_program("tf_ops")


@pytest.mark.parametrize("launcher,np_", launcher_matrix(
    [("horovodlikerun", 2), ("mpirun", 3), ("python", 1)]))
def test_tf_collectives_eager_graph_gradients_errors(launcher, np_):
    env = dict(TF_ENV, HVDTEST_NP=str(np_))
    run_ranks(BODY, np_, launcher, env=env, timeout=240).assert_ok()
