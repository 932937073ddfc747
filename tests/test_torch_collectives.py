"""horovodlike.torch collectives on real jobs: allreduce (every dtype x op, scaling,
in-place, non-contiguous, async/poll, grouped), allgather (variable first dimension,
grouped), broadcast (every root, in-place, async), barrier, and autograd through
allreduce / allgather / broadcast and their grouped forms.

Every rank can recompute every rank's input from (case, rank), so each checks the exact
result it must get; data is chosen so that every partial result is exactly
representable (bit-exact even for float16/bfloat16), except Average over a size that is
not a power of two, which is compared with a tolerance. One launch per world size
checks every case.
"""
import importlib.util

import pytest

from harness import launcher_matrix, rank_program
from test_torch_support import run_torch

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(300)

MATRIX = launcher_matrix([("python", 1), ("horovodlikerun", 2), ("mpirun", 3),
                          ("horovodlikerun", 4)])

CASES = rank_program("torch_collectives_cases")


@pytest.mark.parametrize("launcher,np_", MATRIX)
def test_torch_collectives(launcher, np_):
    run_torch(CASES, np_, launcher, timeout=240)
