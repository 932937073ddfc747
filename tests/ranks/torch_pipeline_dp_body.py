"""Rank program of tests/test_torch_pipeline.py, run by
test_pipeline_with_data_parallel_optimizers."""
from torch_pipeline_common import *  # noqa: F401,F403 (init, the shared helpers, torch, thvd, hvd, np)


def main():
    R, N = init()
    topo = Topology(pp=2)           # dp-inner: ranks 0,1 stage 0; 2,3 stage 1
    m = 4
    for kind in ("DistributedOptimizer", "ShardedDistributedOptimizer"):
        for sname, cls in SCHEDULES.items():
            what = f"pp2×dp2 {kind} {sname}"
            torch.manual_seed(9)
            layers = mlp_layers()
            model = nn.Sequential(*copy.deepcopy(layers))
            ropt = torch.optim.Adam(model.parameters(), lr=1e-2)
            pipe = PipelineModule(layers, topology=topo, loss_fn=F.mse_loss)
            inner = torch.optim.Adam(pipe.parameters(), lr=1e-2)
            if kind == "DistributedOptimizer":
                opt = thvd.DistributedOptimizer(inner, pipe.named_parameters(),
                                                process_set=topo.dp_set)
            else:
                opt = thvd.ShardedDistributedOptimizer(inner, pipe.named_parameters(), stage=2,
                                                       process_set=topo.dp_set)
            sched = cls(pipe, microbatches=m, optimizer=opt)
            for s in range(3):
                parts = [data("mlp", s, 8, seed=10 + d) for d in range(topo.dp)]
                ropt.zero_grad()
                exp = accumulate_global_batch(model, F.mse_loss, parts, m)
                ropt.step()
                opt.zero_grad()
                x, y = parts[topo.replica()]
                out = sched.train_batch(x, y)
                opt.step()
                close(torch.stack(out.outputs), torch.stack(exp[topo.replica() * m:][:m]),
                      f"{what} step {s} losses")
            compare_stage(pipe, model, what)
            for n, p in pipe.named_parameters():
                same_on_every_rank(p, f"{what} {n} equal over dp", topo.dp_set)

    # tied embedding / LM head at pp 2 × dp 2: the tied sum and the replica average compose
    V, D = 11, 6


    def lm_layers():
        return [nn.Embedding(V, D), nn.Linear(D, D), nn.Tanh(), nn.Linear(D, V, bias=False)]


    def lm_loss(out, y):
        return F.cross_entropy(out.reshape(-1, V), y.reshape(-1))


    for kind in ("DistributedOptimizer", "ShardedDistributedOptimizer"):
        what = f"pp2×dp2 tied {kind}"
        torch.manual_seed(12)
        layers = lm_layers()
        model = nn.Sequential(*copy.deepcopy(layers))
        model[3].weight = model[0].weight
        ropt = torch.optim.Adam(model.parameters(), lr=1e-2)
        pipe = PipelineModule(layers, topology=topo, loss_fn=lm_loss, tied={"weight": (0, 3)},
                              partition=[2])
        inner = torch.optim.Adam(pipe.parameters(), lr=1e-2)
        opt = (thvd.DistributedOptimizer(inner, pipe.named_parameters(), process_set=topo.dp_set)
               if kind == "DistributedOptimizer" else
               thvd.ShardedDistributedOptimizer(inner, pipe.named_parameters(), stage=2,
                                                process_set=topo.dp_set))
        sched = Schedule1F1B(pipe, microbatches=m, optimizer=opt)
        for s in range(3):
            g = torch.Generator().manual_seed(50 + s)
            parts = [(torch.randint(0, V, (8, 5), generator=g),
                      torch.randint(0, V, (8, 5), generator=g)) for _ in range(topo.dp)]
            ropt.zero_grad()
            accumulate_global_batch(model, lm_loss, parts, m)
            ropt.step()
            opt.zero_grad()
            sched.train_batch(*parts[topo.replica()])
            opt.step()
        compare_stage(pipe, model, what)
        w = pipe.tied_params["weight"]
        close(w, model[0].weight, f"{what} tied weight")
        same_on_every_rank(w, f"{what} tied copies bitwise equal", topo.tied_set((0, 1)))
        same_on_every_rank(w, f"{what} tied weight equal over dp", topo.dp_set)
    finish()


if __name__ == "__main__":
    main()
