"""Rank program of tests/test_torch_alltoall_reducescatter.py, run by
test_torch_alltoall_and_reducescatter."""
from _torch_common import *  # noqa: F401,F403 (torch, thvd, hvd, np, the check helpers)


def main():
    hvd.init()
    R, P = thvd.rank(), thvd.size()


    def nrows(src, dst):
        """Rows rank src sends to rank dst (0 happens)."""
        return (src + dst) % 3


    def block(src, dst, dtype, width=2):
        n = nrows(src, dst)
        v = (torch.arange(n * width).reshape(n, width) + 7 * src + 3 * dst) % 50
        return (v % 2 == 1) if dtype == torch.bool else v.to(dtype)


    # ---------------------------------------------------- alltoall with splits
    for dtype in ALL_TORCH_DTYPES:
        x = torch.cat([block(R, j, dtype) for j in range(P)])
        splits = [nrows(R, j) for j in range(P)]
        exp = torch.cat([block(j, R, dtype) for j in range(P)])
        exp_splits = torch.tensor([nrows(j, R) for j in range(P)], dtype=torch.int32)
        out, rsplits = thvd.alltoall(x, splits=splits, name=f"a2a.{dtype}")
        t_equal(out, exp, f"alltoall {dtype}")
        t_equal(rsplits, exp_splits, f"alltoall {dtype}: received splits")
        out, rsplits = thvd.alltoall(x, splits=torch.tensor(splits, dtype=torch.int32))
        t_equal(out, exp, f"alltoall {dtype}, splits as a tensor")
        res = thvd.synchronize(thvd.alltoall_async(x, splits=splits))
        check(isinstance(res, tuple) and len(res) == 2, "alltoall_async gives (output, splits)")
        t_equal(res[0], exp, f"alltoall_async {dtype}")

    # ---------------------------------------------------- alltoall without splits (even)
    x = torch.arange(P * (R + 1) * 3, dtype=torch.float32).reshape(P * (R + 1), 3) + 1000 * R
    out = thvd.alltoall(x, name="a2a.even")
    check(isinstance(out, torch.Tensor), "alltoall without splits returns only the output")
    exp = torch.cat([(torch.arange(P * (j + 1) * 3, dtype=torch.float32).reshape(P * (j + 1), 3)
                      + 1000 * j)[R * (j + 1):(R + 1) * (j + 1)] for j in range(P)])
    t_equal(out, exp, "alltoall even split")
    out, rs = thvd.synchronize(thvd.alltoall_async(x))
    t_equal(rs, torch.tensor([j + 1 for j in range(P)], dtype=torch.int32),
            "alltoall_async even split: received splits")
    t_equal(thvd.alltoall(x.t().contiguous().t(), name="a2a.noncontig"), exp,
            "alltoall of a non-contiguous tensor")
    if P > 1:
        check_raises(ValueError, lambda: thvd.alltoall(torch.ones(P + 1)), "evenly",
                     what="alltoall uneven rows without splits")
    check_raises(ValueError, lambda: thvd.alltoall(torch.ones(3), splits=[1] * (P + 1)), "split",
                 what="alltoall too many splits")
    check_raises(ValueError, lambda: thvd.alltoall(torch.ones(3), splits=[3 + P] + [0] * (P - 1)),
                 "add up", what="alltoall splits not adding up")
    check_raises(ValueError, lambda: thvd.alltoall(torch.ones(3), splits=[-1] + [0] * (P - 2) + [4]
                                                   if P > 1 else [-1]),
                 what="alltoall negative split")
    check_raises(ValueError, lambda: thvd.alltoall(torch.ones(P), splits=[1.0] * P), "integer",
                 what="alltoall float splits")
    check_raises(ValueError, lambda: thvd.alltoall(torch.tensor(1.0)), "dimension",
                 what="alltoall of a scalar")

    # alltoall autograd: the gradient goes back to where each row came from.
    x = torch.cat([block(R, j, torch.float64) for j in range(P)]).requires_grad_()
    out, rs = thvd.alltoall(x, splits=[nrows(R, j) for j in range(P)])
    (out * out.detach()).sum().backward()
    t_equal(x.grad, x.detach(), "alltoall backward returns each row's gradient to its sender")
    x = torch.arange(float(2 * P)).requires_grad_()
    y = thvd.alltoall(x)
    (y * 3).sum().backward()
    t_equal(x.grad, torch.full((2 * P,), 3.0), "alltoall (no splits) backward")

    # ---------------------------------------------------- reducescatter
    ROWS = 2 * P + 1


    def share(i, rows=ROWS):
        n = rows // P + (1 if i < rows % P else 0)
        start = sum(rows // P + (1 if j < rows % P else 0) for j in range(i))
        return start, n


    def rs_input(r, dtype, rows=ROWS):
        v = (torch.arange(rows).reshape(rows, 1) + 1) * (r + 1) * torch.ones(1, 3)
        return v.to(dtype)


    start, n = share(R)
    for dtype in [d for d in ALL_TORCH_DTYPES if d != torch.bool]:
        total = sum(rs_input(r, torch.float64) for r in range(P))
        got = thvd.reducescatter(rs_input(R, dtype), op=thvd.Sum, name=f"rs.{dtype}")
        t_equal(got, total[start:start + n].to(dtype), f"reducescatter Sum {dtype}")
        got = thvd.reducescatter(rs_input(R, dtype), name=f"rs.avg.{dtype}")
        if dtype.is_floating_point:
            t_close(got, (total[start:start + n] / P).to(dtype), f"reducescatter Average {dtype}",
                    rtol=2 * TORCH_EPS[dtype], atol=0)
        else:
            t_equal(got, torch.div(total[start:start + n], P, rounding_mode="floor").to(dtype),
                    f"reducescatter Average {dtype}")
        got = thvd.synchronize(thvd.reducescatter_async(rs_input(R, dtype), op=thvd.Sum))
        t_equal(got, total[start:start + n].to(dtype), f"reducescatter_async {dtype}")
    total = sum(rs_input(r, torch.float32) for r in range(P))
    got = thvd.reducescatter(rs_input(R, torch.float32), op=thvd.Sum, prescale_factor=2.0,
                             postscale_factor=0.25)
    t_equal(got, total[start:start + n] / 2, "reducescatter with prescale/postscale")
    few = thvd.reducescatter(torch.ones(1, 2), op=thvd.Sum, name="rs.fewer_rows_than_ranks")
    t_equal(few, torch.full((1 if R == 0 else 0, 2), float(P)),
            "reducescatter with fewer rows than ranks")
    outs = thvd.grouped_reducescatter([rs_input(R, torch.float32), rs_input(R, torch.int64, 4)],
                                      op=thvd.Sum, name="grs")
    t_equal(outs[0], total[start:start + n], "grouped_reducescatter[0]")
    s4, n4 = share(R, 4)
    t_equal(outs[1], sum(rs_input(r, torch.int64, 4) for r in range(P))[s4:s4 + n4],
            "grouped_reducescatter[1]")
    outs = thvd.synchronize(thvd.grouped_reducescatter_async([rs_input(R, torch.float64)],
                                                             op=thvd.Sum))
    t_equal(outs[0], sum(rs_input(r, torch.float64) for r in range(P))[start:start + n],
            "grouped_reducescatter_async")
    t_equal(thvd.reducescatter(rs_input(R, torch.float32).t().contiguous().t(), op=thvd.Sum),
            total[start:start + n], "reducescatter of a non-contiguous tensor")
    check_raises(ValueError, lambda: thvd.reducescatter(torch.ones(4), op=thvd.Max), "Sum",
                 what="reducescatter Max")
    check_raises(ValueError, lambda: thvd.reducescatter(torch.tensor(1.0)), "dimension",
                 what="reducescatter of a scalar")

    # reducescatter autograd (Horovod: allgather of the gradient, times the set size for Sum)
    owner = torch.cat([torch.full((share(i)[1],), float(i)) for i in range(P)])
    for opname, op, factor in [("Sum", thvd.Sum, P), ("Average", thvd.Average, 1)]:
        x = rs_input(R, torch.float64).requires_grad_()
        y = thvd.reducescatter(x, op=op)
        (y * (R + 1)).sum().backward()
        exp = ((owner + 1) * factor).reshape(-1, 1).expand(ROWS, 3).double()
        t_equal(x.grad, exp, f"reducescatter {opname} backward")
    a = rs_input(R, torch.float32).requires_grad_()
    ya, = thvd.grouped_reducescatter([a], op=thvd.Sum, prescale_factor=2.0)
    ya.sum().backward()
    t_equal(a.grad, torch.full((ROWS, 3), 2.0 * P), "grouped_reducescatter backward")

    finish()


if __name__ == "__main__":
    main()
