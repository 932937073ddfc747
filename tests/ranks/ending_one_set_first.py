"""Rank program of tests/test_ending.py: a natural multi-group script at 4 ranks whose
ranks 0 and 1 finish first, with no final barrier, while ranks 2 and 3 still have ops
of their own process set to run (their group's metric, their stage's loss, their
replica's evaluation), then print their last line.

The race is made certain, not likely: ranks 2 and 3 run their last ops only after
rank 0's exit-time shutdown has returned, or after HOLD seconds if it has not. A
shutdown that ends the whole job returns at once and fails those ops; a shutdown that is
per rank waits for ranks 2 and 3 to finish, so they wait out HOLD (far more than a job-
wide shutdown takes) and then run their ops with ranks 0 and 1 already finished.

    ending_one_set_first.py sharded|pipeline|tp

T_HOLD=0 runs the script as a user would write it, with no wait at all (the race then
is left to chance, as in a real job: for soak runs by hand).
"""
import atexit
from _torch_common import *  # noqa: F401,F403 (torch, thvd, hvd, np, the check helpers)
import torch.nn as nn
import torch.nn.functional as F
from horovodlike.common.topology import Topology
from horovodlike.torch.pipeline import PipelineModule, Schedule1F1B

# seconds: a job-wide shutdown returns within milliseconds of its call
HOLD = float(os.environ.get("T_HOLD", "3"))


def hold_for_rank0():
    if not HOLD:
        return
    try:
        wait_for("rank0.shutdown.returned", timeout=HOLD)
    except TimeoutError:
        pass      # rank 0 is still in its shutdown, waiting for this set: the fixed case


def sharded(R):
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    thvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = thvd.ShardedDistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-2),
                                           model.named_parameters(), stage=2, shard_size=2)
    g = torch.Generator().manual_seed(R)
    for _ in range(3):
        x, y = torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g)
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    if R >= 2:      # the second partition group logs its mean loss
        hold_for_rank0()
        thvd.allreduce(loss.detach(), name="group.loss", process_set=opt.partition_set)


def pipeline(R):
    topo = Topology(pp=2)           # stage 0: ranks 0, 1; stage 1: ranks 2, 3
    torch.manual_seed(2)
    layers = [nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3)]
    pipe = PipelineModule(layers, topology=topo, loss_fn=F.mse_loss)
    opt = thvd.DistributedOptimizer(torch.optim.Adam(pipe.parameters(), lr=1e-2),
                                    pipe.named_parameters(), process_set=topo.dp_set)
    sched = Schedule1F1B(pipe, microbatches=2, optimizer=opt)
    g = torch.Generator().manual_seed(topo.replica())
    for _ in range(3):
        opt.zero_grad()
        out = sched.train_batch(torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g))
        opt.step()
    if topo.stage() == 1:       # the last stage has the loss: it averages it over dp
        hold_for_rank0()
        thvd.allreduce(torch.stack(out.outputs).mean(), name="stage.loss",
                       process_set=topo.dp_set)


def tp(R):
    topo = Topology(tp=2)           # replica 0: ranks 0, 1; replica 1: ranks 2, 3
    P = thvd.parallel
    torch.manual_seed(3)
    model = P.tensor_parallel(P.GPTBlock(16, 2), P.GPT_BLOCK_PLAN, process_set=topo.tp_set)
    opt = thvd.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-2),
                                    model.named_parameters(), process_set=topo.dp_set)
    g = torch.Generator().manual_seed(topo.replica())
    for _ in range(3):
        opt.zero_grad()
        F.mse_loss(model(torch.randn(2, 5, 16, generator=g)),
                   torch.randn(2, 5, 16, generator=g)).backward()
        opt.step()
    if topo.replica() == 1:     # the second replica evaluates its share (ops in its tp set)
        hold_for_rank0()
        with torch.no_grad():
            model(torch.randn(2, 5, 16, generator=g))


RANK = []


def main():
    # Registered before init, so it runs after the library's exit-time shutdown.
    atexit.register(lambda: RANK == [0] and HOLD and arrive("rank0.shutdown.returned"))
    thvd.init()
    R = thvd.rank()
    RANK.append(R)
    assert thvd.size() == 4, "run at 4 ranks"
    {"sharded": sharded, "pipeline": pipeline, "tp": tp}[sys.argv[1]](R)
    # what follows the last step (a checkpoint, say): every rank gets here and says so
    print(f"HVDTEST-OK rank={R}", flush=True)


if __name__ == "__main__":
    main()
