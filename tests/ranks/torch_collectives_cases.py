"""Rank program of tests/test_torch_collectives.py, run by test_torch_collectives."""
from _torch_common import *  # noqa: F401,F403 (torch, thvd, hvd, np, the check helpers)
import gc
import zlib


def main():
    hvd.init()
    R, P = thvd.rank(), thvd.size()
    OPS = [("Sum", thvd.Sum), ("Average", thvd.Average), ("Min", thvd.Min), ("Max", thvd.Max),
           ("Product", thvd.Product)]
    SHAPES = [(), (7,), (3, 5), (0, 4)]


    def gen(key, r):
        g = torch.Generator()
        g.manual_seed(zlib.crc32(repr((key, r)).encode()))
        return g


    def rank_input(dtype, opname, shape, r, key):
        """Rank r's input for one allreduce case (every rank can recompute it)."""
        g = gen(key, r)
        if dtype == torch.bool:
            return torch.rand(shape, generator=g) < 0.5
        lo, hi = {"Sum": (0, 10), "Average": (0, 30), "Product": (1, 3), "Min": (0, 100),
                  "Max": (0, 100)}[opname]
        if dtype.is_floating_point:
            lo, hi = {"Sum": (-8, 8), "Product": (-2, 2)}.get(opname, (lo - 50, hi))
        return torch.randint(lo, hi + 1, shape, generator=g).to(dtype)


    def expected_reduce(dtype, opname, inputs):
        if dtype == torch.bool:
            stack = torch.stack(inputs)
            return (stack.any(0) if opname in ("Sum", "Max") else stack.all(0))
        stack = torch.stack([t.double() for t in inputs])
        if opname == "Sum":
            out = stack.sum(0)
        elif opname == "Product":
            out = stack.prod(0)
        elif opname == "Min":
            out = stack.min(0).values
        elif opname == "Max":
            out = stack.max(0).values
        elif dtype.is_floating_point:
            out = stack.sum(0) / P
        else:
            out = torch.div(stack.sum(0), P, rounding_mode="floor")   # data >= 0: = truncation
        return out.to(dtype)


    # ---------------------------------------------------- allreduce: every dtype x op x shape
    handles = []
    for dtype in ALL_TORCH_DTYPES:
        for opname, op in OPS:
            for shape in SHAPES:
                key = ("ar", str(dtype), opname, shape)
                x = rank_input(dtype, opname, shape, R, key)
                what = f"allreduce {dtype} {opname} {shape}"
                if dtype == torch.bool and opname == "Average":
                    check_raises(ValueError, lambda: thvd.allreduce(x, op=op, name=str(key)),
                                 "bool", what=what)
                    continue
                exp = expected_reduce(dtype, opname, [rank_input(dtype, opname, shape, r, key)
                                                      for r in range(P)])
                before = x.clone()
                handles.append((thvd.allreduce_async(x, op=op, name=str(key)), exp, x, before,
                                dtype, opname, what))
    for h, exp, x, before, dtype, opname, what in handles:
        got = thvd.synchronize(h)
        if dtype.is_floating_point and opname == "Average" and P & (P - 1):
            t_close(got, exp, what, rtol=2 * TORCH_EPS[dtype], atol=0)
        else:
            t_equal(got, exp, what)
        t_equal(x, before, what + ": input unchanged")

    # The default op is Average; average= is the deprecated spelling.
    x = torch.full((4,), float(R))
    t_close(thvd.allreduce(x), torch.full((4,), (P - 1) / 2), "default op is Average")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t_equal(thvd.allreduce(x, average=False), torch.full((4,), float(sum(range(P)))),
                "average=False is Sum")
    check_raises(ValueError, lambda: thvd.allreduce(x, average=True, op=thvd.Sum),
                 "average", what="op= and average= together")

    # ---------------------------------------------------- prescale / postscale
    for dtype in FLOAT_TORCH_DTYPES + [torch.int32, torch.int64]:
        key = ("scale", str(dtype))
        ins = [rank_input(dtype, "Sum", (6,), r, key) for r in range(P)]
        total = sum(t.double() for t in ins)
        got = thvd.allreduce(ins[R], op=thvd.Sum, prescale_factor=2.0, postscale_factor=2.0,
                             name=f"scale.{dtype}")
        t_equal(got, (total * 4).to(dtype), f"prescale/postscale Sum {dtype}")
        if dtype.is_floating_point:
            got = thvd.allreduce(ins[R], op=thvd.Average, prescale_factor=0.5,
                                 postscale_factor=3.0, name=f"scale.avg.{dtype}")
            t_close(got, (total * 1.5 / P).to(dtype), f"prescale/postscale Average {dtype}",
                    rtol=4 * TORCH_EPS[dtype], atol=4 * TORCH_EPS[dtype])

    # ---------------------------------------------------- in place, non-contiguous
    t = torch.full((3, 4), float(R + 1))
    out = thvd.allreduce_(t, op=thvd.Sum, name="inplace")
    check(out is t, "allreduce_ returns the tensor itself")
    t_equal(t, torch.full((3, 4), float(P * (P + 1) // 2)), "allreduce_ values")
    base = torch.arange(12, dtype=torch.float64).reshape(3, 4) * (R + 1)
    view = base.t()                                     # not contiguous
    out = thvd.allreduce_(view, op=thvd.Sum, name="inplace.noncontig")
    check(out is view, "allreduce_ on a view returns the view")
    t_equal(base, torch.arange(12, dtype=torch.float64).reshape(3, 4) * (P * (P + 1) // 2),
            "allreduce_ on a non-contiguous view writes back into its base")
    strided = torch.arange(20, dtype=torch.int32)[::2]
    t_equal(thvd.allreduce(strided, op=thvd.Max, name="strided"),
            torch.arange(0, 20, 2, dtype=torch.int32), "allreduce of a strided tensor")
    h = thvd.allreduce_async_(view, op=thvd.Min, name="inplace.async")
    check(thvd.synchronize(h) is view, "synchronize(allreduce_async_) returns the tensor")

    # ---------------------------------------------------- async: poll, lifetime, handles
    if P > 1:
        if R != 0:
            wait_for("rank0-polled")                     # rank 0 must see poll() False
        h = thvd.allreduce_async(torch.ones(5), op=thvd.Sum, name="slow")
        if R == 0:
            check(not thvd.poll(h), "poll() is False while the other ranks have not submitted")
            arrive("rank0-polled")
        deadline = time.time() + 30
        while not thvd.poll(h) and time.time() < deadline:
            time.sleep(0.01)
        check(thvd.poll(h), "poll() becomes True")
        t_equal(thvd.synchronize(h), torch.full((5,), float(P)), "allreduce after poll")
    # The engine keeps the input alive: no reference is held here.
    hs = [thvd.allreduce_async(torch.full((1000,), float(R + i)), op=thvd.Sum,
                               name=f"alive.{i}") for i in range(4)]
    gc.collect()
    junk = [torch.full((1000,), -1.0) for _ in range(50)]
    for i, h in enumerate(hs):
        t_equal(thvd.synchronize(h), torch.full((1000,), float(sum(range(P)) + P * i)),
                f"input kept alive {i}")
    check_raises(ValueError, lambda: thvd.synchronize(hs[0]), "handle",
                 what="synchronize twice")

    # ---------------------------------------------------- grouped allreduce
    group = [torch.full((3,), float(R)), torch.full((2, 2), R + 1, dtype=torch.int64),
             torch.full((1,), float(R), dtype=torch.float16)]
    outs = thvd.grouped_allreduce(group, op=thvd.Sum, name="grp")
    check(isinstance(outs, list) and len(outs) == 3, "grouped_allreduce returns a list")
    s = sum(range(P))
    t_equal(outs[0], torch.full((3,), float(s)), "grouped_allreduce[0]")
    t_equal(outs[1], torch.full((2, 2), s + P, dtype=torch.int64), "grouped_allreduce[1]")
    t_equal(outs[2], torch.full((1,), float(s), dtype=torch.float16), "grouped_allreduce[2]")
    outs = thvd.synchronize(thvd.grouped_allreduce_async(group, op=thvd.Max))
    t_equal(outs[0], torch.full((3,), float(P - 1)), "grouped_allreduce_async")
    thvd.grouped_allreduce_(group, op=thvd.Sum, name="grp_")
    t_equal(group[1], torch.full((2, 2), s + P, dtype=torch.int64), "grouped_allreduce_ in place")
    h = thvd.grouped_allreduce_async_(group, op=thvd.Min, name="grp_async_")
    deadline = time.time() + 30
    while not thvd.poll(h) and time.time() < deadline:
        time.sleep(0.01)
    res = thvd.synchronize(h)
    check(res[0] is group[0], "grouped_allreduce_async_ returns the tensors themselves")
    t_close(thvd.grouped_allreduce([torch.full((2,), float(R))])[0],
            torch.full((2,), (P - 1) / 2), "grouped_allreduce default Average")

    # ---------------------------------------------------- allgather
    for dtype in ALL_TORCH_DTYPES:
        for tail in [(), (3,), (2, 2)]:
            def mk(r):
                rows = r + 1 if tail != (2, 2) else r         # rank 0 sends 0 rows once
                g = gen(("ag", str(dtype), tail), r)
                if dtype == torch.bool:
                    return torch.rand((rows,) + tail, generator=g) < 0.5
                return torch.randint(0, 100, (rows,) + tail, generator=g).to(dtype)
            exp = torch.cat([mk(r) for r in range(P)])
            t_equal(thvd.allgather(mk(R), name=f"ag.{dtype}.{tail}"), exp,
                    f"allgather {dtype} {tail}")
            t_equal(thvd.synchronize(thvd.allgather_async(mk(R))), exp,
                    f"allgather_async {dtype} {tail}")
    gx = [torch.full((R + 1, 2), float(R)), torch.full((1,), R, dtype=torch.int16)]
    outs = thvd.grouped_allgather(gx, name="gag")
    t_equal(outs[0], torch.cat([torch.full((r + 1, 2), float(r)) for r in range(P)]),
            "grouped_allgather[0]")
    t_equal(outs[1], torch.arange(P, dtype=torch.int16), "grouped_allgather[1]")
    outs = thvd.synchronize(thvd.grouped_allgather_async(gx))
    t_equal(outs[1], torch.arange(P, dtype=torch.int16), "grouped_allgather_async")
    t_equal(thvd.allgather(torch.arange(6).reshape(2, 3).t()),
            torch.cat([torch.arange(6).reshape(2, 3).t()] * P), "allgather non-contiguous")

    # ---------------------------------------------------- broadcast
    for root in range(P):
        for dtype in ALL_TORCH_DTYPES:
            def mk(r):
                g = gen(("bc", str(dtype), root), r)
                if dtype == torch.bool:
                    return torch.rand((3, 4), generator=g) < 0.5
                return torch.randint(0, 100, (3, 4), generator=g).to(dtype)
            x, exp = mk(R), mk(root)
            before = x.clone()
            t_equal(thvd.broadcast(x, root, name=f"bc.{dtype}.{root}"), exp,
                    f"broadcast {dtype} root {root}")
            t_equal(x, before, f"broadcast {dtype}: input unchanged")
            out = thvd.broadcast_(x, root_rank=root, name=f"bc_.{dtype}.{root}")
            check(out is x, "broadcast_ returns the tensor")
            t_equal(x, exp, f"broadcast_ {dtype} root {root}")
        y = (torch.arange(12.0).reshape(3, 4) + R).t()
        t_equal(thvd.synchronize(thvd.broadcast_async(y, root)),
                (torch.arange(12.0).reshape(3, 4) + root).t().contiguous(), "broadcast_async")
        h = thvd.broadcast_async_(y, root, name=f"bca_.{root}")
        check(thvd.synchronize(h) is y, "broadcast_async_ returns the tensor")
        t_equal(y, (torch.arange(12.0).reshape(3, 4) + root).t(), "broadcast_async_ non-contig")
        thvd.barrier()

    # ---------------------------------------------------- autograd
    x = torch.full((3,), float(R + 1), requires_grad=True)
    for opname, op, pre, post, grad in [("Sum", thvd.Sum, 1.0, 1.0, 2.0 * P),
                                        ("Average", thvd.Average, 1.0, 1.0, 2.0),
                                        ("Sum scaled", thvd.Sum, 3.0, 0.5, 2.0 * P * 1.5)]:
        x.grad = None
        y = thvd.allreduce(x * 2, op=op, prescale_factor=pre, postscale_factor=post)
        check(y.requires_grad, f"allreduce {opname} output requires grad")
        y.sum().backward()
        t_close(x.grad, torch.full((3,), grad), f"allreduce {opname} backward")
    a = torch.full((2,), float(R), requires_grad=True)
    b = torch.full((3,), float(R), dtype=torch.float64, requires_grad=True)
    ya, yb = thvd.grouped_allreduce([a * 3, b], op=thvd.Sum)
    (ya.sum() + 2 * yb.sum()).backward()
    t_equal(a.grad, torch.full((2,), 3.0 * P), "grouped_allreduce backward [0]")
    t_equal(b.grad, torch.full((3,), 2.0 * P, dtype=torch.float64), "grouped_allreduce backward [1]")

    rows = [r + 1 for r in range(P)]
    offset = sum(rows[:R])
    x = torch.full((R + 1, 2), float(R), requires_grad=True)
    g = thvd.allgather(x)
    w = torch.arange(float(2 * sum(rows))).reshape(-1, 2)
    (g * w).sum().backward()
    t_equal(x.grad, w[offset:offset + R + 1], "allgather backward: this rank's rows")
    x1 = torch.full((R + 1,), float(R), requires_grad=True)
    x2 = torch.full((1, 3), float(R), requires_grad=True)
    g1, g2 = thvd.grouped_allgather([x1, x2])
    w1 = torch.arange(float(sum(rows)))
    (g1 * w1).sum().backward(retain_graph=True)
    (g2 * 2).sum().backward()
    t_equal(x1.grad, w1[offset:offset + R + 1], "grouped_allgather backward [0]")
    t_equal(x2.grad, torch.full((1, 3), 2.0), "grouped_allgather backward [1]")

    for root in range(P):
        x = torch.full((4,), float(R), requires_grad=True)
        y = thvd.broadcast(x, root)
        t_equal(y.detach(), torch.full((4,), float(root)), "differentiable broadcast value")
        (y * (R + 1)).sum().backward()
        exp = torch.full((4,), (P + 1) / 2) if R == root else torch.zeros(4)
        t_close(x.grad, exp, f"broadcast backward root {root}")

    x = torch.linspace(-1, 1, 9, requires_grad=True)
    y = thvd.allreduce(x * (R + 1), op=thvd.Sum, compression=thvd.Compression.fp16)
    check(y.dtype == torch.float32, "fp16 compression gives float32 back")
    t_close(y.detach(), torch.linspace(-1, 1, 9) * (P * (P + 1) / 2), "allreduce fp16",
            rtol=2e-3, atol=2e-3)
    y.sum().backward()
    t_close(x.grad, torch.full((9,), float(P * (R + 1))), "allreduce fp16 backward", rtol=2e-3)

    finish()


if __name__ == "__main__":
    main()
