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
