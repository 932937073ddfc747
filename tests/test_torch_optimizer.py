"""DistributedOptimizer and the training helpers on real jobs.

Every torch.optim optimizer (LBFGS and SparseAdam included) trains a small model for a
few steps from different per-rank initial weights, after broadcast_parameters and
broadcast_optimizer_state; the parameters must then be bit-identical on every rank. For
the behaviours (averaging, backward_passes_per_step, groups, predivide, fp16, Sum,
closures, skip_synchronize) each rank also replays the whole job locally — it can
regenerate every rank's data — and compares against that reference.
"""
import importlib.util

import pytest

from harness import launcher_matrix, rank_program
from test_torch_support import run_torch

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(300)


OPTIMIZERS = rank_program("torch_optimizer_optimizers")

BEHAVIOUR = rank_program("torch_optimizer_behaviour")


@pytest.mark.parametrize("launcher,np_", launcher_matrix([("python", 1), ("mpirun", 3)]))
def test_every_torch_optimizer_stays_identical_across_ranks(launcher, np_):
    run_torch(OPTIMIZERS, np_, launcher, timeout=240)


@pytest.mark.parametrize("launcher,np_", launcher_matrix([("horovodlikerun", 2),
                                                          ("horovodlikerun", 4)]))
def test_distributed_optimizer_behaviour_and_helpers(launcher, np_):
    run_torch(BEHAVIOUR, np_, launcher, timeout=240)
