"""Rank program of tests/test_torch_powersgd.py, run by
test_powersgd_algorithm_on_real_ranks."""
from torch_powersgd_common import *  # noqa: F401,F403 (init, the shared helpers, torch, thvd, hvd, np)


def main():
    R, P = init()
    # ------------------------------------------------ exact reconstruction at full rank
    # r = min(n, m): P spans the averaged gradient's columns, so P Qᵀ is the exact average.
    model = Params(SHAPES)
    psgd = thvd.PowerSGD(rank=16, start_iter=0, min_compression_rate=0)
    opt = make_opt(model, psgd)
    for step in range(3):
        opt.zero_grad()
        model.backward_with([grad_of(s, step, R) for s in SHAPES])
        opt.synchronize()
        for p, exp, s in zip(model.ps, average(step), SHAPES):
            t_close(p.grad, exp, f"full-rank PowerSGD step {step} shape {s}", rtol=1e-9,
                    atol=1e-11)
            same_on_every_rank(p.grad, f"full-rank PowerSGD step {step} shape {s} identical")
        check(sorted(psgd.qs) == ["ps.0", "ps.1", "ps.3"], "matrices compressed",
              str(sorted(psgd.qs)))
    rate, before, after = psgd.compression_stats()
    check(before == 3 * sum(int(np.prod(s)) for s in SHAPES) and after > 0, "stats",
          str((rate, before, after)))

    # ------------------------------------------------ error feedback carries the residual
    model = Params(SHAPES)
    psgd = thvd.PowerSGD(rank=1, start_iter=0, min_compression_rate=0)
    opt = make_opt(model, psgd)
    prev = {}
    for step in range(3):
        opt.zero_grad()
        mine = [grad_of(s, step, R) for s in SHAPES]
        model.backward_with(mine)
        opt.synchronize()
        for i, (p, g, s) in enumerate(zip(model.ps, mine, SHAPES)):
            name = f"ps.{i}"
            if len(s) == 1:
                t_close(p.grad, average(step)[i], f"vector step {step} uncompressed", 1e-12, 1e-14)
                check(name not in psgd.errors, "no error buffer for a vector")
                continue
            m = g.reshape(s[0], -1) + prev.get(name, torch.zeros(()))   # M = G + E_prev
            err = psgd.errors[name]
            # The buffer is M - M̂ (M̂ is the rank-1 approximation now in p.grad) ...
            t_close(err, m - p.grad.reshape(s[0], -1), f"E = M - M̂ step {step} {s}", 1e-12, 1e-12)
            check(torch.linalg.matrix_rank(p.grad.reshape(s[0], -1)).item() == 1,
                  f"M̂ has rank 1 step {step} {s}")
            # ... and M̂ plus the average of the residuals is the average of the M's.
            avg_err = thvd.allreduce(err, name=f"err.{step}.{i}")
            avg_m = thvd.allreduce(m, name=f"m.{step}.{i}")
            t_close(p.grad.reshape(s[0], -1) + avg_err, avg_m, f"avg(M) = M̂ + avg(E) {step}",
                    1e-9, 1e-11)
            prev[name] = err.clone()

    # ------------------------------------------------ warm-up equals the uncompressed run
    ref, comp = mlp(1), mlp(1)
    opt_ref = thvd.DistributedOptimizer(torch.optim.SGD(ref.parameters(), lr=0.1),
                                        named_parameters=ref.named_parameters())
    opt_c = make_opt(comp, thvd.PowerSGD(rank=1, start_iter=3))
    for step in range(4):
        mlp_step(ref, opt_ref, step)
        mlp_step(comp, opt_c, step)
        same = all(torch.equal(a, b) for a, b in zip(ref.parameters(), comp.parameters()))
        check(same == (step < 3), f"warm-up step {step}: equal to uncompressed is {same}")

    # ------------------------------------------------ ranks stay bit-identical
    for kw in ({}, {"backward_passes_per_step": 2}):
        model = mlp(2)
        psgd = thvd.PowerSGD(rank=2, start_iter=1)
        opt = make_opt(model, psgd, **kw)
        for step in range(6):
            if kw:
                opt.zero_grad()
                for half in range(2):
                    x, y = mlp_batch(step * 2 + half, R)
                    F.cross_entropy(model(x), y).backward()
                opt.step()
            else:
                mlp_step(model, opt, step)
            same_on_every_rank(flat_params(model), f"params identical step {step} {kw}")
        check(psgd.iter == 6 and psgd.errors, f"compressed 5 steps {kw}", str(psgd.iter))

    # backward_passes_per_step accumulates locally: at full rank, equal to the average of
    # the summed passes.
    model = Params(SHAPES)
    opt = make_opt(model, thvd.PowerSGD(rank=16, start_iter=0, min_compression_rate=0),
                   backward_passes_per_step=2)
    opt.zero_grad()
    model.backward_with([grad_of(s, 0, R) for s in SHAPES])
    model.backward_with([grad_of(s, 1, R) for s in SHAPES])
    opt.synchronize()
    for p, a, b, s in zip(model.ps, average(0), average(1), SHAPES):
        t_close(p.grad, a + b, f"backward_passes_per_step=2 {s}", 1e-9, 1e-11)

    # ------------------------------------------------ process sets
    if P >= 3:
        members = [0, P - 1]
        ps_ = thvd.add_process_set(members)
        model = Params(SHAPES)
        opt = make_opt(model, thvd.PowerSGD(rank=16, start_iter=0, min_compression_rate=0),
                       process_set=ps_)
        opt.zero_grad()
        model.backward_with([grad_of(s, 0, R) for s in SHAPES])
        opt.synchronize()
        for p, exp, s in zip(model.ps, average(0, ranks=members), SHAPES):
            if R in members:
                t_close(p.grad, exp, f"process set {s}", 1e-9, 1e-11)
            else:
                t_equal(p.grad, grad_of(s, 0, R), f"outside the set {s} untouched")
        thvd.remove_process_set(ps_)
    finish()


if __name__ == "__main__":
    main()
