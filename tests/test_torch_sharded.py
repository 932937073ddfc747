"""ShardedDistributedOptimizer on real jobs, against plain DistributedOptimizer.

Every launch trains, in the same job, a model with DistributedOptimizer and copies of it
with ShardedDistributedOptimizer for each shard size (the whole set, 2 and 1 where they
divide it), stage 1 and 2, and SGD with momentum, Adam and AdamW; after a few steps the
parameters must match within float tolerance and be bit-identical across ranks. The
model has two parameter groups, a float64 parameter (a second flat buffer), a frozen and
an unused parameter, and buckets small enough that there are several. One configuration
per launch also checks backward_passes_per_step, fp16 compression, op=Sum, clipping,
the consolidated state against DistributedOptimizer's, checkpoints resharded to another
shard size, and broadcast_optimizer_state.
"""
import importlib.util
import signal
import socket

import pytest

from harness import rank_program, run_ranks
from test_torch_support import run_torch

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(420)

FAKE_NODES = ["-H", "a:2,b:2", "--ssh-command", "sh -c {command}"]


EQUIVALENCE = rank_program("torch_sharded_equivalence")


@pytest.mark.parametrize("np_", [2, 3, 4], ids=lambda n: f"np{n}")
def test_sharded_matches_distributed_optimizer(np_, tmp_path):
    run_torch(EQUIVALENCE, np_, timeout=400, env={"HVDTEST_TMP": tmp_path})


def test_hybrid_shards_inside_fake_nodes(tmp_path):
    """shard_size=hvd.local_size() on two fake nodes of two ranks: MiCS's two hops
    (reduce-scatter in the node, allreduce across)."""
    run_torch(EQUIVALENCE, 4, timeout=400, launcher_args=FAKE_NODES,
              env={"HVDTEST_TMP": tmp_path, "HVDTEST_LOCAL_SHARDS": "1"})


WORLD_CHANGE = rank_program("torch_sharded_world_change")


def test_checkpoint_round_trip_across_a_change_of_world_size(tmp_path):
    run_torch(WORLD_CHANGE, 4, timeout=300, env={"HVDTEST_TMP": tmp_path,
                                                 "HVDTEST_PHASE": "save"})
    run_torch(WORLD_CHANGE, 2, timeout=300, env={"HVDTEST_TMP": tmp_path,
                                                 "HVDTEST_PHASE": "load"})


ERRORS = rank_program("torch_sharded_errors")


def test_refusals_and_errors():
    run_torch(ERRORS, 2, timeout=200)


IN_PLACE = rank_program("torch_sharded_in_place")


@pytest.mark.parametrize("np_", [2, 3])
def test_collectives_write_into_the_optimizers_buffers(np_):
    run_torch(IN_PLACE, np_, timeout=200)


STATIC_SETS = rank_program("torch_sharded_static_sets")


def test_static_process_sets_are_completed_by_the_optimizer():
    run_torch(STATIC_SETS, 4, timeout=200)


PLAIN_INIT = rank_program("torch_sharded_plain_init")


def test_sharded_optimizer_works_after_a_plain_init():
    run_torch(PLAIN_INIT, 4, timeout=200)


KILLED = rank_program("torch_sharded_killed")


@pytest.mark.parametrize("np_,shards", [(3, 3), (4, 2)], ids=["np3-whole", "np4-hybrid"])
def test_a_killed_rank_fails_the_job_naming_it(np_, shards):
    res = run_ranks(KILLED, np=np_, timeout=120, env={"HVDTEST_SHARDS": shards})
    host = socket.gethostname()
    assert res.returncode == 128 + signal.SIGKILL, res.describe()
    assert f"rank {np_ - 1} (host {host}) was killed by signal 9" in res.stderr, \
        res.describe()
    assert res.elapsed < 60, res.describe()
