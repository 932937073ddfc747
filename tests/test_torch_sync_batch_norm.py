"""SyncBatchNorm against torch's BatchNorm run on the whole global batch.

Ranks hold batches of different sizes; every rank rebuilds the global batch locally and
checks its own slice of the output, its input gradient (of the sum of every rank's
loss), the summed weight and bias gradients, the running statistics and eval mode.
"""
import importlib.util

import pytest

from harness import launcher_matrix, rank_program
from test_torch_support import run_torch

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(240)

SYNC_BN = rank_program("torch_sync_batch_norm_sync_bn")


@pytest.mark.parametrize("launcher,np_", launcher_matrix([("horovodlikerun", 2),
                                                          ("mpirun", 3)]))
def test_sync_batch_norm_matches_batch_norm_on_the_global_batch(launcher, np_):
    run_torch(SYNC_BN, np_, launcher, timeout=180)
