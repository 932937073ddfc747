"""Rank program of tests/test_torch_pipeline.py, run by
test_pipeline_equivalence_tied_memory_and_errors."""
from torch_pipeline_common import *  # noqa: F401,F403 (init, the shared helpers, torch, thvd, hvd, np)


def main():
    R, N = init()
    # ------------------------------------------------ equivalence: pp 2 (×2) and pp 4
    for pp in (2, 4):
        topo = Topology(pp=pp)
        for model, make, loss_fn, rows in (("mlp", mlp_layers, F.mse_loss, 16),
                                           ("transformer", tf_layers, seq_loss, 8)):
            for m in (1, 4, 8):
                for sname, cls in SCHEDULES.items():
                    what = f"pp{pp} {model} m={m} {sname}"
                    torch.manual_seed(7)
                    layers = make()
                    batches = [data(model, s, rows) for s in range(3)]
                    ref_losses, ref_model = reference(copy.deepcopy(layers), loss_fn, batches, m)
                    pipe = PipelineModule(layers, topology=topo, loss_fn=loss_fn,
                                          partition="uniform" if model == "mlp" else "parameters")
                    opt = sgd(pipe)
                    sched = cls(pipe, microbatches=m)
                    for s, (x, y) in enumerate(batches):
                        opt.zero_grad()
                        out = sched.train_batch(x if topo.first_stage else None,
                                                y if topo.last_stage else None)
                        opt.step()
                        close(torch.stack(out.outputs), ref_losses[s], f"{what} step {s} losses")
                        close(out.reduce_mean(), ref_losses[s].mean(), f"{what} reduce_mean")
                        close(out.reduce_sum(), ref_losses[s].sum(), f"{what} reduce_sum")
                    compare_stage(pipe, ref_model, what)
                    # each rank's parameters are exactly its stage's layers
                    mine = sum(p.numel() for li in pipe.layer_ids for p in layers[li].parameters())
                    check(sum(p.numel() for p in pipe.parameters()) == mine and
                          all(l is layers[li] for li, l in zip(pipe.layer_ids, pipe.layers)),
                          f"{what} stage parameters", str(pipe.layer_ids))
                    if m == 4 and sname == "1f1b":      # eval: outputs on every rank
                        x, _ = batches[0]
                        with torch.no_grad():
                            exp = [ref_model(xm) for xm in torch.tensor_split(x, m)]
                        got = sched.eval_batch(x if topo.first_stage else None)
                        for i, (g_, e_) in enumerate(zip(got.outputs, exp)):
                            close(g_, e_, f"{what} eval micro-batch {i}")
                        if model == "mlp":
                            close(got.concat(), torch.cat(exp), f"{what} eval concat")

    # ------------------------------------------------ LayerSpec, checkpoint_layers
    topo = Topology(pp=4)
    torch.manual_seed(3)
    ref_layers = mlp_layers()
    specs = [LayerSpec(nn.Linear, 6, 8), LayerSpec(nn.Tanh), LayerSpec(nn.Linear, 8, 8),
             LayerSpec(nn.Tanh), LayerSpec(nn.Linear, 8, 8), LayerSpec(nn.Tanh),
             LayerSpec(nn.Linear, 8, 3)]
    pipe = PipelineModule(specs, topology=topo, loss_fn=F.mse_loss, checkpoint_layers=True)
    with torch.no_grad():
        for li, layer in zip(pipe.layer_ids, pipe.layers):
            for p, q in zip(layer.parameters(), ref_layers[li].parameters()):
                p.copy_(q)
    batches = [data("mlp", s, 12, seed=1) for s in range(3)]
    ref_losses, ref_model = reference(copy.deepcopy(ref_layers), F.mse_loss, batches, 4)
    opt = sgd(pipe)
    sched = Schedule1F1B(pipe, microbatches=4)
    for s, (x, y) in enumerate(batches):
        opt.zero_grad()
        out = sched.train_batch(x, y)
        opt.step()
        close(torch.stack(out.outputs), ref_losses[s], f"LayerSpec+checkpoint step {s}")
    compare_stage(pipe, ref_model, "LayerSpec+checkpoint")
    check(pipe.bounds == [0, 1, 3, 5, 7], "partition=parameters bounds", str(pipe.bounds))

    # ------------------------------------------------ tied embedding / LM head
    V, D = 11, 6


    class Pool(nn.Module):
        def forward(self, x):
            return torch.tanh(x)


    def lm_layers():
        return [nn.Embedding(V, D), nn.Linear(D, D), Pool(), nn.Linear(D, D), Pool(),
                nn.Linear(D, V, bias=False)]


    def lm_loss(out, y):
        return F.cross_entropy(out.reshape(-1, V), y.reshape(-1))


    for pp in (2, 4):
        topo = Topology(pp=pp)
        for sname, cls in SCHEDULES.items():
            what = f"tied pp{pp} {sname}"
            torch.manual_seed(11)
            layers = lm_layers()
            g = torch.Generator().manual_seed(5)
            batches = [(torch.randint(0, V, (8, 5), generator=g),
                        torch.randint(0, V, (8, 5), generator=g)) for _ in range(3)]
            ref_layers = copy.deepcopy(layers)
            model = nn.Sequential(*ref_layers)
            model[5].weight = model[0].weight
            pipe = PipelineModule(layers, topology=topo, loss_fn=lm_loss, partition="uniform",
                                  tied={"weight": (0, 5)})
            opt = sgd(pipe, 0.5)
            ropt = torch.optim.SGD(model.parameters(), lr=0.5)
            sched = cls(pipe, microbatches=4)
            for s, (x, y) in enumerate(batches):
                opt.zero_grad(); ropt.zero_grad()
                out = sched.train_batch(x, y)
                exp = []
                for xm, ym in zip(torch.tensor_split(x, 4), torch.tensor_split(y, 4)):
                    loss = lm_loss(model(xm), ym)
                    (loss / 4).backward()
                    exp.append(loss.detach())
                close(torch.stack(out.outputs), torch.stack(exp), f"{what} step {s} losses")
                if s == 0 and pipe.has_tied:
                    close(pipe.tied_params["weight"].grad, model[0].weight.grad,
                          f"{what} tied gradient")
                opt.step(); ropt.step()
            for li, layer in zip(pipe.layer_ids, pipe.layers):
                for n, p in layer.named_parameters():
                    close(p, dict(model[li].named_parameters())[n], f"{what} layer {li} {n}")
            if pipe.has_tied:
                w = pipe.tied_params["weight"]
                close(w, model[0].weight, f"{what} tied weight")
                same_on_every_rank(w, f"{what} tied copies bitwise equal",
                                   topo.tied_set((0, pp - 1)))
                check(pipe.layers[-1 if topo.last_stage else 0].weight.data_ptr() == w.data_ptr(),
                      f"{what} layer computes with the tied parameter's storage")

    # ------------------------------------------------ saved activations per stage
    for pp in (2, 4):
        topo = Topology(pp=pp)
        m = 8
        for sname, cls in SCHEDULES.items():
            torch.manual_seed(2)
            pipe = PipelineModule(mlp_layers(), topology=topo, loss_fn=F.mse_loss,
                                  partition="uniform")
            sched = cls(pipe, microbatches=m)
            live = {}
            peak = [0]

            class Saved:
                def __init__(self, t, mb):
                    self.t, self.mb = t, mb
                    live[mb] = live.get(mb, 0) + 1
                    peak[0] = max(peak[0], sum(1 for v in live.values() if v))

                def __del__(self):
                    live[self.mb] -= 1

            def pack(t):
                return Saved(t, sched.current_microbatch)

            def unpack(s):
                return s.t

            x, y = data("mlp", 0, 16)
            with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
                sched.train_batch(x, y)
            exp = m if sname == "gpipe" else pp - topo.stage()
            check(peak[0] <= exp and (sname == "1f1b" or peak[0] == m),
                  f"pp{pp} {sname} stage {topo.stage()} peak saved micro-batches",
                  f"{peak[0]} (bound {exp})")

    # ------------------------------------------------ errors: every rank, no hang
    topo = Topology(pp=4)


    def raises(fn, words, what):
        try:
            fn()
        except (ValueError, TypeError) as e:
            check(all(w in str(e) for w in words), what, f"message {e!r} lacks {words}")
            return
        fail(what, "no error")


    pipe = PipelineModule(mlp_layers(), topology=topo, loss_fn=F.mse_loss)
    raises(lambda: Schedule1F1B(pipe, microbatches=0), ["microbatches", "m >= 1"], "m < 1")
    raises(lambda: PipelineModule([nn.Linear(2, 2)] * 3, topology=topo), ["4 stages", "3 layers"],
           "more stages than layers")
    raises(lambda: PipelineModule(lm_layers(), topology=topo, tied={"weight": (2, 3)},
                                  partition=[1, 2, 5]),
           ["layers 2 and 3 are both on stage 2"], "tied pair on one stage")
    raises(lambda: PipelineModule(lm_layers(), topology=topo, tied={"weight": (0, 3)},
                                  partition=[1, 2, 4]),
           ["did not declare", "tied=[(0, 2)]"], "tied pair of undeclared stages")
    sched = ScheduleGPipe(pipe, microbatches=4)
    x, y = data("mlp", 0, 8)
    bad = y + R if not topo.last_stage else y
    raises(lambda: sched.train_batch(x, bad), ["y given on stage 1 (rank 1) differs from the last stage"],
           "y differing on a non-last stage")
    raises(lambda: sched.train_batch(x[:3], y), ["fewer rows than microbatches=4"], "x too short")
    raises(lambda: sched.train_batch(x, None), ["needs y on the last stage"], "no y")
    out = sched.train_batch(x, y if topo.last_stage else None)   # still usable afterwards
    check(len(out) == 4, "a good batch after the errors")
    finish()


if __name__ == "__main__":
    main()
