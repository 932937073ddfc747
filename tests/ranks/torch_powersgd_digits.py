"""Rank program of tests/test_torch_powersgd.py, run by
test_powersgd_digits_accuracy_within_one_point."""
from _torch_common import *  # noqa: F401,F403 (torch, thvd, hvd, np, the check helpers)


def main():
    hvd.init()
    R, P = thvd.rank(), thvd.size()
    import torch.nn as nn
    import torch.nn.functional as F
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split


    d = load_digits()
    x = torch.from_numpy((d.images / 16.0).astype(np.float32)[:, None])
    y = torch.from_numpy(d.target.astype(np.int64))
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    EPOCHS, BATCH = 10, 32


    def train(compression):
        # The example's data, optimizer and batch size; an MLP instead of its CNN, whose
        # steps would make this test take minutes on a small machine.
        torch.manual_seed(42)
        model = nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64),
                              nn.ReLU(), nn.Linear(64, 10))
        opt = thvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.03 * P,
                                                        momentum=0.9),
                                        named_parameters=model.named_parameters(),
                                        compression=compression)
        thvd.broadcast_parameters(model.state_dict(), root_rank=0)
        mine = torch.arange(R, len(xtr), P)
        for epoch in range(EPOCHS):
            order = mine[torch.randperm(len(mine), generator=torch.Generator().manual_seed(epoch))]
            for i in range(0, len(order) - BATCH + 1, BATCH):
                idx = order[i:i + BATCH]
                opt.zero_grad()
                F.cross_entropy(model(xtr[idx]), ytr[idx]).backward()
                opt.step()
        with torch.no_grad():
            return 100.0 * (model(xte).argmax(1) == yte).float().mean().item()


    t0 = time.time()
    plain = train(thvd.Compression.none)
    t1 = time.time()
    psgd = thvd.PowerSGD(rank=2, start_iter=50)
    compressed = train(psgd)
    print(f"accuracy plain={plain:.2f} powersgd={compressed:.2f} "
          f"rate={psgd.compression_stats()[0]:.1f} ({t1 - t0:.1f}s, {time.time() - t1:.1f}s)")
    check(plain > 90, "uncompressed run learns", f"{plain:.2f}%")
    check(compressed >= plain - 1.0, "PowerSGD within 1 point of uncompressed",
          f"plain {plain:.2f}% powersgd {compressed:.2f}%")
    finish()


if __name__ == "__main__":
    main()
