"""The GPU benchmark: CUDA tensors through horovodlike's staging against torch.distributed
over gloo with the same CUDA tensors, every implementation in its own processes.

    python bench/gpu.py                          # 2 ranks sharing the GPU(s)
    python bench/gpu.py --np 2 --out results.json

Cases:
  allreduce   one float32 CUDA tensor of 1, 4, 16, 64 and 256 MiB, Sum: hvd.allreduce
              vs dist.all_reduce (gloo copies CUDA tensors to the host too); the time
              includes torch.cuda.synchronize(), so the result is on the GPU.
  resnet      one training step (forward, backward, SGD step) of a ResNet-18-sized
              network (plain torch, 11M parameters, batch 32 of 3x64x64 images) on the
              GPU: DistributedOptimizer vs DistributedDataParallel over gloo.

Ranks share the GPUs (rank i uses GPU i % count). Rank 0 of each job prints one BENCH
JSON line; the driver prints a table of medians and writes every sample as JSON.
Without CUDA it says so and exits 0 (device_check.sh runs it everywhere).
"""
import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SIZES_MIB = [1, 4, 16, 64, 256]


# ------------------------------------------------------------------ the worker

def _setup(impl, device_type):
    import torch
    torch.set_num_threads(1)
    if impl == "ours":
        import horovodlike.torch as hvd
        hvd.init()
        rank, size, local = hvd.rank(), hvd.size(), hvd.local_rank()
    else:
        import torch.distributed as dist
        rank, size = int(os.environ["HOROVOD_RANK"]), int(os.environ["HOROVOD_SIZE"])
        local = int(os.environ["HOROVOD_LOCAL_RANK"])
        dist.init_process_group("gloo", rank=rank, world_size=size)
    if device_type == "cpu":
        return rank, size, torch.device("cpu")
    torch.cuda.set_device(local % torch.cuda.device_count())
    return rank, size, torch.device("cuda", torch.cuda.current_device())


def _barrier(impl):
    if impl == "ours":
        import horovodlike.torch as hvd
        hvd.barrier()
    else:
        import torch.distributed as dist
        dist.barrier()


def _timed(impl, fn, iters, warmup=2):
    import torch
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    samples = []
    for _ in range(iters):
        _barrier(impl)
        t = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - t)
    return samples


def _allreduce_case(impl, device, sizes_mib, iters):
    import torch
    results = {}
    for mib in sizes_mib:
        x = torch.ones((mib << 20) // 4, device=device)
        if impl == "ours":
            import horovodlike.torch as hvd
            fn = lambda: hvd.allreduce_(x, op=hvd.Sum, name="bench")   # noqa: E731
        else:
            import torch.distributed as dist
            fn = lambda: dist.all_reduce(x)                             # noqa: E731
        results[f"{mib} MiB"] = _timed(impl, fn, iters if mib < 64 else max(3, iters // 2))
    return results


def _resnet_case(impl, device, iters):
    import torch
    import torch.nn.functional as F
    spec = importlib.util.spec_from_file_location(
        "pytorch_synthetic_benchmark", os.path.join(ROOT, "examples",
                                                    "pytorch_synthetic_benchmark.py"))
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    torch.manual_seed(0)
    model = example.SmallResNet(10, widths=(64, 128, 256, 512), blocks=2).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if impl == "ours":
        import horovodlike.torch as hvd
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    else:
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=None if device.type == "cpu" else [device.index])
    data = torch.randn(32, 3, 64, 64, device=device)
    target = torch.randint(0, 10, (32,), device=device)

    def step():
        opt.zero_grad()
        F.cross_entropy(model(data), target).backward()
        opt.step()
    return {"resnet step": _timed(impl, step, iters)}


def worker(args):
    rank, size, device = _setup(args.impl, args.device)
    if args.case == "allreduce":
        results = _allreduce_case(args.impl, device, [int(s) for s in args.sizes.split(",")],
                                  args.iters)
    else:
        results = _resnet_case(args.impl, device, args.iters)
    if rank == 0:
        import torch
        name = "CPU" if device.type == "cpu" else torch.cuda.get_device_name(device)
        print("BENCH " + json.dumps({"impl": args.impl, "case": args.case, "np": size,
                                     "device": name,
                                     "results": results}), flush=True)


# ------------------------------------------------------------------ the driver

def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launcher():
    exe = shutil.which("horovodlikerun")
    return [exe] if exe else [sys.executable, "-m", "horovodlike.runner"]


def run_job(impl, case, np_, extra, timeout, device):
    # On the CPU (--device cpu, a check of this script) ours is forced through staging.
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
               HOROVODLIKE_EXPERIMENTAL_CUDA="1", OMP_NUM_THREADS="1",
               HOROVODLIKE_FORCE_STAGING="1" if device == "cpu" else "0",
               PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    argv = [*_launcher(), "-np", str(np_), sys.executable, os.path.abspath(__file__),
            "--worker", impl, "--case", case, "--device", device, *extra]
    t = time.monotonic()
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    sys.stderr.write(f"{impl} {case} np={np_}: exit {res.returncode} "
                     f"in {time.monotonic() - t:.1f}s\n")
    for line in res.stdout.splitlines():
        if "BENCH " in line:
            return json.loads(line.split("BENCH ", 1)[1])
    raise RuntimeError(f"{impl} {case} at {np_} ranks failed ({res.returncode}):\n"
                       f"{res.stdout[-3000:]}\n{res.stderr[-3000:]}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--sizes", default=",".join(map(str, SIZES_MIB)), help="MiB, comma-separated")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--cases", default="allreduce,resnet")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "gpu.json"))
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cpu: run the same jobs on CPU tensors, to check this script "
                         "where there is no GPU (use small --sizes)")
    ap.add_argument("--worker", choices=["ours", "gloo"], dest="impl", help=argparse.SUPPRESS)
    ap.add_argument("--case", choices=["allreduce", "resnet"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.impl:
        return worker(args)
    import torch
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench/gpu.py: no CUDA device here (torch.cuda.is_available() is False); "
              "nothing to measure")
        return 0
    runs, failures = [], []
    for case in args.cases.split(","):
        extra = ["--sizes", args.sizes, "--iters", str(args.iters)]
        for impl in ("ours", "gloo"):
            try:
                runs.append(run_job(impl, case, args.np, extra, args.timeout, args.device))
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                failures.append(f"{impl} {case}: {e}")
    device = next((r["device"] for r in runs), "?")
    gpus = torch.cuda.device_count() if args.device == "cuda" else 0
    print(f"## {device}, {args.np} ranks sharing {gpus} GPU(s)\n")
    print("| case | horovodlike (staged) | torch.distributed gloo | ours / gloo |")
    print("|---|---|---|---|")
    med = {(r["impl"], k): statistics.median(v) for r in runs for k, v in r["results"].items()}
    for label in dict.fromkeys(k for r in runs for k in r["results"]):
        ours, gloo = med.get(("ours", label)), med.get(("gloo", label))
        ratio = f"{ours / gloo:.2f}" if ours and gloo else "-"
        print(f"| {label} | {_ms(ours)} | {_ms(gloo)} | {ratio} |")
    for f in failures:
        print(f"FAILED {f}")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"command": " ".join([sys.executable] + sys.argv), "runs": runs,
                   "failures": failures}, f, indent=1)
    print(f"\nraw samples: {args.out}")
    return 1 if failures else 0


def _ms(seconds):
    return "-" if seconds is None else f"{seconds * 1e3:.2f} ms"


if __name__ == "__main__":
    sys.exit(main())
