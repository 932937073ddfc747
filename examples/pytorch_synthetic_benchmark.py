"""Synthetic training benchmark: Horovod's pytorch_synthetic_benchmark.py on horovodlike.

Trains a model on random data and reports images per second per rank and in total.
Offline and CPU-only: the models are defined here in plain torch (no torchvision).

    horovodlikerun -np 2 python examples/pytorch_synthetic_benchmark.py
    mpirun -np 2 python examples/pytorch_synthetic_benchmark.py --model mlp
    python examples/pytorch_synthetic_benchmark.py --model resnet --image-size 64

The only change from a Horovod script is the import line.
"""
import argparse
import os
import time
import timeit

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

import horovodlike.torch as hvd


# ---------------------------------------------------------------- models

class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class SmallResNet(nn.Module):
    """A ResNet-like CNN: a stem and three stages of residual blocks."""

    def __init__(self, num_classes=10, widths=(8, 16, 32), blocks=1):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(widths[0]), nn.ReLU())
        layers, cin = [], widths[0]
        for i, w in enumerate(widths):
            for b in range(blocks):
                layers.append(BasicBlock(cin, w, 2 if (i > 0 and b == 0) else 1))
                cin = w
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class SimpleCNN(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
                                      nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1),
                                      nn.ReLU(), nn.AdaptiveAvgPool2d(4))
        self.fc = nn.Sequential(nn.Flatten(), nn.Linear(64 * 16, 128), nn.ReLU(),
                                nn.Linear(128, num_classes))

    def forward(self, x):
        return self.fc(self.features(x))


class MLP(nn.Module):
    def __init__(self, in_features, num_classes=10, hidden=512):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(in_features, hidden), nn.ReLU(),
                                 nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, num_classes))

    def forward(self, x):
        return self.net(x)


MODELS = {
    "resnet": lambda a: SmallResNet(a.num_classes),
    "resnet_deep": lambda a: SmallResNet(a.num_classes, widths=(16, 32, 64), blocks=2),
    "cnn": lambda a: SimpleCNN(a.num_classes),
    "mlp": lambda a: MLP(3 * a.image_size * a.image_size, a.num_classes),
}


# ---------------------------------------------------------------- benchmark

def parse_args():
    p = argparse.ArgumentParser(description="PyTorch synthetic benchmark (horovodlike)",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--fp16-allreduce", action="store_true", default=False,
                   help="use fp16 compression during allreduce")
    p.add_argument("--model", type=str, default="resnet", choices=sorted(MODELS),
                   help="model to benchmark")
    p.add_argument("--batch-size", type=int, default=32, help="input batch size")
    p.add_argument("--num-warmup-batches", type=int, default=10,
                   help="number of warm-up batches that don't count towards benchmark")
    p.add_argument("--num-batches-per-iter", type=int, default=10,
                   help="number of batches per benchmark iteration")
    p.add_argument("--num-iters", type=int, default=10, help="number of benchmark iterations")
    p.add_argument("--no-cuda", action="store_true", default=False,
                   help="accepted for compatibility; horovodlike runs on the CPU")
    p.add_argument("--use-adasum", action="store_true", default=False,
                   help="use adasum algorithm to do reduction (not implemented: errors)")
    p.add_argument("--image-size", type=int, default=32, help="height and width of the images")
    p.add_argument("--num-classes", type=int, default=10, help="number of classes")
    p.add_argument("--num-threads", type=int, default=1,
                   help="torch threads per rank (0: the cores divided by the local ranks)")
    # Not one of Horovod's flags: makes one rank a straggler, to see it in the timeline.
    p.add_argument("--slow-rank", type=int, default=-1,
                   help="this rank sleeps --slow-ms before every batch (timeline demo)")
    p.add_argument("--slow-ms", type=float, default=20.0)
    return p.parse_args()


def main():
    args = parse_args()
    hvd.init()

    # Pin each rank to its share of the cores so ranks on one host do not oversubscribe
    # (idle OpenMP threads spinning on a shared core slow every rank down).
    threads = args.num_threads or max(1, (os.cpu_count() or 1) // hvd.local_size())
    torch.set_num_threads(threads)
    torch.manual_seed(1234)

    model = MODELS[args.model](args)
    # By default, Adasum doesn't need scaling up learning rate.
    lr_scaler = hvd.size() if not args.use_adasum else 1
    optimizer = optim.SGD(model.parameters(), lr=0.01 * lr_scaler)

    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer,
                                         named_parameters=model.named_parameters(),
                                         compression=compression,
                                         op=hvd.Adasum if args.use_adasum else hvd.Average)

    # Horovod: broadcast parameters & optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    target = torch.randint(0, args.num_classes, (args.batch_size,))

    def benchmark_step():
        if hvd.rank() == args.slow_rank:
            time.sleep(args.slow_ms / 1000)
        optimizer.zero_grad()
        output = model(data)
        loss = F.cross_entropy(output, target)
        loss.backward()
        optimizer.step()

    def log(s, nl=True):
        if hvd.rank() != 0:
            return
        print(s, end="\n" if nl else "", flush=True)

    device = "CPU"
    log(f"Model: {args.model}")
    log(f"Batch size: {args.batch_size}")
    log(f"Number of {device}s: {hvd.size()} ({threads} thread(s) each)")

    log("Running warmup...")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)

    log("Running benchmark...")
    img_secs = []
    for x in range(args.num_iters):
        t = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / t
        log(f"Iter #{x}: {img_sec:.1f} img/sec per {device}")
        img_secs.append(img_sec)

    img_sec_mean = np.mean(img_secs)
    img_sec_conf = 1.96 * np.std(img_secs)
    # Every rank's own rate, then the job's total (the sum over ranks).
    print(f"Rank {hvd.rank()}: img/sec per {device}: {img_sec_mean:.1f} +-{img_sec_conf:.1f}",
          flush=True)
    total = hvd.allreduce(torch.tensor([img_sec_mean], dtype=torch.float64), op=hvd.Sum,
                          name="benchmark.total")
    log(f"Img/sec per {device}: {img_sec_mean:.1f} +-{img_sec_conf:.1f}")
    log(f"Total img/sec on {hvd.size()} {device}(s): {float(total[0]):.1f} "
        f"+-{hvd.size() * img_sec_conf:.1f}")


if __name__ == "__main__":
    main()
