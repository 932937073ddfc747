"""Rank program of tests/test_torch_gpu.py, run by
test_cuda_tensors_at_two_ranks_sharing_one_gpu[collectives]: every collective and dtype on
CUDA tensors against the same op on CPU tensors, bit for bit."""
from torch_gpu_common import *  # noqa: F401,F403 (init, same, data, torch, thvd, hvd)
from horovodlike.torch import _staging


def main():
    R, P, DEV = init()
    OPS = [thvd.Sum, thvd.Average, thvd.Min, thvd.Max, thvd.Product]
    for dtype in ALL_TORCH_DTYPES:
        for op in OPS:
            if dtype == torch.bool and op == thvd.Average:
                continue
            for shape in [(), (5,), (3, 4), (0, 2), (600, 1000)]:   # the last: pieces (>= 4 bytes)
                x = data(dtype, shape, ("ar", str(dtype), op, shape))
                what = f"allreduce {dtype} op={op} {shape}"
                same(thvd.allreduce(x, op=op, name=what + "c"),
                     thvd.allreduce(x.to(DEV), op=op, name=what + "g"), what)
        x = data(dtype, (6, 3), ("misc", str(dtype)))
        xs = [data(dtype, (i + 1, 2), ("grp", str(dtype), i)) for i in range(4)]
        # in place, async, non-contiguous
        g = x.to(DEV).t()
        h = thvd.allreduce_async_(g, op=thvd.Max, name=f"ip {dtype}")
        while not thvd.poll(h):
            pass
        same(thvd.allreduce(x.t(), op=thvd.Max, name=f"ipc {dtype}"), thvd.synchronize(h),
             f"allreduce_ non-contiguous {dtype}")
        # grouped (one fused staged op), in place and not
        same(thvd.grouped_allreduce(xs, op=thvd.Sum, name=f"gc {dtype}"),
             thvd.grouped_allreduce([t.to(DEV) for t in xs], op=thvd.Sum, name=f"gg {dtype}"),
             f"grouped_allreduce {dtype}")
        gs = [t.to(DEV) for t in xs]
        thvd.grouped_allreduce_(gs, op=thvd.Max, name=f"gig {dtype}")
        same(thvd.grouped_allreduce(xs, op=thvd.Max, name=f"gic {dtype}"), gs,
             f"grouped_allreduce_ {dtype}")
        # allgather with a different first dimension per rank, grouped allgather
        y = data(dtype, (R + 1, 3), ("ag", str(dtype)))
        same(thvd.allgather(y, name=f"agc {dtype}"),
             thvd.allgather(y.to(DEV), name=f"agg {dtype}"), f"allgather {dtype}")
        same(thvd.grouped_allgather(xs, name=f"gagc {dtype}"),
             thvd.grouped_allgather([t.to(DEV) for t in xs], name=f"gagg {dtype}"),
             f"grouped_allgather {dtype}")
        # broadcast from every root, in place
        for root in range(P):
            same(thvd.broadcast(x, root, name=f"bc {dtype} {root}"),
                 thvd.broadcast(x.to(DEV), root, name=f"bg {dtype} {root}"),
                 f"broadcast {dtype} root {root}")
            b = x.to(DEV)
            thvd.broadcast_(b, root, name=f"big {dtype} {root}")
            same(thvd.broadcast(x, root, name=f"bic {dtype} {root}"), b,
                 f"broadcast_ {dtype} root {root}")
        # alltoall with uneven splits
        splits = [(R + j) % 3 + 1 for j in range(P)]
        a = data(dtype, (sum(splits), 2), ("a2a", str(dtype)))
        co, cs = thvd.alltoall(a, splits=splits, name=f"a2ac {dtype}")
        go, gs_ = thvd.alltoall(a.to(DEV), splits=splits, name=f"a2ag {dtype}")
        same(co, go, f"alltoall {dtype}")
        same(cs, gs_, f"alltoall {dtype} splits")
        # reducescatter (Sum and Average are its ops), grouped
        if dtype != torch.bool:
            r = data(dtype, (5, 2), ("rs", str(dtype)))
            for op in (thvd.Sum, thvd.Average):
                same(thvd.reducescatter(r, op=op, name=f"rsc {dtype} {op}"),
                     thvd.reducescatter(r.to(DEV), op=op, name=f"rsg {dtype} {op}"),
                     f"reducescatter {dtype} op={op}")
            same(thvd.grouped_reducescatter(xs, op=thvd.Sum, name=f"grsc {dtype}"),
                 thvd.grouped_reducescatter([t.to(DEV) for t in xs], op=thvd.Sum,
                                            name=f"grsg {dtype}"),
                 f"grouped_reducescatter {dtype}")

    # autograd through allreduce and allgather on the GPU
    x = torch.linspace(-1, 1, 9, device=DEV, requires_grad=True)
    y = thvd.allreduce(x * (R + 1), op=thvd.Sum)
    y.sum().backward()
    check(x.grad.device.type == "cuda", "allreduce backward on the GPU")
    t_equal(x.grad.cpu(), torch.full((9,), float(P * (R + 1))), "allreduce backward")

    st = _staging.stats()
    check(st.get("ops", 0) > 500 and st.get("pieces", 0) > st.get("ops", 0),
          "staged in pieces", f"{st}")
    check(st.get("fused_groups", 0) > 0, "grouped ops fused", f"{st}")
    finish()


if __name__ == "__main__":
    main()
