"""Rank program of tests/test_slurm.py and tests/test_mpich.py: a few steps of training a
small torch model with hvd.DistributedOptimizer, started by srun, sbatch's srun, MPICH's
mpiexec or horovodlikerun inside an allocation.

    python hpc_train.py [kill|stop RANK]

Every rank prints `launch=<how horovodlike saw its start> size=N local=L/LS`, trains, and
checks that every rank ends with the same weights, that they moved from the start and
that the loss fell. With `kill RANK` or `stop RANK`, that rank SIGKILLs or SIGSTOPs
itself in the middle of the training (after `midway` is printed): the others must fail
naming it, and the launch must end.
"""
from _torch_common import *  # noqa: F401,F403 (torch, thvd, the check helpers)
import signal

from horovodlike.common import basics

STEPS = 12


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else None
    victim = int(sys.argv[2]) if mode else -1
    thvd.init()
    rank, size = thvd.rank(), thvd.size()
    print(f"launch={basics._topo.launcher} rank={rank} size={size} "
          f"local={thvd.local_rank()}/{thvd.local_size()}", flush=True)
    if basics._topo.launcher == "mpi":
        from mpi4py import MPI
        print(f"mpi={MPI.Get_library_version().split()[0]}", flush=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                torch.nn.Linear(16, 1))
    # Each rank starts elsewhere; broadcast_parameters must make them one model.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * rank)
    opt = thvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                    named_parameters=model.named_parameters())
    thvd.broadcast_parameters(model.state_dict(), root_rank=0)
    thvd.broadcast_optimizer_state(opt, root_rank=0)
    start = [p.detach().clone() for p in model.parameters()]
    target = torch.randn(8, 1, generator=torch.Generator().manual_seed(1))
    losses = []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(1000 * step + rank)   # each rank its own data
        x = torch.randn(32, 8, generator=g)
        loss = ((model(x) - x @ target) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        if step == STEPS // 2:
            print(f"midway {rank}", flush=True)
            if rank == victim:
                os.kill(os.getpid(), signal.SIGKILL if mode == "kill" else signal.SIGSTOP)
        opt.step()
        losses.append(thvd.allreduce(loss.detach(), name="loss").item())
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = thvd.allgather(flat.reshape(1, -1), name="weights")
    for r in range(size):
        t_equal(every[r], flat, f"rank {r}'s weights against rank {rank}'s")
    moved = sum(float((p.detach() - s).abs().sum()) for p, s in zip(model.parameters(), start))
    check(moved > 0, "the weights moved", f"moved {moved}")
    check(losses[-1] < losses[0], "the mean loss fell", f"{losses[0]:.4f} -> {losses[-1]:.4f}")
    print(f"trained rank={rank} loss={losses[0]:.4f}->{losses[-1]:.4f}", flush=True)
    finish()


if __name__ == "__main__":
    main()
