"""horovodlike.torch alltoall (with and without splits, received splits, every dtype,
autograd) and reducescatter (Sum/Average, uneven first dimension, scaling, grouped,
autograd), at 1 to 4 ranks. Needs the engine's ALLTOALL and REDUCESCATTER ops.
"""
import importlib.util

import pytest

from harness import launcher_matrix, rank_program
from test_torch_support import run_torch

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(300)

MATRIX = launcher_matrix([("python", 1), ("mpirun", 2), ("horovodlikerun", 3),
                          ("horovodlikerun", 4)])

CASES = rank_program("torch_alltoall_reducescatter_cases")


@pytest.mark.parametrize("launcher,np_", MATRIX)
def test_torch_alltoall_and_reducescatter(launcher, np_):
    run_torch(CASES, np_, launcher, timeout=240)
