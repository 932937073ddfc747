"""Rank program of tests/test_torch_optimizer.py, run by
test_every_torch_optimizer_stays_identical_across_ranks."""
from torch_optimizer_common import *  # noqa: F401,F403 (init, the shared helpers, torch, thvd, hvd, np)


def main():
    R, P = init()
    STEPS = 3
    CONFIGS = [
        ("SGD", lambda p: torch.optim.SGD(p, lr=0.1)),
        ("SGD momentum nesterov wd", lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9,
                                                               nesterov=True, weight_decay=0.01)),
        ("Adam", lambda p: torch.optim.Adam(p, lr=0.01)),
        ("Adam amsgrad wd", lambda p: torch.optim.Adam(p, lr=0.01, amsgrad=True,
                                                       weight_decay=0.01)),
        ("AdamW", lambda p: torch.optim.AdamW(p, lr=0.01)),
        ("Adamax", lambda p: torch.optim.Adamax(p, lr=0.01)),
        ("Adadelta", lambda p: torch.optim.Adadelta(p, lr=1.0)),
        ("Adagrad", lambda p: torch.optim.Adagrad(p, lr=0.1, lr_decay=0.01)),
        ("ASGD", lambda p: torch.optim.ASGD(p, lr=0.05, t0=1)),
        ("NAdam", lambda p: torch.optim.NAdam(p, lr=0.01)),
        ("RAdam", lambda p: torch.optim.RAdam(p, lr=0.01)),
        ("RMSprop centered momentum", lambda p: torch.optim.RMSprop(p, lr=0.01, momentum=0.5,
                                                                    centered=True)),
        ("Rprop", lambda p: torch.optim.Rprop(p, lr=0.01)),
        ("LBFGS", lambda p: torch.optim.LBFGS(p, lr=0.5, max_iter=4, history_size=3)),
    ]
    if hasattr(torch.optim, "Adafactor"):
        CONFIGS.append(("Adafactor", lambda p: torch.optim.Adafactor(p, lr=0.01)))
    if hasattr(torch.optim, "Muon"):
        CONFIGS.append(("Muon", lambda p: torch.optim.Muon(p, lr=0.02)))

    for label, make_opt in CONFIGS:
        bias = label != "Muon"                        # Muon takes 2-D parameters only
        model = make_model(100 + R, bias=bias)        # different weights on every rank
        opt = make_opt(model.parameters())
        before = flat_params(model)
        thvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = thvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        check(isinstance(opt, type(make_opt([torch.zeros(2, 2, requires_grad=True)]))),
              f"{label}: the wrapper is an instance of the wrapped optimizer's class")
        thvd.broadcast_optimizer_state(opt, root_rank=0)
        check(len(opt.state) > 0 or label in ("SGD", "Muon"),
              f"{label}: broadcast_optimizer_state created the state")
        same_on_every_rank(flat_params(model), f"{label}: after broadcast_parameters")
        start = flat_params(model)
        for step in range(STEPS):
            if label == "LBFGS":
                def closure():
                    opt.zero_grad()
                    loss = loss_of(model, step, R)
                    loss.backward()
                    return loss
                opt.step(closure)
            else:
                opt.zero_grad()
                loss_of(model, step, R).backward()
                opt.step()
        after = flat_params(model)
        check(not torch.equal(after, start), f"{label}: training changed the parameters")
        same_on_every_rank(after, f"{label}: parameters after {STEPS} steps")
        state = torch.cat([v.detach().reshape(-1).double() for s in opt.state.values()
                           for v in s.values() if isinstance(v, torch.Tensor)] or
                          [torch.zeros(1)])
        same_on_every_rank(state, f"{label}: optimizer state after {STEPS} steps")

    # SparseAdam: sparse gradients (nn.Embedding(sparse=True)) are reduced by allgather.
    for label, make_opt, sparse_as_dense in [
            ("SparseAdam", lambda p: torch.optim.SparseAdam(p, lr=0.05), False),
            # reduced as dense, then sparse again for the optimizer (as Horovod)
            ("SparseAdam sparse_as_dense", lambda p: torch.optim.SparseAdam(p, lr=0.05), True)]:
        torch.manual_seed(7 + R)
        emb = nn.Embedding(10, 3, sparse=True)
        opt = make_opt(emb.parameters())
        thvd.broadcast_parameters(emb.state_dict(), root_rank=0)
        opt = thvd.DistributedOptimizer(opt, named_parameters=emb.named_parameters(),
                                        sparse_as_dense=sparse_as_dense)
        thvd.broadcast_optimizer_state(opt, root_rank=0)
        start = flat_params(emb)
        for step in range(STEPS):
            opt.zero_grad()
            idx = torch.tensor([(R + step) % 10, (3 * R + 1) % 10, 9])
            (emb(idx) ** 2).sum().backward()
            opt.step()
        check(not torch.equal(flat_params(emb), start), f"{label}: training changed the weights")
        same_on_every_rank(flat_params(emb), f"{label}: weights after {STEPS} steps")
    finish()


if __name__ == "__main__":
    main()
