"""Sharded data parallelism, measured: per-rank optimizer-state bytes, peak RSS and step
time of the transformer from examples/pytorch_sharded_transformer.py (23M parameters,
AdamW) under

  do        hvd.DistributedOptimizer
  zero1     hvd.ShardedDistributedOptimizer stage 1, shard_size = all ranks
  zero2     ... stage 2, shard_size = all ranks
  hybrid    ... stage 2, shard_size = ranks per node (MiCS)
  torchzero torch's ZeroRedundancyOptimizer with DistributedDataParallel over gloo

in ONE invocation, each in its own processes, alternating the order every round. On one
host, hybrid needs several nodes: it runs on two fake nodes of np/2 ranks over loopback
TCP, alternated with do and zero2 on the same fake nodes (rows "... 2 fake nodes"), so
that it is compared on its own topology. With --netns it also runs zero2 against hybrid
(and do) on two fake nodes joined by a tc-shaped link of --rate (bench/netns.py; needs
root and iproute2), and prints the bytes each sends across the link per step.

    python bench/sharded.py --np 4 --rounds 2 [--netns] [--plot docs/sharded_bench.png]
    python bench/sharded.py --np 4 --rounds 3 --netns-only --impls zero2,hybrid --rate 100mbit
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
FAKE = " @ 2 fake nodes"            # suffix of the one-host rows run on fake nodes


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
        print(f"| {label(impl)} | {state:.1f} MiB | {rss:.0f} MiB | {step:.0f} ms |")


def label(key):
    impl, fake, _ = key.partition(FAKE)
    return LABELS[impl] + (", 2 fake nodes (TCP)" if fake else "")


def link_bytes(nbytes, np_, nodes=2):
    """Bytes each node sends across the link per step, for a model of nbytes gradients
    (float32, as the buffers are padded: close enough), n ranks on `nodes` nodes of
    L = n / nodes: full sharding reduce-scatters in one flat TCP ring over every rank
    ((n-1)/n B per crossing) and all-gathers hierarchically ((N-1)/N B per node);
    hybrid all-reduces the 1/L shard across nodes (L ranks x 2 (N-1)/N B/L);
    DistributedOptimizer's hierarchical all-reduce moves 2 (N-1)/N B per node."""
    n, N = np_, nodes
    return {"zero2": (n - 1) / n * nbytes + (N - 1) / N * nbytes,
            "hybrid": 2 * (N - 1) / N * nbytes, "do": 2 * (N - 1) / N * nbytes}


def rate_bytes_per_s(rate):
    """tc's rate (e.g. 1gbit, 100mbit) as TCP payload bytes/s: tbf counts whole Ethernet
    frames, 1514 bytes for 1448 of payload."""
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bit": 1}
    for u, f in units.items():
        if rate.lower().endswith(u):
            return float(rate[:-len(u)]) * f / 8 * 1448 / 1514
    raise ValueError(f"rate {rate!r}: expected e.g. 100mbit or 1gbit")


def plot(path, table, netns_tables):
    """netns_tables: [(rate, table)], one panel each."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    one = {k: v for k, v in table.items() if FAKE not in k}
    fake = {k: v for k, v in table.items() if FAKE in k}
    state = dict(one, **{k: v for k, v in fake.items() if k.startswith("hybrid")})
    panels = [("optimizer state per rank (MiB)", 0, state),
              ("step time, one host (ms)", 2, one)]
    if fake:
        panels.append(("step time, 2 fake nodes\nover loopback TCP (ms)", 2, fake))
    for rate, tab in netns_tables:
        panels.append((f"step time, 2 nodes over a\n{rate} shaped link (ms)", 2, tab))
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.8))
    for ax, (title, col, tab) in zip(axes, panels):
        names = list(tab)
        ax.barh([LABELS[n.partition(FAKE)[0]].replace(" (", "\n(") for n in names],
                [tab[n][col] for n in names], color="#4c72b0")
        ax.set_title(title, fontsize=9)
        ax.invert_yaxis()
        ax.tick_params(labelsize=7)
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
            # hybrid's own topology, with do and zero2 on it as the reference
            on_fake = [i for i in ("do", "zero2", "hybrid") if i in wanted]
            for impl, row in summarize(collect(on_fake, args, fake,
                                               tag="fake nodes ")).items():
                table[impl + FAKE] = row
        print_table(f"{args.np} ranks on one host, batch {args.batch}x{args.seq} tokens "
                    f"per rank", table)
    if args.netns or args.netns_only:
        import netns
        why = netns.available()
        if why:
            print(f"\nshaped-link comparison skipped: {why}")
        else:
            try:
                # TwoNodes claims names and a subnet of its own: the tests' may be up
                with netns.TwoNodes(rate=args.rate) as net:
                    netns_table = summarize(collect(
                        [i for i in ("do", "zero2", "hybrid") if i in wanted], args,
                        net.launcher_args(args.np // 2), net.env(), tag="netns "))
                print_table(f"2 nodes x {args.np // 2} ranks, {args.rate} shaped link",
                            netns_table)
                nbytes = 4 * sum(p.numel() for p in load_example().TransformerLM(
                    seq=args.seq).parameters())
                print(f"\npredicted link time per step ({nbytes / 1e6:.1f} MB of float32 "
                      f"gradients, {rate_bytes_per_s(args.rate) / 1e6:.2f} MB/s of TCP "
                      f"payload per direction):")
                for impl, b in link_bytes(nbytes, args.np).items():
                    if impl in netns_table:
                        print(f"  {label(impl)}: {b / 1e6:.1f} MB per node and direction, "
                              f"{b / rate_bytes_per_s(args.rate) * 1e3:.0f} ms; measured "
                              f"step {netns_table[impl][2]:.0f} ms")
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                print(f"\nshaped-link comparison failed: {str(e)[:3000]}")
    saved = {}
    if os.path.exists(args.out):
        with open(args.out) as f:
            saved = json.load(f)
    if table:
        saved["one_node"] = {"command": " ".join(sys.argv), "table": table}
    if netns_table:
        saved.pop("netns", None)        # the old format, for one rate
        saved[f"netns {args.rate}"] = {"command": " ".join(sys.argv), "table": netns_table}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(saved, f, indent=1)
    if args.plot and "one_node" in saved:
        rates = sorted((k.split(" ", 1)[1] for k in saved if k.startswith("netns ")),
                       key=lambda r: -rate_bytes_per_s(r))
        plot(args.plot, saved["one_node"]["table"],
             [(r, saved[f"netns {r}"]["table"]) for r in rates])


if __name__ == "__main__":
    main()
