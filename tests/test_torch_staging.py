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
import textwrap
import time

import pytest

from test_failures import HOST, _cleanup, _read_until, _spawn_job
from test_torch_alltoall_reducescatter import CASES as ALLTOALL_REDUCESCATTER
from test_torch_collectives import CASES as COLLECTIVES
from test_torch_optimizer import BEHAVIOUR, OPTIMIZERS
from test_torch_support import run_torch

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(300)

STAGED = {"HOROVODLIKE_FORCE_STAGING": "1", "HOROVODLIKE_STAGING_PIECE_BYTES": "64"}

# Appended before each body's final finish(): the ops really were staged, in pieces.
CHECK_STAGED = r'''
from horovodlike.torch import _staging
_st = _staging.stats()
check(_st.get("ops", 0) >= MIN_STAGED_OPS, "staged ops", f"{_st}")
check(_st.get("pool_reuses", 0) > 0, "pool buffers are reused", f"{_st}")
'''


def staged(body, min_ops, allreduces):
    head, tail = body.rsplit("finish()", 1)
    extra = CHECK_STAGED.replace("MIN_STAGED_OPS", str(min_ops))
    if allreduces:   # allreduce and broadcast are cut into pieces of rows, the rest is not
        extra += ('check(_st.get("pieces", 0) > _st.get("ops", 0), "several pieces per op", '
                  'f"{_st}")\n')
        extra += 'check(_st.get("fused_groups", 0) > 0, "grouped ops fused", f"{_st}")\n'
    return head + extra + "finish()" + tail


@pytest.mark.parametrize("body,min_ops,allreduces", [
    pytest.param(COLLECTIVES, 300, True, id="collectives"),
    pytest.param(ALLTOALL_REDUCESCATTER, 40, False, id="alltoall-reducescatter"),
    pytest.param(BEHAVIOUR, 40, True, id="optimizer-behaviour"),
    pytest.param(OPTIMIZERS, 40, False, id="optimizers"),
])
def test_torch_tests_pass_with_staging_forced(body, min_ops, allreduces):
    run_torch(staged(body, min_ops, allreduces), 2, "horovodlikerun", timeout=240, env=STAGED)


def test_large_tensor_is_pipelined_in_pieces_and_pool_is_bounded():
    """A 4 MiB tensor in 64 KiB pieces: the result is exact, every piece is its own engine
    op, and the pool keeps buffers within HOROVODLIKE_STAGING_POOL_BYTES."""
    body = r'''
from horovodlike.torch import _staging
hvd.init()
R, P = thvd.rank(), thvd.size()
x = torch.arange(1 << 20, dtype=torch.float32).reshape(1024, 1024) + R
for i in range(3):
    y = thvd.allreduce(x, op=thvd.Sum, name="big")
    t_equal(y, torch.arange(1 << 20, dtype=torch.float32).reshape(1024, 1024) * P
            + sum(range(P)), f"staged 4 MiB allreduce {i}")
st = _staging.stats()
check(st.get("pieces") == 3 * 64, "64 pieces per op", f"{st}")
check(st.get("pool_allocs", 0) <= 64 + 4, "pool reused across ops", f"{st}")
finish()
'''
    env = dict(STAGED, HOROVODLIKE_STAGING_PIECE_BYTES=str(64 << 10))
    run_torch(body, 2, "horovodlikerun", timeout=120, env=env)


KILLED_DURING_STAGED_OP = textwrap.dedent("""
    import os, sys, time
    import torch
    import horovodlike.torch as hvd
    from horovodlike.torch import _staging
    hvd.init()
    r = hvd.rank()
    device = os.environ.get("STAGE_DEVICE", "cpu")
    if device == "cuda":
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    print(f"ready {r} {os.getpid()}", flush=True)
    x = torch.ones(8 << 20, device=device)     # 32 MiB in pieces
    try:
        for i in range(100000):
            h = hvd.allreduce_async(x, name=f"big.{i % 2}")
            if i == 3:
                print(f"midway {r}", flush=True)
            hvd.synchronize(h)
    except hvd.HorovodInternalError as e:
        print(f"lost {r} staged={_staging.stats().get('pieces', 0)}: {e}", flush=True)
        sys.exit(0)
""")


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
