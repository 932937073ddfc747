"""The staging pipeline (horovodlike/torch/_staging.py) on the CPU: the torch collective
and optimizer tests once more with HOROVODLIKE_FORCE_STAGING=1, so every tensor goes
through the pool, the staging thread, the pieces and the fused groups that CUDA tensors
take; only the CUDA stream, event and pinned-allocation calls are left for
tests/test_torch_gpu.py.

Pieces are made tiny (HOROVODLIKE_STAGING_PIECE_BYTES=64) so that the tests' small
tensors are cut into several pieces each. Every rerun ends by checking the staging
counters, so it fails if the ops went around the staging path. One launch per body, at
2 ranks: the unstaged tests cover the other world sizes and launchers.
"""
import importlib.util
import signal
import time

import pytest

from harness import rank_program
from test_failures import HOST, _cleanup, _read_until, _spawn_job
from test_torch_alltoall_reducescatter import CASES as ALLTOALL_REDUCESCATTER
from test_torch_collectives import CASES as COLLECTIVES
from test_torch_optimizer import BEHAVIOUR, OPTIMIZERS
from test_torch_support import run_torch

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(300)

STAGED = {"HOROVODLIKE_FORCE_STAGING": "1", "HOROVODLIKE_STAGING_PIECE_BYTES": "64"}

# Runs a torch rank program and checks, before its finish(), that its ops were staged.
STAGED_RUN = rank_program("torch_staged")


@pytest.mark.parametrize("program,min_ops,allreduces", [
    pytest.param(COLLECTIVES, 300, True, id="collectives"),
    pytest.param(ALLTOALL_REDUCESCATTER, 40, False, id="alltoall-reducescatter"),
    pytest.param(BEHAVIOUR, 40, True, id="optimizer-behaviour"),
    pytest.param(OPTIMIZERS, 40, False, id="optimizers"),
])
def test_torch_tests_pass_with_staging_forced(program, min_ops, allreduces):
    run_torch(STAGED_RUN, 2, "horovodlikerun", timeout=240, env=STAGED,
              args=(program, min_ops, int(allreduces)))


def test_large_tensor_is_pipelined_in_pieces_and_pool_is_bounded():
    """A 4 MiB tensor in 64 KiB pieces: the result is exact, every piece is its own engine
    op, and the pool keeps buffers within HOROVODLIKE_STAGING_POOL_BYTES."""
    env = dict(STAGED, HOROVODLIKE_STAGING_PIECE_BYTES=str(64 << 10))
    run_torch(rank_program("torch_staging_large_tensor"), 2, "horovodlikerun", timeout=120,
              env=env)


KILLED_DURING_STAGED_OP = rank_program("torch_staging_killed_during_staged_op")


def killed_rank_during_staged_op(tmp_path, extra_env):
    """Kill rank 1 of 2 while staged allreduces are in flight: rank 0 raises
    HorovodInternalError naming rank 1, promptly."""
    store, procs = _spawn_job(KILLED_DURING_STAGED_OP, 2, tmp_path, extra_env=extra_env)
    try:
        deadline = time.monotonic() + 90
        for p in procs:
            _read_until(p, "midway", deadline)
        procs[1].send_signal(signal.SIGKILL)
        t0 = time.monotonic()
        out = "".join(_read_until(procs[0], "lost 0", deadline))
        took = time.monotonic() - t0
        assert f"rank 1 (host {HOST}) was lost" in out, out
        staged_pieces = int(out.split("staged=")[1].split(":")[0])
        assert staged_pieces > 8, f"the op was not staged in pieces: {out}"
        assert took < 30, f"rank 0 needed {took:.1f}s to notice"
        assert procs[0].wait(timeout=30) == 0
    finally:
        _cleanup(store, procs)


@pytest.mark.timeout(120)
def test_killed_rank_during_staged_op_is_named(tmp_path):
    killed_rank_during_staged_op(tmp_path, dict(STAGED,
                                                HOROVODLIKE_STAGING_PIECE_BYTES=str(1 << 20)))
