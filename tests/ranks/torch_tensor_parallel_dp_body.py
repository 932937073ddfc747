"""Rank program of tests/test_torch_tensor_parallel.py, run by
test_tensor_parallel_with_data_parallel_optimizers."""
from torch_tensor_parallel_common import *  # noqa: F401,F403 (init, the shared helpers, torch, thvd, hvd, np)


def main():
    R, N = init()
    topo = P.Topology(tp=2)
    assert N == 4


    def batch(step, replica):
        g = torch.Generator().manual_seed(100 * step + replica)
        return torch.randn(2, 5, 16, generator=g), torch.randn(2, 5, 16, generator=g)


    for kind in ("DistributedOptimizer", "ShardedDistributedOptimizer"):
        ref, tp = ref_and_tp(lambda: P.GPTBlock(16, 2), P.GPT_BLOCK_PLAN, topo.tp_set)
        opt_r = torch.optim.AdamW(ref.parameters(), lr=1e-2)
        inner = torch.optim.AdamW(tp.parameters(), lr=1e-2)
        if kind == "DistributedOptimizer":
            opt_t = thvd.DistributedOptimizer(inner, tp.named_parameters(),
                                              process_set=topo.dp_set)
        else:
            opt_t = thvd.ShardedDistributedOptimizer(inner, tp.named_parameters(),
                                                     process_set=topo.dp_set)
        for step in range(3):
            xs, ys = zip(*(batch(step, d) for d in range(topo.dp)))
            opt_r.zero_grad()
            F.mse_loss(ref(torch.cat(xs)), torch.cat(ys)).backward()
            opt_r.step()
            opt_t.zero_grad()
            x, y = batch(step, topo.replica())
            F.mse_loss(tp(x), y).backward()
            opt_t.step()
        compare_params(ref, tp, f"tp2×dp2 {kind}")
        for n, p in tp.named_parameters():
            same_on_every_rank(p, f"{kind} {n} equal over dp", topo.dp_set)
    finish()


if __name__ == "__main__":
    main()
