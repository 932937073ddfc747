"""horovodlike.tensorflow at 3 ranks: process sets whose ranks are not 0..n-1, the names
of unnamed ops (inside and outside sets, eager and traced into graphs), and the
tf.errors types Horovod raises.

- root_rank is a GLOBAL rank, also with a process set: a broadcast on the set [1, 2]
  from root 2 (tensors, variables, objects, the gradient) sends rank 2's value.
- Unnamed ops are numbered per process set, so a rank's unnamed ops in its own sets do
  not shift the numbers of its global ones.
- Unnamed ops traced into a tf.function get their names when traced, per function
  graph: a dozen unnamed allreduces and allgathers of mixed shapes and dtypes in one
  function pair up on every run; two functions run from threads in a different order
  on each rank still pair up; a rank that retraces a function alone still matches.
- Mismatches are tf.errors.FailedPreconditionError (eager and in graphs), bad
  arguments InvalidArgumentError, Adasum UnimplementedError.
"""
import importlib.util

import pytest

from harness import launcher_matrix, rank_program, run_ranks

from tf_support import TF_ENV  # noqa: E402  (skips the module without TensorFlow)

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(300)

BODY = rank_program("tf_sets")


@pytest.mark.parametrize("launcher,np_", launcher_matrix([("horovodlikerun", 3)]))
def test_tf_sets_names_errors(launcher, np_):
    run_ranks(BODY, np_, launcher, env=dict(TF_ENV),
              timeout=240).assert_ok()


EXISTS = rank_program("tf_set_exists")


def test_a_process_set_that_does_not_exist_is_refused_when_the_op_is_made():
    run_ranks(EXISTS, 1, "python", env=dict(TF_ENV), timeout=120).assert_ok()
