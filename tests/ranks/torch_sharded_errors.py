"""Rank program of tests/test_torch_sharded.py, run by test_refusals_and_errors."""
from torch_sharded_common import *  # noqa: F401,F403 (init, the shared helpers, torch, thvd, hvd, np)


def main():
    R, P = init()
    def wrap(opt, **kw):
        return lambda: thvd.ShardedDistributedOptimizer(opt, **kw)


    model = fresh()
    refused = [torch.optim.LBFGS(model.parameters())]
    for name in ("Adafactor", "Muon"):
        if hasattr(torch.optim, name):
            refused.append(getattr(torch.optim, name)([model.fc1.weight, model.fc2.weight]))


    class MyAdam(torch.optim.Adam):
        pass


    refused.append(MyAdam(model.parameters()))
    for o in refused:
        check_raises(ValueError, wrap(o), f"cannot shard {type(o).__name__}",
                     "use hvd.DistributedOptimizer", what=f"{type(o).__name__} refused")
    adam = torch.optim.Adam(model.parameters())
    check_raises(ValueError, wrap(adam, shard_size=P + 1), f"shard_size={P + 1} does not "
                 f"divide the process set's size {P}", what="shard_size not dividing")
    check_raises(ValueError, wrap(adam, shard_size=0), "positive int", what="shard_size 0")
    check_raises(ValueError, wrap(adam, stage=4), "stage must be 1", what="stage 4")
    check_raises(ValueError, wrap(adam, stage=3), "stage=3 needs model=",
                 what="stage 3 without its model")
    check_raises(ValueError, wrap(adam, stage=2, model=model), "for stage=3 only",
                 what="model= at stage 2")
    check_raises(ValueError, wrap(adam, op=thvd.Max), "only supports Average and Sum",
                 what="op=Max")
    check_raises(NotImplementedError, wrap(adam, op=thvd.Adasum), "Adasum", what="Adasum")
    check_raises(ValueError, wrap(adam, backward_passes_per_step=0), "positive int",
                 what="backward_passes_per_step=0")
    check_raises(ValueError, wrap(adam, named_parameters=[("a", model.fc1.weight)]),
                 "not named", what="named_parameters missing some")
    check_raises(TypeError, wrap(object()), "torch.optim.Optimizer", what="not an optimizer")
    do = thvd.DistributedOptimizer(torch.optim.SGD(fresh().parameters(), lr=0.1))
    check_raises(ValueError, wrap(do), "already wrapped", what="a DistributedOptimizer")

    model = fresh()
    opt = thvd.ShardedDistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = batch(0, R)
    F.cross_entropy(model(x), y).backward()
    check_raises(AssertionError, lambda: F.cross_entropy(model(x), y).backward(),
                 "more than backward_passes_per_step", what="too many backward passes")
    check_raises(AssertionError, opt.zero_grad, "zero_grad() was called after loss.backward()",
                 what="zero_grad while reducing")
    opt.step()
    check_raises(NotImplementedError, lambda: opt.add_param_group({"params": [torch.zeros(2)]}),
                 "cannot add parameter groups", what="add_param_group")
    check_raises(ValueError, lambda: opt.load_state_dict({"nope": 1}), "expects a torch optimizer",
                 what="a bad state dict")
    check_raises(ValueError, lambda: opt.clip_grad_norm_(1.0, norm_type=-1), "norm_type",
                 what="a negative norm type")


    def step_skipping_synchronize():
        with opt.skip_synchronize():
            opt.step()


    check_raises(AssertionError, step_skipping_synchronize, "explicit optimizer.synchronize()")

    torch.manual_seed(0)
    emb = nn.Embedding(5, 2, sparse=True)
    sopt = thvd.ShardedDistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.1))
    check_raises(ValueError, lambda: emb(torch.tensor([1, 2])).sum().backward(),
                 "sparse gradient", what="a sparse gradient")
    finish()


if __name__ == "__main__":
    main()
