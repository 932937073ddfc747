"""Rank program of tests/test_torch_sync_batch_norm.py, run by
test_sync_batch_norm_matches_batch_norm_on_the_global_batch."""
from _torch_common import *  # noqa: F401,F403 (torch, thvd, hvd, np, the check helpers)
import torch.nn as nn


def main():
    hvd.init()
    R, P = thvd.rank(), thvd.size()


    def data(r, shape_tail, dtype):
        g = torch.Generator()
        g.manual_seed(17 + r)
        return (torch.randn((r + 2,) + shape_tail, generator=g) * (r + 1) + r).to(dtype)


    for ref_cls, tail in [(nn.BatchNorm1d, (3,)), (nn.BatchNorm1d, (3, 5)),
                          (nn.BatchNorm2d, (3, 4, 2)), (nn.BatchNorm3d, (3, 2, 2, 2))]:
        for dtype, tol in [(torch.float32, 1e-4), (torch.float64, 1e-10)]:
            what = f"SyncBatchNorm vs {ref_cls.__name__} {tail} {dtype}"
            torch.manual_seed(3)
            ref = ref_cls(3, momentum=0.3).to(dtype)
            with torch.no_grad():
                ref.weight.uniform_(0.5, 1.5)
                ref.bias.uniform_(-0.5, 0.5)
            sbn = thvd.SyncBatchNorm(3, momentum=0.3).to(dtype)
            sbn.load_state_dict(ref.state_dict())

            xs = [data(r, tail, dtype) for r in range(P)]
            offset = sum(x.shape[0] for x in xs[:R])
            gx = torch.cat(xs).requires_grad_()
            gy = ref(gx)
            # Loss: each rank weights its own output rows by (rank + 1).
            w = torch.cat([torch.full_like(x, r + 1.0) for r, x in enumerate(xs)])
            (gy * w * gy).sum().backward()

            x = xs[R].clone().requires_grad_()
            y = sbn(x)
            t_close(y, gy[offset:offset + x.shape[0]].detach(), what + ": output", tol, tol)
            (y * (R + 1.0) * y).sum().backward()
            t_close(x.grad, gx.grad[offset:offset + x.shape[0]], what + ": input gradient",
                    10 * tol, 10 * tol)
            t_close(thvd.allreduce(sbn.weight.grad, op=thvd.Sum), ref.weight.grad,
                    what + ": summed weight gradient", 10 * tol, 10 * tol)
            t_close(thvd.allreduce(sbn.bias.grad, op=thvd.Sum), ref.bias.grad,
                    what + ": summed bias gradient", 10 * tol, 10 * tol)
            t_close(sbn.running_mean, ref.running_mean, what + ": running_mean", tol, tol)
            t_close(sbn.running_var, ref.running_var, what + ": running_var", tol, tol)
            check(int(sbn.num_batches_tracked) == 1, what + ": num_batches_tracked")
            sbn.eval()
            ref.eval()
            t_close(sbn(xs[R]), ref(xs[R]), what + ": eval mode uses the running stats", tol, tol)

    # momentum=None: a cumulative average over batches.
    sbn = thvd.SyncBatchNorm(2, momentum=None)
    ref = nn.BatchNorm1d(2, momentum=None)
    for step in range(3):
        xs = [data(r + 10 * step, (2,), torch.float64).float() for r in range(P)]
        sbn(xs[R])
        ref(torch.cat(xs))
    t_close(sbn.running_mean, ref.running_mean, "momentum=None running_mean", 1e-5, 1e-6)
    t_close(sbn.running_var, ref.running_var, "momentum=None running_var", 1e-5, 1e-6)

    # Half precision runs (computed in float32), affine=False, a 1-D input is refused.
    xh = data(R, (3, 4), torch.float32)
    yh = thvd.SyncBatchNorm(3, affine=False)(xh.to(torch.bfloat16))
    check(yh.dtype == torch.bfloat16, "bfloat16 in, bfloat16 out")
    ref = nn.BatchNorm1d(3, affine=False)(torch.cat([data(r, (3, 4), torch.float32)
                                                     for r in range(P)]))
    offset = sum(r + 2 for r in range(R))
    t_close(yh.float(), ref[offset:offset + R + 2], "bfloat16 SyncBatchNorm", 3e-2, 3e-2)
    check_raises(ValueError, lambda: thvd.SyncBatchNorm(3)(torch.ones(3)), "2D",
                 what="1-D input")

    # In a model, trained with DistributedOptimizer: identical everywhere.
    torch.manual_seed(R)
    model = nn.Sequential(nn.Linear(4, 6), thvd.SyncBatchNorm(6), nn.ReLU(), nn.Linear(6, 2))
    thvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = thvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                    named_parameters=model.named_parameters())
    for step in range(3):
        opt.zero_grad()
        model(data(R + step, (4,), torch.float32)).pow(2).mean().backward()
        opt.step()
    same_on_every_rank(flat_params(model), "model with SyncBatchNorm after 3 steps")
    same_on_every_rank(model[1].running_mean, "running_mean in the model")
    finish()


if __name__ == "__main__":
    main()
