"""Rank program of tests/test_torch_sharded.py, run by
test_collectives_write_into_the_optimizers_buffers."""
from _torch_common import *  # noqa: F401,F403 (torch, thvd, hvd, np, the check helpers)


def main():
    # The step's two collectives write into the optimizer's own buffers: the all-gather into
    # the flat parameters (its own chunk is already there; the engine returns no buffer of its
    # own) and the reduce-scatter into the gradient shard.
    from horovodlike.common import ops as _ops, request
    from horovodlike.torch import _tensors
    from horovodlike.torch.sharded import gradients as sharded
    thvd.init()
    R, P = thvd.rank(), thvd.size()
    n = 6
    full = torch.full((n * P,), -1.0)
    full[R * n:(R + 1) * n] = torch.arange(n, dtype=torch.float32) + 10 * R
    own = full[R * n:(R + 1) * n]
    req = request.allgather("inplace.ag", None, 1)
    res = _ops.synchronize(_ops.submit((own, full), lambda r: r, **req.fields(
        _tensors.check_tensor(own, "t"), own.shape, own.data_ptr(), full.data_ptr())))
    check(res.data is None and res.nbytes == full.numel() * 4, "allgather wrote the caller's "
          "output", f"data={res.data} nbytes={res.nbytes}")
    want = torch.cat([torch.arange(n, dtype=torch.float32) + 10 * q for q in range(P)])
    check(torch.equal(full, want), "allgather into the caller's output", str(full.tolist()))
    out = sharded._allgather_into(own.clone(), torch.empty(n * P), "inplace.ag2", None)
    check(torch.equal(_ops.synchronize(out), want), "_allgather_into", "")
    x = torch.arange(2 * P * 3, dtype=torch.float32) * (R + 1)
    shard = torch.full((2 * 3,), -1.0)
    got = _ops.synchronize(sharded._reducescatter_into(x, shard, "inplace.rs", thvd.Sum, None))
    tri = P * (P + 1) / 2
    check(got is shard and torch.equal(shard, torch.arange(R * 6, R * 6 + 6,
          dtype=torch.float32) * tri), "reducescatter into the caller's output",
          str(shard.tolist()))
    finish()


if __name__ == "__main__":
    main()
