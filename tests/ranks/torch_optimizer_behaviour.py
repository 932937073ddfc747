"""Rank program of tests/test_torch_optimizer.py, run by
test_distributed_optimizer_behaviour_and_helpers."""
from torch_optimizer_common import *  # noqa: F401,F403 (init, the shared helpers, torch, thvd, hvd, np)


def main():
    R, P = init()
    def reference(steps, lr, op="avg", passes=1, clip=None, use_closure=False):
        """The job replayed on one rank: SGD on the gradient averaged (or summed) over every
        rank's data."""
        model = make_model(5)
        params = list(model.parameters())
        for step in range(steps):
            grads = [torch.zeros_like(p) for p in params]
            for r in range(P):
                for k in range(passes):
                    model.zero_grad()
                    loss_of(model, step * passes + k, r).backward()
                    for g, p in zip(grads, params):
                        g += p.grad
            with torch.no_grad():
                for g in grads:
                    g /= (P if op == "avg" else 1)
                if clip is not None:
                    norm = torch.sqrt(sum((g ** 2).sum() for g in grads))
                    for g in grads:
                        g *= min(1.0, clip / (float(norm) + 1e-6))
                for g, p in zip(grads, params):
                    p -= lr * g
        return flat_params(model)


    def train(steps=3, lr=0.1, passes=1, **kw):
        model = make_model(5 if R == 0 else 50 + R)
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        thvd.broadcast_parameters(list(model.named_parameters()), root_rank=0)
        opt = thvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                        backward_passes_per_step=passes, **kw)
        for step in range(steps):
            opt.zero_grad()
            for k in range(passes):
                loss_of(model, step * passes + k, R).backward()
            opt.step()
        return flat_params(model), model, opt


    ref = reference(3, 0.1)
    for label, kw, tol in [
            ("default", {}, 1e-6),
            ("gradient_predivide_factor=2", {"gradient_predivide_factor": 2.0}, 1e-6),
            ("groups=2", {"groups": 2}, 1e-6),
            ("fp16 compression", {"compression": thvd.Compression.fp16}, 2e-3)]:
        got, _, _ = train(**kw)
        t_close(got, ref, f"{label}: matches single-process SGD on the averaged gradient",
                rtol=tol, atol=tol)
        same_on_every_rank(got, f"{label}: identical on every rank")

    model = make_model(5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got, _, _ = train(num_groups=2)
    check(any(issubclass(w.category, DeprecationWarning) for w in caught),
          "num_groups= gives a DeprecationWarning")
    t_close(got, ref, "num_groups=2", rtol=1e-6, atol=1e-6)
    m = make_model(5)
    got, _, _ = train(groups=None)
    m2 = make_model(5 if R == 0 else 50 + R)
    opt2 = thvd.DistributedOptimizer(torch.optim.SGD(m2.parameters(), lr=0.1),
                                     named_parameters=m2.named_parameters(),
                                     groups=[[m2[0].weight, m2[2].weight], [m2[0].bias]])
    thvd.broadcast_parameters(m2.state_dict(), root_rank=0)
    for step in range(3):
        opt2.zero_grad()
        loss_of(m2, step, R).backward()
        opt2.step()
    t_close(flat_params(m2), ref, "groups as lists of parameters", rtol=1e-6, atol=1e-6)

    got, _, _ = train(op=thvd.Sum)
    t_close(got, reference(3, 0.1, op="sum"), "op=Sum sums the gradients", rtol=1e-6, atol=1e-6)
    got, _, _ = train(passes=2)
    t_close(got, reference(3, 0.1, passes=2), "backward_passes_per_step=2 accumulates",
            rtol=1e-6, atol=1e-6)

    # step(closure): gradients computed inside the closure are averaged before use.
    model = make_model(5 if R == 0 else 50 + R)
    opt = thvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                    named_parameters=model.named_parameters())
    thvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for step in range(3):
        def closure():
            opt.zero_grad()
            loss = loss_of(model, step, R)
            loss.backward()
            return loss
        opt.step(closure)
    t_close(flat_params(model), ref, "step(closure)", rtol=1e-6, atol=1e-6)

    # synchronize() + clipping + skip_synchronize(): no warning, averaged then clipped.
    model = make_model(5 if R == 0 else 50 + R)
    opt = thvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                    named_parameters=model.named_parameters())
    thvd.broadcast_parameters(model.state_dict(), root_rank=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(3):
            opt.zero_grad()
            loss_of(model, step, R).backward()
            opt.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
            with opt.skip_synchronize():
                opt.step()
    check(not [w for w in caught if "skip_synchronize" in str(w.message)],
          "no warning with skip_synchronize()")
    t_close(flat_params(model), reference(3, 0.1, clip=0.05), "clip between synchronize and step",
            rtol=1e-5, atol=1e-6)
    opt.zero_grad()
    loss_of(model, 0, R).backward()
    opt.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.step()
    check(any("skip_synchronize" in str(w.message) for w in caught),
          "step() after synchronize() without skip_synchronize() warns")

    # A parameter that gets no gradient on some ranks: they take part with zeros.
    model = make_model(5)
    opt = thvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                    named_parameters=model.named_parameters())
    opt.zero_grad()
    x, y = batch(0, R)
    out = model[0](x).sum() if R % 2 else model(x).sum()      # odd ranks skip layer 2
    out.backward()
    opt.step()
    same_on_every_rank(flat_params(model), "unused parameter on some ranks")

    # zero_grad() while allreduces are in flight, and too many backward passes.
    if P > 1:
        model = make_model(5)
        opt = thvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                        named_parameters=model.named_parameters())
        loss_of(model, 0, R).backward()
        check_raises(AssertionError, opt.zero_grad, "zero_grad", what="zero_grad in flight")
        check_raises(AssertionError, lambda: loss_of(model, 1, R).backward(),
                     "backward_passes_per_step", what="second backward before step()")
        opt.synchronize()
        opt.zero_grad()
        opt.load_state_dict(opt.state_dict())

    # Wrong named_parameters, Adasum, predivide with Sum, double wrapping.
    model = make_model(5)
    w0, b0 = model[0].weight, model[0].bias
    for what, kw, exc, needle in [
            ("duplicate names", {"named_parameters": [("a", p) for p in model.parameters()]},
             ValueError, "unique"),
            ("a parameter not named", {"named_parameters": [("w", w0), ("b", b0)]},
             ValueError, "not named"),
            ("not tuples", {"named_parameters": list(model.parameters())}, ValueError, "tuples"),
            ("Adasum", {"op": thvd.Adasum}, NotImplementedError, "Adasum"),
            ("predivide with Sum", {"op": thvd.Sum, "gradient_predivide_factor": 2.0},
             ValueError, "gradient_predivide_factor"),
            ("backward_passes_per_step=0", {"backward_passes_per_step": 0}, ValueError,
             "backward_passes_per_step")]:
        check_raises(exc, lambda: thvd.DistributedOptimizer(torch.optim.SGD(model.parameters(),
                                                                            lr=0.1), **kw),
                     needle, what=f"DistributedOptimizer: {what}")
    dopt = thvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    check_raises(ValueError, lambda: thvd.DistributedOptimizer(dopt), "already",
                 what="wrapping twice")
    check(type(dopt).__name__ == "SGD" and isinstance(dopt, torch.optim.SGD),
          "the wrapper's class is named and typed like the optimizer's")
    m = make_model(5)
    base = torch.optim.Adam(m.parameters(), lr=0.01)
    loss_of(m, 0, R).backward()
    base.step()
    wrapped = thvd.DistributedOptimizer(base, named_parameters=m.named_parameters())
    check(float(wrapped.state[m[0].weight]["step"]) == 1.0,
          "state the optimizer had before wrapping is kept")
    wrapped.zero_grad()

    # ---------------------------------------------------- broadcast_optimizer_state details
    for root in sorted({0, P - 1}):
        model = make_model(5)
        opt = torch.optim.Adam(model.parameters(), lr=0.01 * (R + 1), betas=(0.8, 0.9 + 0.01 * R))
        if R == root:                       # root has trained locally; the others are fresh
            for step in range(2):
                opt.zero_grad()
                loss_of(model, step, R).backward()
                opt.step()
        thvd.broadcast_optimizer_state(opt, root_rank=root)
        check(opt.param_groups[0]["lr"] == 0.01 * (root + 1), f"lr from root {root}",
              str(opt.param_groups[0]["lr"]))
        check(tuple(opt.param_groups[0]["betas"]) == (0.8, 0.9 + 0.01 * root),
              f"betas from root {root}", str(opt.param_groups[0]["betas"]))
        p0 = model[0].weight
        st = opt.state[p0]
        check(float(st["step"]) == 2.0, f"state step from root {root}", str(st.get("step")))
        same_on_every_rank(st["exp_avg"], f"exp_avg from root {root}")
        same_on_every_rank(st["exp_avg_sq"], f"exp_avg_sq from root {root}")
    # LBFGS state (nested lists of tensors, None values) travels too.
    model = make_model(5)
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=3, history_size=2)
    if R == 0:
        def closure():
            opt.zero_grad()
            loss = loss_of(model, 0, 0)
            loss.backward()
            return loss
        opt.step(closure)
    thvd.broadcast_optimizer_state(opt, root_rank=0)
    st = opt.state[opt._params[0]]
    check(len(st.get("old_dirs", [])) > 0, "LBFGS history broadcast", str(list(st)))
    same_on_every_rank(st["d"], "LBFGS direction broadcast")
    # A fresh optimizer gets its state created (and parameters are left alone).
    model = make_model(5)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.5)
    before = flat_params(model)
    thvd.broadcast_optimizer_state(opt, root_rank=0)
    check(all("momentum_buffer" in opt.state[p] for p in model.parameters()),
          "fresh SGD momentum state created")
    t_equal(flat_params(model), before, "state creation leaves the parameters unchanged")
    check(all(p.grad is not None and not p.grad.any() for p in model.parameters()),
          "state creation leaves zero gradients where there were none (as Horovod)")
    # model= names the sparse embeddings, whose zero gradients are then sparse (Horovod's
    # argument); anything else than a module is refused.
    emb = nn.Embedding(10, 3, sparse=True)
    thvd.broadcast_optimizer_state(torch.optim.SGD(emb.parameters(), lr=0.1),
                                   root_rank=0,
                                   model=emb)
    check(emb.weight.grad is not None and emb.weight.grad.is_sparse, "model=: sparse zero grads")
    check_raises(TypeError, lambda: thvd.broadcast_optimizer_state(opt, 0, model="net"),
                 "nn.Module", what="model= that is not a module")

    # ---------------------------------------------------- broadcast_parameters forms
    for form in ["state_dict", "named_parameters", "parameters"]:
        model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(R)
            model[1].running_mean.fill_(R)
        params = {"state_dict": model.state_dict(), "named_parameters": model.named_parameters(),
                  "parameters": model.parameters()}[form]
        thvd.broadcast_parameters(params if form == "state_dict" else list(params), root_rank=P - 1)
        t_equal(flat_params(model), torch.full_like(flat_params(model), P - 1),
                f"broadcast_parameters({form})")
        if form == "state_dict":
            t_equal(model[1].running_mean, torch.full((3,), float(P - 1)), "buffers broadcast")
    check_raises(ValueError, lambda: thvd.broadcast_parameters(torch.ones(2), 0), "params",
                 what="broadcast_parameters of a tensor")

    # ---------------------------------------------------- objects
    obj = {"hello": 123, 0: [1, 2], "fn": (lambda v: v + 1) if R == 0 else None}
    got = thvd.broadcast_object(obj if R == 0 else None, root_rank=0)
    check(got["hello"] == 123 and got[0] == [1, 2] and got["fn"](1) == 2, "broadcast_object",
          repr(got))
    got = thvd.broadcast_object(f"from {R}", root_rank=P - 1, name="custom")
    check(got == f"from {P - 1}", "broadcast_object from the last rank", repr(got))
    d = {"rank": R, "payload": list(range(R * 50))}
    got = thvd.allgather_object(d)
    check(got == [{"rank": r, "payload": list(range(r * 50))} for r in range(P)],
          "allgather_object", repr(got)[:200])
    check(thvd.allgather_object(None, name="none") == [None] * P, "allgather_object(None)")
    finish()


if __name__ == "__main__":
    main()
