"""horovodlike.tensorflow.keras with Keras 3: DistributedOptimizer in model.fit (weights
and optimizer state bit-identical across ranks), the callbacks, save/load with and
without horovodlike, backward_passes_per_step, the XLA refusal, DistributedGradientTape
in a tf.function training loop against a one-process reference, and, at one rank,
bit-identity with plain Keras.
"""
import importlib.util

import pytest

from harness import launcher_matrix, rank_program, run_ranks

from tf_support import TF_ENV  # noqa: E402  (skips the module without TensorFlow)

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(300)


MULTI = rank_program("tf_keras_multi")

ONE_RANK = rank_program("tf_keras_one_rank")


@pytest.mark.parametrize("launcher,np_", launcher_matrix([("horovodlikerun", 2)]))
def test_keras_fit_identical_state_callbacks_save_load(launcher, np_, tmp_path):
    env = dict(TF_ENV, HVDTEST_TMP=str(tmp_path))
    run_ranks(MULTI, np_, launcher, env=env, timeout=240).assert_ok()


def test_keras_one_rank_is_plain_keras(tmp_path):
    env = dict(TF_ENV, HVDTEST_TMP=str(tmp_path))
    run_ranks(ONE_RANK, 1, "python", env=env,
              timeout=240).assert_ok()


SYNC_BN = rank_program("tf_keras_sync_bn")


@pytest.mark.timeout(240)
def test_sync_batch_normalization_uses_the_global_batch():
    run_ranks(SYNC_BN, 2, "horovodlikerun", env=dict(TF_ENV), timeout=200).assert_ok()
