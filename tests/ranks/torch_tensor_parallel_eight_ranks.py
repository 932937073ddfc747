"""Rank program of tests/test_torch_tensor_parallel.py, run by
test_pp2_tp2_dp2_at_8_ranks_layout_and_training."""
from _torch_common import *  # noqa: F401,F403 (torch, thvd, hvd, np, the check helpers)
from horovodlike.common.topology import Topology
from horovodlike.torch.pipeline import PipelineModule, Schedule1F1B


def main():
    thvd.init()
    R = hvd.rank()
    topo = Topology(pp=2, tp=2)            # the docstring's table: pp 2 × dp 2 × tp 2
    expect = {"tp_set": [[0, 1], [2, 3], [4, 5], [6, 7]], "dp_set": [[0, 2], [1, 3], [4, 6], [5, 7]],
              "pipe_set": [[0, 4], [1, 5], [2, 6], [3, 7]], "stage_set": [[0, 1, 2, 3], [4, 5, 6, 7]]}
    for attr, groups in expect.items():
        mine = next(g for g in groups if R in g)
        ps = getattr(topo, attr)
        check(ps.ranks == mine, attr, f"{ps} on rank {R}, expected {mine}")
        # every set is usable at once after a plain init: the sum of its members' ranks
        got = hvd.allreduce(np.array([R], np.int64), op=hvd.Sum, name=attr, process_set=ps)
        check(int(got[0]) == sum(mine), f"allreduce over {attr}", f"{got} != {sum(mine)}")
    tied = topo.tied_set((0, 1))
    check(tied is not None and tied.ranks == topo.pipe_set.ranks, "tied_set", repr(tied))
    check((topo.stage(), topo.replica(), topo.tp_rank) == (R // 4, R // 2 % 2, R % 2), "coords",
          repr(topo))
    check(topo.prev_rank == (R - 4 if R >= 4 else None) and
          topo.next_rank == (R + 4 if R < 4 else None), "prev/next", repr(topo))
    again = Topology(pp=2, tp=2)           # the same sets are found, not added twice
    check(again.tp_set is topo.tp_set and again.dp_set is topo.dp_set, "sets reused")

    # ------------------------------------------------ training: pp 2 × tp 2 × dp 2
    # A GPT block on each stage, split over tp_set; 1F1B over pipe_set; gradients averaged
    # over dp_set by DistributedOptimizer. Reference: the whole model in one process on the
    # global batch (dp replicas × m micro-batches, each loss / (m · dp)), AdamW, float64.
    import copy
    import torch.nn as nn
    import torch.nn.functional as F
    P = thvd.parallel
    torch.set_default_dtype(torch.float64)
    TOL = 1e-10
    D, M, STEPS = 8, 2, 3
    torch.manual_seed(21)
    layers = [nn.Linear(5, D), P.GPTBlock(D, 2), P.GPTBlock(D, 2), nn.LayerNorm(D), nn.Linear(D, 3)]
    ref = nn.Sequential(*copy.deepcopy(layers))
    pipe = PipelineModule(layers, topology=topo, partition=[2], loss_fn=F.mse_loss)
    P.tensor_parallel(pipe, P.GPT_BLOCK_PLAN, process_set=topo.tp_set)
    check(any(isinstance(m, P.TensorParallelModule) for m in pipe.modules()),
          "stage holds tensor-parallel layers", repr(pipe))
    ropt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    opt = thvd.DistributedOptimizer(torch.optim.AdamW(pipe.parameters(), lr=1e-2, weight_decay=0.1),
                                    pipe.named_parameters(), process_set=topo.dp_set)
    sched = Schedule1F1B(pipe, microbatches=M, optimizer=opt)
    for s in range(STEPS):
        g = torch.Generator().manual_seed(300 + s)
        parts = [(torch.randn(4, 3, 5, generator=g), torch.randn(4, 3, 3, generator=g))
                 for _ in range(topo.dp)]
        ropt.zero_grad()
        exp = accumulate_global_batch(ref, F.mse_loss, parts, M)
        ropt.step()
        opt.zero_grad()
        out = sched.train_batch(*parts[topo.replica()])
        opt.step()
        t_close(torch.stack(out.outputs), torch.stack(exp[topo.replica() * M:][:M]),
                f"pp2×tp2×dp2 step {s} losses", rtol=0, atol=TOL)
    full = P.consolidated_state_dict(pipe)     # this stage's layers, unsharded
    for k, li in enumerate(pipe.layer_ids):
        for n, v in ref[li].state_dict().items():
            got = full.get(f"layers.{k}.{n}")
            check(got is not None, f"pp2×tp2×dp2 layer {li} {n} present", sorted(full))
            if got is not None:
                t_close(got, v, f"pp2×tp2×dp2 after {STEPS} AdamW steps: layer {li} {n}",
                        rtol=0, atol=TOL)
    for n, p in pipe.named_parameters():
        same_on_every_rank(p, f"pp2×tp2×dp2 {n} equal over dp", topo.dp_set)
    finish()


if __name__ == "__main__":
    main()
