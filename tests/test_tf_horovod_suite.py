"""Horovod 0.28.1's own TensorFlow tests (tests/horovod_suite/horovod_test_tensorflow.py,
its test/parallel/test_tensorflow.py with only the imports changed) against
horovodlike.tensorflow at 2 ranks, each test in graph mode (a TF1 Session) and in
eager mode.

The whole file takes 6 to 18 minutes here, so the default suite runs a few of the
short tests that hung or failed before: the fused allreduces (many independent
collectives in one Session step), the in-place and graph-mode broadcasts,
SyncBatchNormalization(fused=False) beside Keras' own layer, and the partial tape on
Keras 3 variables. The whole file, and what does not apply to CPU TensorFlow 2.21 with
Keras 3, is in docs/tensorflow.md ("Horovod's test suite").
"""
import importlib.util
from pathlib import Path

import pytest

from harness import rank_program, run_ranks

from tf_support import TF_ENV  # noqa: E402  (skips the module without TensorFlow)

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(400)

SUITE = Path(__file__).parent / "horovod_suite" / "horovod_test_tensorflow.py"

SUBSET = " or ".join([
    "test_horovod_allreduce_cpu_fused", "test_horovod_broadcast_inplace_multiple_cpu",
    "test_horovod_broadcast_graph_mode", "test_horovod_syncbn_cpu",
    "test_partial_distributed_gradient_tape"])

RANK = rank_program("tf_horovod_suite")


def test_horovod_tensorflow_suite_subset():
    res = run_ranks(RANK, 2, "horovodlikerun", args=(SUITE, SUBSET), env=dict(TF_ENV),
                    timeout=360)
    res.assert_ok()
