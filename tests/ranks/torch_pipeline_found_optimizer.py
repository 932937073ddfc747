"""Rank program of tests/test_torch_pipeline.py, run by
test_pipeline_finds_the_distributed_optimizer_without_optimizer_argument (2 ranks,
pp 1 x dp 2): a schedule given no optimizer= finds the DistributedOptimizer hooked on
the stage's parameters (made before or after the schedule) and trains as with it;
two optimizers on the same parameters make it ask for optimizer=."""
from torch_pipeline_common import *  # noqa: F401,F403 (init, the shared helpers, torch, thvd, hvd, np)


def main():
    R, N = init()
    topo = thvd.Topology(pp=1)               # dp = 2
    m = 4
    for when in ("before", "after"):
        for sname, cls in SCHEDULES.items():
            what = f"dp2 no optimizer= ({when} the schedule) {sname}"
            torch.manual_seed(9)
            layers = mlp_layers()
            model = nn.Sequential(*copy.deepcopy(layers))
            ropt = torch.optim.SGD(model.parameters(), lr=0.1)
            pipe = PipelineModule(layers, topology=topo, loss_fn=F.mse_loss)

            def wrap():
                return thvd.DistributedOptimizer(torch.optim.SGD(pipe.parameters(), lr=0.1),
                                                 pipe.named_parameters(),
                                                 process_set=topo.dp_set)
            opt = wrap() if when == "before" else None
            sched = cls(pipe, microbatches=m)
            opt = opt or wrap()
            for s in range(2):
                parts = [data("mlp", s, 8, seed=10 + d) for d in range(topo.dp)]
                ropt.zero_grad()
                accumulate_global_batch(model, F.mse_loss, parts, m)
                ropt.step()
                opt.zero_grad()
                x, y = parts[topo.replica()]
                sched.train_batch(x, y)
                try:
                    opt.step()
                except Exception as e:
                    fail(what, f"step {s}: {type(e).__name__}: {e}")
                    break
            check(sched.optimizer is opt, f"{what}: the schedule wired the optimizer")
            compare_stage(pipe, model, what)

    # Two distributed optimizers over one stage's parameters: the schedule cannot choose.
    torch.manual_seed(9)
    pipe = PipelineModule(mlp_layers(), topology=topo, loss_fn=F.mse_loss)
    params = list(pipe.named_parameters())
    half = len(params) // 2
    opts = [thvd.DistributedOptimizer(torch.optim.SGD([p for _, p in part], lr=0.1), part,
                                      process_set=topo.dp_set)
            for part in (params[:half], params[half:])]
    check_raises(ValueError, lambda: Schedule1F1B(pipe, microbatches=m),
                 "2 distributed optimizers", "pass optimizer= to Schedule1F1B",
                 what="two optimizers")
    sched = Schedule1F1B(pipe, microbatches=m, optimizer=opts[0])   # explicit: accepted
    check(sched.optimizer is opts[0], "an explicit optimizer= is kept")
    finish()


if __name__ == "__main__":
    main()
