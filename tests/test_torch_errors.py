"""Bad input to horovodlike.torch: each gets a clear exception, nothing crashes, and the
engine goes on serving the next op (every rank checks a good collective afterwards).
"""
import importlib.util

import pytest

from harness import launcher_matrix, rank_program
from test_torch_support import run_torch

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(240)

ERRORS = rank_program("torch_errors_errors")

SHUTDOWN = rank_program("torch_errors_shutdown")


@pytest.mark.parametrize("launcher,np_", launcher_matrix([("mpirun", 2)]))
def test_bad_input_gives_clear_errors_and_the_engine_goes_on(launcher, np_):
    run_torch(ERRORS, np_, launcher, timeout=180)


def test_ops_after_shutdown_raise_and_init_starts_again():
    from harness import run_ranks
    run_ranks(SHUTDOWN, 1, "python", timeout=60).assert_ok()
