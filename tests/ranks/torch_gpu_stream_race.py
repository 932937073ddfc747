"""Rank program of tests/test_torch_gpu.py, run by
test_cuda_tensors_at_two_ranks_sharing_one_gpu[stream-race]: a kernel queued on the
current stream writes the tensor (or, inside backward, the gradient) behind a long GPU
sleep just before the op; the op must wait for it, on the default and a side stream."""
from torch_gpu_common import *  # noqa: F401,F403 (init, same, data, torch, thvd, hvd)

SLEEP = int(2e8)      # GPU cycles: ~0.1 s of kernel queued before the write
N = 3 << 20           # 12 MiB: several pieces


class SlowGrad(torch.autograd.Function):
    """Its backward queues a long kernel, then writes the gradient behind it."""

    @staticmethod
    def forward(ctx, w):
        return w.clone()

    @staticmethod
    def backward(ctx, g):
        torch.cuda._sleep(SLEEP)
        out = torch.empty_like(g)
        out.fill_(float(thvd.rank() + 1))
        return out


def main():
    R, P, DEV = init()
    for stream in (None, torch.cuda.Stream()):
        ctx = torch.cuda.stream(stream) if stream is not None else torch.cuda.stream(
            torch.cuda.current_stream())
        with ctx:
            tag = "side stream" if stream is not None else "default stream"
            for i in range(3):
                x = torch.zeros(N, device=DEV)
                torch.cuda._sleep(SLEEP)
                x.fill_(R + 1 + i)                      # queued behind the sleep
                y = thvd.allreduce(x, op=thvd.Sum, name=f"race {tag} {i}")
                # used at once on the current stream: must already hold the result
                s = (y == float(sum(range(1, P + 1)) + P * i)).all()
                check(bool(s), f"allreduce waited for the current stream ({tag}, {i})",
                      f"got {y[:4].tolist()}")
                # in place, after a sleep as well
                torch.cuda._sleep(SLEEP)
                x.fill_(2.0)
                thvd.allreduce_(x, op=thvd.Sum, name=f"race_ {tag} {i}")
                check(bool((x == 2.0 * P).all()), f"allreduce_ waited ({tag}, {i})",
                      f"got {x[:4].tolist()}")

    w = torch.nn.Parameter(torch.zeros(N, device=DEV))
    opt = thvd.DistributedOptimizer(torch.optim.SGD([w], lr=1.0), named_parameters=[("w", w)],
                                    op=thvd.Sum)
    for step in range(2):
        opt.zero_grad()
        SlowGrad.apply(w).sum().backward()
        opt.synchronize()
        check(bool((w.grad == float(sum(range(1, P + 1)))).all()),
              f"the hook's allreduce waited for the gradient's kernel (step {step})",
              f"got {w.grad[:4].tolist()}")
        with opt.skip_synchronize():
            opt.step()
    finish()


if __name__ == "__main__":
    main()
