"""Synthetic-model training throughput for one implementation, in its own processes.

    python bench/train_worker.py --impl ours|ddp [--model resnet] [--batch-size 32]

ours: horovodlike.torch.DistributedOptimizer (hooks start each gradient's allreduce
during backward); ddp: torch DistributedDataParallel over gloo. Both train the same
plain-torch model from examples/pytorch_synthetic_benchmark.py on synthetic data with
one intra-op thread per rank. Rank 0 prints one BENCH JSON line with img/s samples
(total over ranks).
"""
import argparse
import importlib.util
import json
import os
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location(
    "pytorch_synthetic_benchmark",
    os.path.join(os.path.dirname(HERE), "examples", "pytorch_synthetic_benchmark.py"))
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)


def build(impl, model):
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if impl == "ours":
        import horovodlike.torch as hvd
        hvd.init()
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        return model, opt, hvd.rank(), hvd.size()
    import torch.distributed as dist
    dist.init_process_group("gloo", rank=int(os.environ["HOROVOD_RANK"]),
                            world_size=int(os.environ["HOROVOD_SIZE"]))
    model = torch.nn.parallel.DistributedDataParallel(model)
    return model, opt, dist.get_rank(), dist.get_world_size()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl", required=True, choices=["ours", "ddp"])
    ap.add_argument("--model", default="resnet")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--batches-per-iter", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = example.MODELS[args.model](argparse.Namespace(num_classes=10, image_size=32))
    model, opt, rank, size = build(args.impl, model)
    data = torch.randn(args.batch_size, 3, 32, 32)
    target = torch.randint(0, 10, (args.batch_size,))

    def batch():
        opt.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        opt.step()

    for _ in range(3):
        batch()
    samples = []
    for _ in range(args.iters):
        t = time.perf_counter()
        for _ in range(args.batches_per_iter):
            batch()
        samples.append(args.batch_size * args.batches_per_iter * size / (time.perf_counter() - t))
    if rank == 0:
        print("BENCH " + json.dumps({"impl": args.impl, "case": "train", "np": size,
                                     "results": {args.model: samples}}), flush=True)


if __name__ == "__main__":
    main()
