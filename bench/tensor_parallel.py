"""Tensor parallelism, measured: the training step of one GPT-style block
(horovodlike.torch.parallel.GPTBlock, float32, AdamW) at tp = 2 on one node, in

  hvd      horovodlike: tensor_parallel(GPT_BLOCK_PLAN) over a Topology(tp=2) set,
           2 ranks under horovodlikerun (shared-memory allreduces)
  torch    torch's parallelize_module on a 2-rank DeviceMesh over gloo, ColwiseParallel
           on qkv and fc1, RowwiseParallel on proj and fc2 (DTensor; local outputs, the
           attention's head count halved, q/k/v rows ordered so each rank's slice holds
           whole heads of q, k and v, so both compute the same model)
  single   the unsharded block in one process

each run in its own processes, one torch thread per process, alternating the order every
round. A step is forward, MSE loss, backward and AdamW. Printed per mode: the median of
the per-round median step times and their spread (min..max over rounds). The hvd run also
records a timeline over 10 more steps; the share of time in the tensor-parallel
allreduces is the union of [enqueue, collective end] of every op on rank 0's lanes over
the timed wall time (docs/timeline.md), which is the floor the allreduces put under a step.

    python bench/tensor_parallel.py --rounds 5 --steps 30 --d 512 --seq 256 --batch 4
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODES = ["hvd", "torch", "single"]
LABELS = {"hvd": "horovodlike tp=2 (shm)", "torch": "torch parallelize_module tp=2 (gloo)",
          "single": "unsharded, 1 process"}


# ------------------------------------------------------------------ one process

def _block(args):
    import torch
    from horovodlike.torch.parallel import GPTBlock
    torch.manual_seed(0)
    return GPTBlock(args.d, args.heads)


def _time_steps(model, args, rank_seed):
    import torch
    import torch.nn.functional as F
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(rank_seed)
    x = torch.randn(args.batch, args.seq, args.d, generator=g)
    y = torch.randn(args.batch, args.seq, args.d, generator=g)
    times, opt_times = [], []
    for step in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        t1 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
        opt_times.append(time.perf_counter() - t1)
    return {"times": times[args.warmup:], "opt_times": opt_times[args.warmup:]}


def _allreduce_share(path, wall_us):
    """Union of [enqueue, end of collective] over rank 0's ops, / wall time."""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    start, end = {}, {}
    for e in events:
        if e.get("ph") != "X":
            continue
        name, args = e["name"], e.get("args", {})
        if name.startswith("NEGOTIATE_"):
            start.setdefault(args.get("tensor"), []).append(e["ts"])
        elif e.get("tid") == 4 and name in ("ALLREDUCE", "ALLGATHER"):
            for t in args.get("tensors", []):
                end.setdefault(t, []).append(e["ts"] + e["dur"])
    spans = sorted((s, e) for t in start for s, e in zip(start[t], end.get(t, [])))
    busy, cur_s, cur_e = 0.0, None, None
    for s, e in spans:
        if cur_e is None or s > cur_e:
            busy += 0 if cur_e is None else cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        busy += cur_e - cur_s
    return busy / wall_us


def worker_hvd(args):
    import torch
    import horovodlike.torch as hvd
    torch.set_num_threads(1)
    hvd.init()
    topo = hvd.parallel.Topology(tp=hvd.size())
    model = hvd.parallel.tensor_parallel(_block(args), hvd.parallel.GPT_BLOCK_PLAN,
                                         process_set=topo.tp_set)
    res = _time_steps(model, args, 0)
    # The timeline is recorded over further steps, so that writing it does not slow the
    # timed ones: the share of the step spent in the tensor-parallel allreduces.
    tl = os.path.join(args.tmp, "tl.json")
    hvd.start_timeline(tl)
    t0 = time.perf_counter()
    _time_steps(model, argparse.Namespace(**dict(vars(args), warmup=0,
                                                 steps=min(args.steps, 10))), 0)
    wall_us = (time.perf_counter() - t0) * 1e6
    hvd.stop_timeline()
    if hvd.rank() == 0:
        share = _allreduce_share(os.path.join(args.tmp, "tl.rank0.json"), wall_us)
        print(json.dumps(dict(res, allreduce_share=share)), flush=True)
    hvd.shutdown()


def worker_torch(args):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    t = dist.get_world_size()
    model = _block(args)
    with torch.no_grad():       # [q; k; v] -> [q_0; k_0; v_0; q_1; ...]: whole heads per rank
        for p in (model.attn.qkv.weight, model.attn.qkv.bias):
            p.copy_(p.unflatten(0, (3, t, -1)).transpose(0, 1).flatten(0, 2))
    model.attn.n_head //= t
    mesh = init_device_mesh("cpu", (t,))
    parallelize_module(model, mesh, {"attn.qkv": ColwiseParallel(),
                                     "attn.proj": RowwiseParallel(),
                                     "mlp.fc1": ColwiseParallel(),
                                     "mlp.fc2": RowwiseParallel()})
    res = _time_steps(model, args, 0)
    if dist.get_rank() == 0:
        print(json.dumps(res), flush=True)
    dist.destroy_process_group()


def worker_single(args):
    import torch
    torch.set_num_threads(1)
    print(json.dumps(_time_steps(_block(args), args, 0)), flush=True)


# ------------------------------------------------------------------ driver

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _result(out):
    for line in out.splitlines():
        line = line.split(">:", 1)[-1].strip()
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError("no result line in:\n" + out[-3000:])


def run_mode(mode, args):
    me = [sys.executable, os.path.abspath(__file__), "--worker", mode] + \
        [f"--{k}={getattr(args, k)}" for k in ("d", "heads", "seq", "batch", "steps",
                                                "warmup")]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with tempfile.TemporaryDirectory() as tmp:
        if mode == "hvd":
            cmd = ["horovodlikerun", "-np", str(args.np)] + me + [f"--tmp={tmp}"]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                 timeout=args.timeout)
            text = out.stdout
        elif mode == "torch":
            port = _free_port()
            procs = [subprocess.Popen(me, env=dict(env, RANK=str(r), WORLD_SIZE=str(args.np),
                                                   MASTER_ADDR="127.0.0.1",
                                                   MASTER_PORT=str(port)),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True) for r in range(args.np)]
            text = ""
            for p in procs:
                o, e = p.communicate(timeout=args.timeout)
                text += o
                if p.returncode:
                    raise RuntimeError(f"torch rank failed:\n{e[-3000:]}")
        else:
            out = subprocess.run(me, env=env, capture_output=True, text=True,
                                 timeout=args.timeout)
            text = out.stdout
        return _result(text if mode != "hvd" or out.returncode == 0 else
                       text + out.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", choices=MODES)
    ap.add_argument("--tmp", default="")
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--d", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--modes", default=",".join(MODES))
    args = ap.parse_args()
    if args.worker:
        {"hvd": worker_hvd, "torch": worker_torch, "single": worker_single}[args.worker](args)
        return
    modes = args.modes.split(",")
    per_round = {m: [] for m in modes}
    opt_round = {m: [] for m in modes}
    shares = []
    for r in range(args.rounds):
        for m in (modes if r % 2 == 0 else modes[::-1]):
            res = run_mode(m, args)
            per_round[m].append(statistics.median(res["times"]) * 1e3)
            opt_round[m].append(statistics.median(res["opt_times"]) * 1e3)
            if "allreduce_share" in res:
                shares.append(res["allreduce_share"])
            print(f"round {r} {m}: {per_round[m][-1]:.2f} ms", file=sys.stderr, flush=True)
    print(f"GPT block d={args.d} heads={args.heads} b={args.batch} s={args.seq}, tp={args.np}, "
          f"{args.rounds} rounds × {args.steps} steps, median (min..max) step ms, "
          f"of which the optimizer step:")
    med = {m: statistics.median(v) for m, v in per_round.items()}
    for m in modes:
        v = per_round[m]
        print(f"  {LABELS[m]:40s} {med[m]:8.2f}  ({min(v):.2f}..{max(v):.2f})  "
              f"optimizer {statistics.median(opt_round[m]):.2f}")
    if "hvd" in med and "torch" in med:
        paired = [h / t for h, t in zip(per_round["hvd"], per_round["torch"])]
        print(f"  horovodlike / torch TP: {med['hvd'] / med['torch']:.2f}x of the medians; "
              f"per round {statistics.median(paired):.2f}x "
              f"({min(paired):.2f}..{max(paired):.2f})")
    if shares:
        print(f"  timeline share of the hvd step in the tp allreduces (rank 0): "
              f"{100 * statistics.median(shares):.1f}% "
              f"({100 * min(shares):.1f}..{100 * max(shares):.1f})")


if __name__ == "__main__":
    main()
