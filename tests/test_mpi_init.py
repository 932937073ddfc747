"""MPI initialised as Horovod does (horovodlike/common/mpi_init.py), under mpirun: a
script that sets mpi4py.rc.initialize = False gets MPI initialised by hvd.init() and
finalised at exit; hvd.init(comm=...) on the caller's MPI still works."""
import importlib.util

import pytest

from harness import MPIRUN_SKIP_REASON, rank_program, run_ranks

pytestmark = [pytest.mark.skipif(MPIRUN_SKIP_REASON is not None,
                                 reason=str(MPIRUN_SKIP_REASON))]
if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark.append(pytest.mark.timeout(120))

PROGRAM = rank_program("mpi_init_left_to_us")


@pytest.mark.parametrize("how", ["left to hvd.init", "comm"])
def test_horovods_process_sets_static_pattern_under_mpirun(how):
    np_ = 3
    res = run_ranks(PROGRAM, np_, "mpirun", args=("comm" if how == "comm" else "init",), timeout=100)
    assert res.returncode == 0, res.describe()
    lines = res.rank_lines()
    for r in range(np_):
        assert "HVDTEST-OK" in lines[r], res.describe()
        assert "MPI finalised at exit: True" in lines[r], res.describe()
