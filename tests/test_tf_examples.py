"""The TensorFlow examples run offline and train to single-process accuracy across ranks
(a single process reaches about 0.97 test accuracy on both digits examples)."""
import importlib.util
import re

import pytest

import tf_support  # noqa: F401  (skips the module without TensorFlow)
from harness import REPO, launcher_param, run_ranks

if importlib.util.find_spec("sklearn") is None:
    pytest.skip("scikit-learn is not installed", allow_module_level=True)

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(300)

# The examples choose their own thread counts, so only quiet them here.
TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": "-1",
          "TF_ENABLE_ONEDNN_OPTS": "0"}
EXAMPLES = REPO / "examples"


def _accuracy(res):
    m = re.findall(r"test accuracy ([0-9.]+)", res.stdout)
    assert m, f"no accuracy line\n{res.describe()}"
    return float(m[-1])


@pytest.mark.parametrize("launcher,np_", [launcher_param("horovodlikerun", 4, id="hvdrun-np4")])
def test_tensorflow2_digits(launcher, np_, tmp_path):
    res = run_ranks(EXAMPLES / "tensorflow2_digits.py", np_, launcher, env=TF_ENV,
                    timeout=240, args=["--checkpoint-dir", tmp_path])
    assert res.returncode == 0, res.describe()
    assert _accuracy(res) >= 0.94, res.describe()
    assert "weights identical on every rank: True" in res.stdout, res.describe()
    assert list(tmp_path.glob("ckpt-1*")), "rank 0 did not write the checkpoint"


@pytest.mark.parametrize("launcher,np_", [launcher_param("mpirun", 2, id="mpirun-np2")])
def test_tensorflow2_keras_digits(launcher, np_, tmp_path):
    res = run_ranks(EXAMPLES / "tensorflow2_keras_digits.py", np_, launcher, env=TF_ENV,
                    timeout=240, args=["--checkpoint-dir", tmp_path])
    assert res.returncode == 0, res.describe()
    assert _accuracy(res) >= 0.94, res.describe()
    assert "finished gradual learning rate warmup" in res.stdout, res.describe()
    assert list(tmp_path.glob("checkpoint-*.keras")), "rank 0 did not write checkpoints"


def test_tensorflow2_synthetic_benchmark():
    res = run_ranks(EXAMPLES / "tensorflow2_synthetic_benchmark.py", 2, "horovodlikerun",
                    env=TF_ENV, timeout=240,
                    args=["--fp16-allreduce", "--num-warmup-batches", "2", "--num-iters", "2",
                          "--num-batches-per-iter", "5"])
    assert res.returncode == 0, res.describe()
    assert re.search(r"Total img/sec on 2 CPU\(s\): [0-9.]+", res.stdout), res.describe()
