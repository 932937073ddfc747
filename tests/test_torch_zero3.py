"""ShardedDistributedOptimizer(stage=3): parameter sharding (ZeRO-3, and MiCS with
partition groups) against one process training the global batch, in float64, with the
resident parameter bytes counted from the storages."""
import pytest

from harness import launcher_matrix, rank_program, run_ranks

EQUIVALENCE = rank_program("torch_zero3_equivalence")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("launcher,np_", launcher_matrix([("horovodlikerun", 2),
                                                          ("horovodlikerun", 4)]))
def test_stage3_matches_one_process(launcher, np_):
    res = run_ranks(EQUIVALENCE, np_, launcher, timeout=180)
    res.assert_ok(sentinel="OK")


MISUSE = rank_program("torch_zero3_misuse")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", ["skip", "order"])
def test_ranks_that_run_other_units_fail(case):
    res = run_ranks(MISUSE, 2, args=(case,), timeout=90)
    lines = res.rank_lines()
    for r in range(2):
        failed = [x for x in lines.get(r, []) if x.startswith("FAILED-AS-EXPECTED")]
        assert failed, res.describe()
        assert "gathering unit 'blocks." in failed[0], failed[0]
        assert "must run the same units in the same order" in failed[0], failed[0]
        assert "rank 0" in failed[0] and "rank 1" in failed[0], failed[0]
