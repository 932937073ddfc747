"""Endings that lose nothing: one rank finishing first never fails its peers' work.

A rank's shutdown (explicit, or at exit) is its own: ops of process sets it is not in
go on, the job's engines end when every rank has finished, and an op that needs a rank
that has finished fails at once, naming it. Each script below is natural (no final
barrier) and makes the race certain: ranks 2 and 3 run their last ops after ranks 0
and 1 have finished (tests/ranks/ending_one_set_first.py).
"""
import pytest

from harness import rank_program, run_ranks

ONE_SET_FIRST = rank_program("ending_one_set_first")


@pytest.mark.parametrize("launcher", ["horovodlikerun", "mpirun"])
@pytest.mark.parametrize("script", ["sharded", "pipeline", "tp"])
def test_a_set_that_finishes_first_never_fails_another_sets_last_ops(script, launcher):
    res = run_ranks(ONE_SET_FIRST, 4, launcher, args=(script,), timeout=120)
    res.assert_ok()     # exit 0, and every rank printed its last line
