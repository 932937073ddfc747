"""Sharded data parallelism, measured: per-rank optimizer-state bytes, peak RSS and step
time of the transformer from examples/pytorch_sharded_transformer.py (23M parameters,
AdamW) under

  do        hvd.DistributedOptimizer
  zero1     hvd.ShardedDistributedOptimizer stage 1, shard_size = all ranks
  zero2     ... stage 2, shard_size = all ranks
  hybrid    ... stage 2, shard_size = ranks per node (MiCS)
  torchzero torch's ZeroRedundancyOptimizer with DistributedDataParallel over gloo

in ONE invocation, each in its own processes, alternating the order every round. With
--netns it also runs zero2 against hybrid (and do) on two fake nodes of np/2 ranks joined
by a tc-shaped link (bench/netns.py; needs root and iproute2).

    python bench/sharded.py --np 4 --rounds 2 [--netns] [--plot docs/sharded_bench.png]
"""
import argparse
import importlib.util
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
IMPLS = ["do", "zero1", "zero2", "hybrid", "torchzero"]
LABELS = {"do": "DistributedOptimizer", "zero1": "Sharded stage 1 (S=n)",
          "zero2": "Sharded stage 2 (S=n)", "hybrid": "Sharded stage 2 (S=local)",
          "torchzero": "torch ZeroRedundancyOptimizer (gloo)"}


def load_example():
    spec = importlib.util.spec_from_file_location(
        "pytorch_sharded_transformer",
        os.path.join(ROOT, "examples", "pytorch_sharded_transformer.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ------------------------------------------------------------------ one job

def worker(args):
    import torch
    import torch.nn.functional as F
    ex = load_example()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = ex.TransformerLM(seq=args.seq)
    impl = args.worker
    if impl == "torchzero":
        import torch.distributed as dist
        from torch.distributed.optim import ZeroRedundancyOptimizer
        dist.init_process_group("gloo", rank=int(os.environ["HOROVOD_RANK"]),
                                world_size=int(os.environ["HOROVOD_SIZE"]))
        rank, size = dist.get_rank(), dist.get_world_size()
        model = torch.nn.parallel.DistributedDataParallel(model)
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,
                                      lr=1e-4)
        state = lambda: ex.tensor_bytes(v for s in opt.optim.state.values()  # noqa: E731
                                        for v in s.values())

        def gather(vals):
            t = torch.tensor(vals, dtype=torch.float64)
            out = [torch.zeros_like(t) for _ in range(size)]
            dist.all_gather(out, t)
            return [o.tolist() for o in out]
    else:
        import horovodlike.torch as hvd
        hvd.init(process_sets="dynamic")
        rank, size = hvd.rank(), hvd.size()
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        if impl == "do":
            opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        else:
            opt = hvd.ShardedDistributedOptimizer(
                opt, named_parameters=model.named_parameters(),
                stage=1 if impl == "zero1" else 2,
                shard_size=hvd.local_size() if impl == "hybrid" else size)
        state = lambda: ex.state_bytes(opt)  # noqa: E731

        def gather(vals):
            t = torch.tensor([vals], dtype=torch.float64)
            return hvd.allgather(t, name="bench.gather").tolist()
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    g = torch.Generator().manual_seed(rank)
    times = []
    for step in range(args.warmup + args.steps):
        tokens = torch.randint(0, 8192, (args.batch, args.seq + 1), generator=g)
        t = time.perf_counter()
        opt.zero_grad()
        logits = model(tokens[:, :-1])
        F.cross_entropy(logits.reshape(-1, 8192), tokens[:, 1:].reshape(-1)).backward()
        opt.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - t)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    rows = gather([state(), peak, base_rss, statistics.median(times)])
    if rank == 0:
        print("BENCH " + json.dumps({"impl": impl, "np": size, "ranks": rows}), flush=True)


# ------------------------------------------------------------------ driver

def run_job(impl, args, launcher_args=(), extra_env=None):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONPATH=ROOT,
               OMP_NUM_THREADS="1", **(extra_env or {}))
    cmd = [shutil.which("horovodlikerun") or "horovodlikerun", "-np", str(args.np),
           *launcher_args, sys.executable, os.path.abspath(__file__), "--worker", impl,
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--batch",
           str(args.batch), "--seq", str(args.seq)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    for line in res.stdout.splitlines():
        if "BENCH " in line:
            return json.loads(line.split("BENCH ", 1)[1])
    raise RuntimeError(f"{impl} failed ({res.returncode}):\n{res.stdout[-2000:]}\n"
                       f"{res.stderr[-2000:]}")


def collect(impls, args, launcher_args=(), extra_env=None, tag=""):
    out = {}
    for rnd in range(args.rounds):
        for impl in (impls if rnd % 2 == 0 else impls[::-1]):
            t = time.time()
            res = run_job(impl, args, launcher_args, extra_env)
            out.setdefault(impl, []).append(res["ranks"])
            print(f"  {tag}round {rnd + 1}/{args.rounds} {impl}: {time.time() - t:.0f} s",
                  file=sys.stderr, flush=True)
    return out


def summarize(samples):
    """impl -> (state MiB per rank (max), peak RSS MiB (max), step ms (median))."""
    mib = 1 << 20
    table = {}
    for impl, runs in samples.items():
        ranks = [r for run in runs for r in run]
        table[impl] = (max(r[0] for r in ranks) / mib, max(r[1] for r in ranks) / mib,
                       statistics.median(run[0][3] for run in runs) * 1e3)
    return table


def print_table(title, table):
    print(f"\n{title}\n")
    print("| optimizer | optimizer state per rank | peak RSS per rank | step time |")
    print("|---|---|---|---|")
    for impl, (state, rss, step) in table.items():
        print(f"| {LABELS[impl]} | {state:.1f} MiB | {rss:.0f} MiB | {step:.0f} ms |")


def plot(path, table, netns_table):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = [("optimizer state per rank (MiB)", 0, table), ("step time, one node (ms)", 2, table)]
    if netns_table:
        panels.append(("step time, 2 nodes over 1 Gbit/s (ms)", 2, netns_table))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8))
    for ax, (title, col, tab) in zip(axes, panels):
        names = list(tab)
        # on one host, hybrid runs on 2 fake nodes over loopback TCP (see main)
        label = {}
        if tab is table:
            label = {"hybrid": "Sharded stage 2\n(S=local, 2 fake\nnodes, TCP)"}
        ax.barh([label.get(n, LABELS[n].replace(" (", "\n(")) for n in names],
                [tab[n][col] for n in names], color="#4c72b0")
        ax.set_title(title, fontsize=10)
        ax.invert_yaxis()
        ax.tick_params(labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", choices=IMPLS, help=argparse.SUPPRESS)
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--netns", action="store_true")
    ap.add_argument("--netns-only", action="store_true", help="only the shaped-link part")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--plot")
    ap.add_argument("--impls", default=",".join(IMPLS),
                    help="which of %s to run (default: all)" % ", ".join(IMPLS))
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "sharded.json"),
                    help="tables are merged into this file; --plot draws from it, so a "
                         "--netns-only run completes an earlier one-node run's plot")
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    wanted = [i for i in IMPLS if i in args.impls.split(",")]
    # one node: local_size is the whole job, so "hybrid" would equal zero2; use 2 per node
    # (fake nodes over loopback) to show the layout's cost without a slow link
    table = netns_table = None
    if not args.netns_only:
        table = summarize(collect([i for i in wanted if i != "hybrid"], args,
                                  tag="one node "))
        fake = ["-H", f"a:{args.np // 2},b:{args.np // 2}", "--ssh-command",
                "sh -c {command}"]
        if "hybrid" in wanted:
            table["hybrid"] = summarize(collect(["hybrid"], args, fake,
                                                tag="fake nodes "))["hybrid"]
        print_table(f"{args.np} ranks on one host, batch {args.batch}x{args.seq} tokens "
                    f"per rank", table)
    if args.netns or args.netns_only:
        import netns
        why = netns.available()
        if why:
            print(f"\nshaped-link comparison skipped: {why}")
        else:
            try:
                with netns.TwoNodes(rate=args.rate) as net:
                    netns_table = summarize(collect(
                        [i for i in ("do", "zero2", "hybrid") if i in wanted], args,
                        net.launcher_args(args.np // 2), net.env(), tag="netns "))
                print_table(f"2 nodes x {args.np // 2} ranks, {args.rate} shaped link",
                            netns_table)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                print(f"\nshaped-link comparison failed: {str(e)[:3000]}")
    saved = {}
    if os.path.exists(args.out):
        with open(args.out) as f:
            saved = json.load(f)
    if table:
        saved["one_node"] = {"command": " ".join(sys.argv), "table": table}
    if netns_table:
        saved["netns"] = {"command": " ".join(sys.argv), "table": netns_table}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(saved, f, indent=1)
    if args.plot and "one_node" in saved:
        plot(args.plot, saved["one_node"]["table"], saved.get("netns", {}).get("table"))


if __name__ == "__main__":
    main()
