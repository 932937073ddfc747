"""Synthetic-model training throughput for one implementation, in its own processes.

    python bench/train_worker.py --impl ours|ddp [--model resnet] [--batch-size 32]
        [--compression none|fp16|bf16|powersgd] [--powersgd-rank 4] [--start-iter 2]

ours: horovodlike.torch.DistributedOptimizer (hooks start each gradient's allreduce
during backward), with `compression` as its compression= argument; ddp: torch
DistributedDataParallel over gloo, plain or with torch's PowerSGD comm hook
(`--compression powersgd`; fp16/bf16 are ours only). Both train the same plain-torch
model from examples/pytorch_synthetic_benchmark.py on synthetic data with one intra-op
thread per rank. PowerSGD on either side uses the same rank and the same warm-up
(--start-iter uncompressed steps; torch needs at least 2), and the untimed warm-up steps
run past it, so every timed step is compressed. Rank 0 prints one BENCH JSON line with
img/s samples (total over ranks) and the number of steps run. With --link DEV (the
fake nodes' link, bench/netns.py), it also reports the bytes each node sent on DEV during
the timed steps (read by the node's local rank 0 from /sys), per step. It also reports
every rank's CPU time per timed step (its process: compute, engine or gloo threads).
"""
import argparse
import importlib.util
import json
import os
import resource
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location(
    "pytorch_synthetic_benchmark",
    os.path.join(os.path.dirname(HERE), "examples", "pytorch_synthetic_benchmark.py"))
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)


def build(args, model):
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if args.impl == "ours":
        import horovodlike.torch as hvd
        hvd.init()
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        compression = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16,
                       "bf16": hvd.Compression.bf16}.get(args.compression)
        if args.compression == "powersgd":
            compression = hvd.PowerSGD(rank=args.powersgd_rank, start_iter=args.start_iter)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                       compression=compression)
        return model, opt, hvd.rank(), hvd.size(), hvd.allgather_object
    if args.compression in ("fp16", "bf16"):
        raise SystemExit(f"train_worker: --compression {args.compression} is measured for "
                         f"--impl ours only")
    import torch.distributed as dist
    dist.init_process_group("gloo", rank=int(os.environ["HOROVOD_RANK"]),
                            world_size=int(os.environ["HOROVOD_SIZE"]))
    if args.compression != "powersgd":
        model = torch.nn.parallel.DistributedDataParallel(model)
    else:
        # One bucket: torch's PowerSGD hook issues each bucket's second and third
        # allreduce from callbacks of the first, which over gloo on CPU run in whatever
        # order the buckets finish on each rank; with two buckets the ranks' collectives
        # then mismatch and gloo aborts ("Received data size doesn't match expected size",
        # torch 2.13). An explicit bucket_cap_mb also sizes the first bucket (torch's
        # default caps it at 1 MiB), so a model under 25 MiB is one bucket.
        model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=25)
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
        state = psgd.PowerSGDState(process_group=None,
                                   matrix_approximation_rank=args.powersgd_rank,
                                   start_powerSGD_iter=args.start_iter)
        model.register_comm_hook(state, psgd.powerSGD_hook)

    def gather(obj):
        out = [None] * dist.get_world_size()
        dist.all_gather_object(out, obj)
        return out
    return model, opt, dist.get_rank(), dist.get_world_size(), gather


def cpu_seconds():
    """User + system CPU seconds of this process so far, every thread included."""
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def link_sent(dev):
    """Bytes sent on this node's `dev` so far, read by the node's local rank 0 (None on
    the others and without --link)."""
    if not dev or os.environ.get("HOROVOD_LOCAL_RANK") != "0":
        return None
    with open(f"/sys/class/net/{dev}/statistics/tx_bytes") as f:
        return int(f.read())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl", required=True, choices=["ours", "ddp"])
    ap.add_argument("--model", default="resnet")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--batches-per-iter", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--compression", default="none", choices=["none", "fp16", "bf16", "powersgd"])
    ap.add_argument("--powersgd-rank", type=int, default=4)
    ap.add_argument("--start-iter", type=int, default=2)
    ap.add_argument("--link", help="network device whose sent bytes to report")
    args = ap.parse_args()
    if args.compression == "powersgd" and args.warmup <= args.start_iter:
        raise SystemExit(f"train_worker: --warmup ({args.warmup}) must exceed --start-iter "
                         f"({args.start_iter}) so that every timed step is compressed")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = example.MODELS[args.model](argparse.Namespace(num_classes=10, image_size=32))
    model, opt, rank, size, gather = build(args, model)
    data = torch.randn(args.batch_size, 3, 32, 32)
    target = torch.randint(0, 10, (args.batch_size,))

    def batch():
        opt.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        opt.step()

    for _ in range(args.warmup):
        batch()
    samples = []
    sent = link_sent(args.link)
    cpu = cpu_seconds()
    for _ in range(args.iters):
        t = time.perf_counter()
        for _ in range(args.batches_per_iter):
            batch()
        samples.append(args.batch_size * args.batches_per_iter * size / (time.perf_counter() - t))
    timed = args.iters * args.batches_per_iter
    cpu = (cpu_seconds() - cpu) / timed
    if sent is not None:
        sent = (link_sent(args.link) - sent) / timed
    gathered = gather((sent, cpu))
    per_node = [b for b, _ in gathered if b is not None]
    if rank == 0:
        print("BENCH " + json.dumps({"impl": args.impl, "case": "train", "np": size,
                                     "steps": timed, "link_bytes_per_step": per_node,
                                     "cpu_s_per_step": [c for _, c in gathered],
                                     "results": {args.model: samples}}), flush=True)


if __name__ == "__main__":
    main()
