"""Elastic training of a small CNN on scikit-learn's digits (Horovod's
pytorch_mnist_elastic.py, offline). Ranks may be killed, hosts added or removed while it
trains; the job goes on from the last commit.

    printf 'node1:1\nnode2:1\nnode3:1\n' > hosts.txt       # what discovery prints
    horovodlikerun -np 3 --min-np 2 --max-np 4 \\
        --host-discovery-script examples/elastic/discover_hosts.sh \\
        --ssh-command "sh -c {command}" python examples/elastic/pytorch_digits_elastic.py

(node1..3 are fake hosts on this machine: --ssh-command runs each "remotely" with sh.)
Every worker prints its pid: `kill -9` one, or add `node4:1` to hosts.txt, and watch
the job re-form. Every rank prints the same parameter digest at the end.
"""
import argparse
import hashlib
import os
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import DataLoader, TensorDataset

import horovodlike.torch as hvd


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 2 * 2, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def parse_args():
    p = argparse.ArgumentParser(description="elastic PyTorch digits example (horovodlike)",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--batch-size", type=int, default=32, help="input batch size per rank")
    p.add_argument("--epochs", type=int, default=10, help="number of epochs to train")
    p.add_argument("--lr", type=float, default=0.02, help="learning rate for one rank")
    p.add_argument("--batches-per-commit", type=int, default=5,
                   help="commit the state every this many batches")
    p.add_argument("--batches-per-host-check", type=int, default=1,
                   help="check for added or removed hosts every this many batches")
    p.add_argument("--batch-sleep", type=float, default=0.0,
                   help="seconds to pause after each batch (slow it down to watch)")
    return p.parse_args()


def main():
    args = parse_args()
    torch.set_num_threads(1)
    hvd.init()
    print(f"worker on {os.environ.get('HOROVOD_HOSTNAME')}: pid {os.getpid()}, "
          f"rank {hvd.rank()} of {hvd.size()}", flush=True)

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None, :, :]
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0,
                                                        stratify=y)
    train_set = TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train))
    x_test, y_test = torch.from_numpy(x_test), torch.from_numpy(y_test)

    model = Net()
    # Horovod: scale the learning rate by the number of ranks; rescaled at every reset.
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    # The sampler re-partitions the samples an epoch has not processed yet after a reset.
    sampler = hvd.elastic.ElasticSampler(train_set, shuffle=True, seed=42)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, args.epochs):
            model.train()
            for i, (data, target) in enumerate(loader):
                optimizer.zero_grad()
                loss = F.cross_entropy(model(data), target)
                loss.backward()
                optimizer.step()
                state.batch += 1
                sampler.record_batch(i, args.batch_size)
                if state.batch % args.batches_per_commit == 0:
                    state.commit()            # save in memory; may raise HostsUpdatedInterrupt
                elif state.batch % args.batches_per_host_check == 0:
                    state.check_host_updates()
                if args.batch_sleep:
                    time.sleep(args.batch_sleep)
            model.eval()
            with torch.no_grad():
                acc = (model(x_test).argmax(1) == y_test).float().mean().item()
            if hvd.rank() == 0:
                print(f"epoch {state.epoch}: loss {loss.item():.4f}, test accuracy "
                      f"{acc:.4f}, {hvd.size()} ranks", flush=True)
            state.batch = 0
            sampler.set_epoch(state.epoch + 1)
            state.commit()

    def on_state_reset():
        for group in optimizer.param_groups:
            group["lr"] = args.lr * hvd.size()

    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)
    state.register_reset_callbacks([on_state_reset])
    train(state)

    digest = hashlib.sha256(b"".join(t.numpy().tobytes()
                                     for t in model.state_dict().values())).hexdigest()
    print(f"done: rank {hvd.rank()} of {hvd.size()}, parameters sha256 {digest[:16]}",
          flush=True)


if __name__ == "__main__":
    main()
