"""Data-parallel training of a small CNN on scikit-learn's 8x8 digits, following the
steps of Horovod's PyTorch tutorial. Offline: the data ships with scikit-learn.

    horovodlikerun -np 2 python examples/pytorch_digits.py
    mpirun -np 4 python examples/pytorch_digits.py
    python examples/pytorch_digits.py

The only change from a Horovod script is the import line.
"""
import argparse
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import horovodlike.torch as hvd


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)     # 8x8 -> 8x8
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)    # 4x4 -> 4x4
        self.fc1 = nn.Linear(32 * 2 * 2, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(x)


def parse_args():
    p = argparse.ArgumentParser(description="PyTorch digits example (horovodlike)",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--batch-size", type=int, default=32, help="input batch size per rank")
    p.add_argument("--epochs", type=int, default=20, help="number of epochs to train")
    p.add_argument("--lr", type=float, default=0.03, help="learning rate for one rank")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    p.add_argument("--seed", type=int, default=42, help="random seed")
    p.add_argument("--num-threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--fp16-allreduce", action="store_true", default=False,
                   help="use fp16 compression during allreduce")
    p.add_argument("--powersgd-rank", type=int, default=0,
                   help="compress gradients with PowerSGD at this rank (0: off; see "
                        "docs/compression.md)")
    p.add_argument("--powersgd-start-iter", type=int, default=50,
                   help="steps reduced uncompressed before PowerSGD starts")
    p.add_argument("--checkpoint-dir", default="checkpoints",
                   help="where rank 0 saves a checkpoint after each epoch")
    p.add_argument("--resume", action="store_true",
                   help="start from the latest checkpoint in --checkpoint-dir")
    return p.parse_args()


def datasets():
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None, :, :]   # N x 1 x 8 x 8
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25,
                                                        random_state=0, stratify=y)
    return (TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train)),
            TensorDataset(torch.from_numpy(x_test), torch.from_numpy(y_test)))


def metric_average(value, name):
    """Step 8: average a metric over the ranks."""
    return hvd.allreduce(torch.tensor(value, dtype=torch.float64), name=name).item()


def checkpoint_path(directory, epoch):
    return os.path.join(directory, f"checkpoint-{epoch}.pt")


def main():
    args = parse_args()

    # Step 1: initialize horovodlike.
    hvd.init()

    # Step 2: pin this process to its share of the machine (one GPU per process in
    # Horovod); on the CPU, one thread per rank, as in Horovod's CPU examples: ranks on a
    # host then never fight over cores.
    torch.set_num_threads(args.num_threads)
    torch.manual_seed(args.seed)

    # Step 3: each rank trains on its own shard of the data.
    train_set, test_set = datasets()
    train_sampler = DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank(),
                                       shuffle=True, seed=args.seed)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    test_sampler = DistributedSampler(test_set, num_replicas=hvd.size(), rank=hvd.rank(),
                                      shuffle=False)
    test_loader = DataLoader(test_set, batch_size=256, sampler=test_sampler)

    model = Net()

    # Step 4: scale the learning rate by the number of ranks (the effective batch grows).
    optimizer = optim.SGD(model.parameters(), lr=args.lr * hvd.size(),
                          momentum=args.momentum)

    # Step 5: wrap the optimizer; gradients are averaged over the ranks.
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    if args.powersgd_rank:
        compression = hvd.PowerSGD(rank=args.powersgd_rank, start_iter=args.powersgd_start_iter)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)

    # Resuming: rank 0 finds the latest checkpoint and tells everyone which epoch it is.
    resume_from_epoch = 0
    if args.resume and hvd.rank() == 0:
        for epoch in range(args.epochs, 0, -1):
            if os.path.exists(checkpoint_path(args.checkpoint_dir, epoch)):
                resume_from_epoch = epoch
                break
    resume_from_epoch = hvd.broadcast_object(resume_from_epoch, root_rank=0,
                                             name="resume_from_epoch")
    if resume_from_epoch > 0 and hvd.rank() == 0:
        state = torch.load(checkpoint_path(args.checkpoint_dir, resume_from_epoch))
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])

    # Step 6: start every rank from rank 0's weights and optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    for epoch in range(resume_from_epoch, args.epochs):
        model.train()
        train_sampler.set_epoch(epoch)
        total_loss, batches = 0.0, 0
        for data, target in train_loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(data), target)
            loss.backward()
            optimizer.step()
            total_loss += loss.item()
            batches += 1
        train_loss = metric_average(total_loss / max(batches, 1), "train_loss")

        # Step 7: only rank 0 writes checkpoints, so ranks do not overwrite each other.
        if hvd.rank() == 0:
            os.makedirs(args.checkpoint_dir, exist_ok=True)
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()},
                       checkpoint_path(args.checkpoint_dir, epoch + 1))
            print(f"epoch {epoch + 1}: train loss {train_loss:.4f}", flush=True)

    # Step 8: evaluate on each rank's shard of the test set and average the metrics.
    model.eval()
    correct, seen, test_loss = 0, 0, 0.0
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            test_loss += F.cross_entropy(output, target, reduction="sum").item()
            correct += (output.argmax(dim=1) == target).sum().item()
            seen += len(target)
    test_loss = metric_average(test_loss / seen, "avg_loss")
    accuracy = metric_average(correct / seen, "avg_accuracy")
    same = hvd.allreduce(torch.cat([p.detach().reshape(-1) for p in model.parameters()]),
                         op=hvd.Max, name="weights.max")
    same = bool(torch.equal(same, torch.cat([p.detach().reshape(-1)
                                             for p in model.parameters()])))
    identical = hvd.allreduce(torch.tensor([int(same)]), op=hvd.Min, name="identical").item()
    if hvd.rank() == 0:
        print(f"ranks: {hvd.size()}; test loss {test_loss:.4f}; "
              f"test accuracy {100 * accuracy:.2f}%", flush=True)
        print(f"weights identical on every rank: {bool(identical)}", flush=True)
        print(f"RESULT accuracy={accuracy:.4f} identical={int(identical)}", flush=True)


if __name__ == "__main__":
    main()
