"""Process sets and join() through horovodlike.torch, with ranks doing different things:
even and odd ranks each run collectives in their own set (static sets given to init(),
and dynamic ones added and removed at run time), train in their own set with
DistributedOptimizer, and join() lets ranks with fewer batches stop early.
"""
import importlib.util

import pytest

from harness import launcher_matrix, rank_program
from test_torch_support import run_torch

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(300)

SETS = rank_program("torch_process_sets_join_sets")

JOIN = rank_program("torch_process_sets_join_join")


@pytest.mark.parametrize("launcher,np_,static", [
    pytest.param("horovodlikerun", 3, "1", id="horovodlikerun-np3-static"),
    pytest.param("horovodlikerun", 4, "0", id="horovodlikerun-np4-dynamic")])
def test_process_sets_with_ranks_doing_different_things(launcher, np_, static):
    run_torch(SETS, np_, launcher, timeout=240, env={"HVDTEST_STATIC": static})


@pytest.mark.parametrize("launcher,np_", launcher_matrix([("mpirun", 3)]))
def test_join_with_uneven_work(launcher, np_):
    run_torch(JOIN, np_, launcher, timeout=180)
