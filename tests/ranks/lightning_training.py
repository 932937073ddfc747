"""Rank program of tests/test_lightning.py, run by
test_two_ranks_match_one_process_over_the_global_batch."""
import glob
import logging
import torch
import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
import horovodlike.torch as thvd
from horovodlike.lightning import HorovodStrategy
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)


def main():
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    OUT = sys.argv[1]
    N, B, EPOCHS, LR, MOMENTUM = 32, 4, 2, 0.05, 0.9

    g = torch.Generator().manual_seed(0)
    X = torch.randn(N, 4, generator=g, dtype=torch.float64)
    Y = X @ torch.tensor([[1.0], [-2.0], [3.0], [0.5]], dtype=torch.float64) + 0.1


    class Model(pl.LightningModule):
        def __init__(self, seed):
            super().__init__()
            torch.manual_seed(seed)
            self.layer = torch.nn.Linear(4, 1).double()

        def training_step(self, batch, _):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            # Reduced over the ranks (mean): 0.5 with ranks 0 and 1.
            self.log("rank_mean", torch.tensor(float(self.global_rank), dtype=torch.float64),
                     on_step=False, on_epoch=True, sync_dist=True)
            self.log("loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=LR, momentum=MOMENTUM)


    hvd.init()
    R, P = hvd.rank(), hvd.size()
    start0 = Model(seed=100).layer.state_dict()      # rank 0's, which the broadcast spreads


    def reference(lr, accumulate):
        """One process over the global batch: the samples every rank sees for one optimizer
        step (B per rank and micro-batch, dealt each epoch by the shuffling
        DistributedSampler Lightning puts on a training loader)."""
        ref = torch.nn.Linear(4, 1).double()
        ref.load_state_dict(start0)
        opt = torch.optim.SGD(ref.parameters(), lr=lr, momentum=MOMENTUM)
        per_step = B * accumulate
        for epoch in range(EPOCHS):
            shards = []
            for r in range(P):
                s = DistributedSampler(TensorDataset(X, Y), num_replicas=P, rank=r, shuffle=True,
                                       seed=int(os.environ.get("PL_GLOBAL_SEED", 0)))
                s.set_epoch(epoch)
                shards.append(list(s))
            for step in range(N // (per_step * P)):
                idx = torch.tensor([i for shard in shards
                                    for i in shard[step * per_step:(step + 1) * per_step]])
                opt.zero_grad()
                torch.nn.functional.mse_loss(ref(X[idx]), Y[idx]).backward()
                opt.step()
        return ref


    def fit(out, accumulate=1, **strategy):
        model = Model(seed=100 + R)                  # different on every rank
        trainer = pl.Trainer(strategy=HorovodStrategy(**strategy), accelerator="cpu",
                             devices=1, max_epochs=EPOCHS, precision="64-true",
                             default_root_dir=out, logger=pl.loggers.CSVLogger(out),
                             enable_progress_bar=False, enable_model_summary=False,
                             log_every_n_steps=1, accumulate_grad_batches=accumulate)
        trainer.fit(model, DataLoader(TensorDataset(X, Y), batch_size=B))
        return model, trainer


    # Lightning 1.x's behaviour: the learning rate scaled by the number of ranks.
    model, trainer = fit(OUT)
    ref = reference(LR * P, 1)
    for name, p in model.layer.named_parameters():
        check_close(p.detach().numpy(), getattr(ref, name).detach().numpy(),
                    f"{name} after training", rtol=1e-12, atol=1e-12)
    # Two accumulated micro-batches per step, the learning rate as given.
    model2, _ = fit(os.path.join(OUT, "accumulate"), accumulate=2, scale_lr=False)
    ref2 = reference(LR, 2)
    for name, p in model2.layer.named_parameters():
        check_close(p.detach().numpy(), getattr(ref2, name).detach().numpy(),
                    f"{name} after training with accumulate_grad_batches=2, scale_lr=False",
                    rtol=1e-12, atol=1e-12)

    sampler = trainer.train_dataloader.sampler
    check(isinstance(sampler, DistributedSampler) and sampler.num_replicas == P
          and sampler.rank == R, "a DistributedSampler per rank", repr(sampler))
    check(isinstance(trainer.optimizers[0], thvd.optimizer._DistributedOptimizer),
          "the optimizer is a DistributedOptimizer", type(trainer.optimizers[0]).__mro__)
    check(abs(float(trainer.callback_metrics["rank_mean"]) - 0.5) < 1e-12,
          "sync_dist metric is the mean over ranks", trainer.callback_metrics)
    hvd.barrier()
    ckpts = glob.glob(os.path.join(OUT, "lightning_logs", "**", "*.ckpt"), recursive=True)
    metrics = glob.glob(os.path.join(OUT, "lightning_logs", "**", "metrics.csv"),
                        recursive=True)
    check(len(ckpts) == 1, "one checkpoint, written by rank 0", ckpts)
    check(len(metrics) == 1, "one metrics log, written by rank 0", metrics)
    finish()


if __name__ == "__main__":
    main()
