"""The benchmark: our engine and its peers on the same cases, in ONE invocation.

    python bench/run.py                 # everything (about 15 minutes here)
    python bench/run.py --quick         # fewer sizes and rounds
    python bench/run.py --cases sizes --np 2 --rounds 3
    python bench/run.py --cases sizes,train --np 2 --plot   # + docs/bench_sizes.png
    python bench/run.py --replot bench/results/latest.json --plot out.png
    python bench/run.py --cases train-nodes [--rounds 3] [--places 1gbit,10gbit]
                                        # training over 2 fake nodes x 2 ranks (root;
                                        # about 25 minutes; not in the default cases)

Each implementation runs in its own processes, never two in one process (a busy
thread of one would slow the other), and the jobs alternate: ours, peer, ours, peer...
so slow drift of this noisy machine hits everyone alike. Peers: mpi4py's Allreduce on
OpenMPI, torch.distributed with gloo, DeepSpeed's CPU shared-memory allreduce for sizes
up to 1 MiB when `deepspeed` is importable, and Horovod when it is importable (each
skipped with a note otherwise; --peers picks a subset). --plot draws time and bus
bandwidth against message size, ours against each peer.

Each row is built from rounds (one job of one implementation each), not from pooled
samples: the median of the rounds' medians with their min-max, the ratio of ours to each
peer's, and a round that ran in the machine's slow mode (told by a fixed calibration
workload timed around it) marked and kept out of the row (bench/stats.py has the rule
and its reasons). The raw samples go to JSON: "samples" keeps one entry per row and
implementation with the "seconds" of its kept rounds (what --replot draws), and
"rounds" each round's median, calibration and mark.
"""
import argparse
import glob
import importlib.util
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time

import stats

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKER = os.path.join(HERE, "worker.py")
TRAIN_WORKER = os.path.join(HERE, "train_worker.py")
SIZES = [4096, 65536, 1 << 20, 16 << 20, 64 << 20, 256 << 20]
QUICK_SIZES = [4096, 1 << 20, 64 << 20]
DEEPSPEED_MAX = 1 << 20     # DeepSpeed's shm allreduce is its small-message (inference) path
DEEPSPEED_TIMEOUT = 120     # a DeepSpeed job that runs longer has hung (see collect)
HUNG = []                   # DeepSpeed jobs killed as hung, for the notes


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def available_peers():
    peers, notes = ["mpi", "gloo"], []
    if shutil.which("mpirun") is None or importlib.util.find_spec("mpi4py") is None:
        peers.remove("mpi")
        notes.append("mpi4py/OpenMPI skipped: mpirun or mpi4py is not installed")
    if importlib.util.find_spec("torch") is None:
        peers.remove("gloo")
        notes.append("gloo skipped: torch is not installed")
    if importlib.util.find_spec("deepspeed") is None:
        notes.append("DeepSpeed skipped: not importable (it is not a dependency; install it "
                     "anywhere on PYTHONPATH, e.g. pip install --target DIR deepspeed, to add "
                     "its CPU shm allreduce as a peer for sizes up to 1 MiB)")
    else:
        peers.append("deepspeed")
        notes.append(f"DeepSpeed: its CPU shm allreduce, sizes up to {human(DEEPSPEED_MAX)} "
                     f"and rank counts up to the core count only")
    if importlib.util.find_spec("horovod") is None:
        notes.append("Horovod skipped: not importable (horovod 0.28.1 does not build against "
                     "torch 2.13); see docs/benchmarks.md for figures measured elsewhere")
    else:
        notes.append("Horovod is importable but not wired into this benchmark yet")
    return peers, notes


def command(impl, np_, worker_args, launcher_args=()):
    worker = TRAIN_WORKER if impl in ("ours-train", "ddp") else WORKER
    py = [sys.executable, worker, "--impl", impl.replace("-train", "")] + worker_args
    if impl == "mpi":
        return ["mpirun", "-np", str(np_), "--oversubscribe"] + py
    return [shutil.which("horovodlikerun") or "horovodlikerun", "-np", str(np_),
            *launcher_args] + py


def run_job(impl, np_, worker_args, timeout, launcher_args=(), extra_env=None):
    port = free_port()
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1")
    env.update(extra_env or {})
    try:
        res = subprocess.run(command(impl, np_, worker_args, launcher_args),
                             capture_output=True, text=True, timeout=timeout, env=env)
    finally:
        # DeepSpeed's shm.cpp leaves its named segments behind (named by address and port)
        for name in glob.glob(f"/dev/shm/deepspeed_allreduce_buffer_*_127.0.0.1_{port}_*"):
            os.unlink(name)
    for line in res.stdout.splitlines():
        if "BENCH " in line:
            return json.loads(line.split("BENCH ", 1)[1])
    raise RuntimeError(f"{impl} at {np_} ranks failed ({res.returncode}):\n"
                       f"{res.stdout[-2000:]}\n{res.stderr[-2000:]}")


def peer_args(impl, case, np_, worker_args):
    """The worker arguments for impl on this case, or None where it does not take part:
    DeepSpeed's shm allreduce only on sizes up to DEEPSPEED_MAX, and not oversubscribed
    (its ranks busy-poll)."""
    if impl != "deepspeed":
        return worker_args
    if case != "sizes" or np_ > (os.cpu_count() or 1):
        return None
    sizes = [s for s in worker_args[worker_args.index("--sizes") + 1].split(",")
             if int(s) <= DEEPSPEED_MAX]
    return ["--sizes", ",".join(sizes)] if sizes else None


def collect(cases, impls, rounds, budget, timeout):
    samples = {}          # (case, np, label, impl) -> [round: {round, seconds, calibration}]
    for case, np_, worker_args in cases:
        for rnd in range(rounds):
            order = impls if rnd % 2 == 0 else impls[::-1]
            for impl in order:
                args = peer_args(impl, case, np_, worker_args)
                if args is None:
                    continue
                t = time.time()
                try:
                    out = run_job(impl, np_, ["--case", case, "--budget", str(budget)] + args,
                                  DEEPSPEED_TIMEOUT if impl == "deepspeed" else timeout)
                except subprocess.TimeoutExpired:
                    if impl != "deepspeed":
                        raise
                    # seen here: rank 0 waiting in gloo's barrier for a rank that never
                    # came out of the shm allreduce; the row keeps the finished rounds
                    HUNG.append(f"{case} np={np_} round {rnd + 1}")
                    print(f"  {case} np={np_} round {rnd + 1}/{rounds} deepspeed: hung, "
                          f"killed after {DEEPSPEED_TIMEOUT} s", file=sys.stderr, flush=True)
                    continue
                cal = out.get("calibration", {})
                for label, vals in out["results"].items():
                    samples.setdefault((case, np_, label, impl), []).append(
                        {"round": rnd + 1, "seconds": vals, "calibration": cal.get(label)})
                print(f"  {case} np={np_} round {rnd + 1}/{rounds} {impl}: {time.time() - t:.1f} s",
                      file=sys.stderr, flush=True)
    return samples


def collect_netns(rounds, budget, timeout, nbytes=16 << 20):
    """Flat ring vs hierarchical over two fake nodes of 2 ranks and a 1 Gbit/s link."""
    import netns
    why = netns.available()
    if why:
        return {}, [f"hierarchical-vs-flat skipped: {why}"]
    samples = {}
    with netns.TwoNodes(rate="1gbit") as net:
        for rnd in range(rounds):
            for alg in (("ring", "hier") if rnd % 2 == 0 else ("hier", "ring")):
                out = run_job("ours", 4, ["--case", "sizes", "--sizes", str(nbytes),
                                          "--budget", str(budget)], timeout,
                              launcher_args=net.launcher_args(per_node=2),
                              extra_env={**net.env(), "HOROVODLIKE_ALLREDUCE_ALGORITHM": alg})
                samples.setdefault(alg, []).extend(out["results"][str(nbytes)])
                print(f"  netns round {rnd + 1}/{rounds} {alg}", file=sys.stderr, flush=True)
    flat, hier = statistics.median(samples["ring"]), statistics.median(samples["hier"])
    line = (f"hierarchical vs flat, {human(nbytes)} allreduce, 2 nodes x 2 ranks, 1 Gbit/s "
            f"link: flat ring {flat * 1e3:.1f} ms, hierarchical {hier * 1e3:.1f} ms, "
            f"hierarchical/flat {hier / flat:.2f}")
    return samples, [line]


def collect_train(rounds, timeout):
    """Training throughput at 1 and 2 ranks, ours against torch DDP, alternated."""
    samples, lines = {}, []
    for rnd in range(rounds):
        for np_ in (1, 2):
            for impl in (("ours-train", "ddp") if rnd % 2 == 0 else ("ddp", "ours-train")):
                out = run_job(impl, np_, [], timeout)
                samples.setdefault((impl, np_), []).extend(next(iter(out["results"].values())))
                print(f"  train round {rnd + 1}/{rounds} {impl} np={np_}", file=sys.stderr, flush=True)
    med = {k: statistics.median(v) for k, v in samples.items()}
    for impl, name in (("ours-train", "horovodlike"), ("ddp", "torch DDP (gloo)")):
        eff = med[(impl, 2)] / (2 * med[(impl, 1)])
        lines.append(f"training (SmallResNet, batch 32 per rank): {name}: 1 rank {med[(impl, 1)]:.0f} "
                     f"img/s, 2 ranks {med[(impl, 2)]:.0f} img/s, scaling efficiency {eff:.2f}")
    return {f"{k[0]}@{k[1]}": v for k, v in samples.items()}, lines


# Training across nodes: the implementations, as (label, launcher impl, --compression).
# The extra ones (ours-ring: the flat ring in place of the hierarchical allreduce) only when
# asked for.
TRAIN_NODES_IMPLS = [("ours", "ours-train", "none"), ("ours+fp16", "ours-train", "fp16"),
                     ("ours+PowerSGD", "ours-train", "powersgd"), ("DDP", "ddp", "none"),
                     ("DDP+PowerSGD", "ddp", "powersgd")]
TRAIN_NODES_EXTRA = [("ours-ring", "ours-train", "none")]
TRAIN_NODES_ENV = {"ours-ring": {"HOROVODLIKE_ALLREDUCE_ALGORITHM": "ring"}}
TRAIN_NODES_RATES = ["100mbit", "1gbit", "10gbit"]
TRAIN_NODES_PLACES = ["1node-2", "1node-4"] + TRAIN_NODES_RATES
# The MLP of examples/pytorch_synthetic_benchmark.py: 7.0 MiB of gradients, 99.9% of them
# in three matrices (as the layers that dominate a ResNet's or a transformer's gradients),
# the only model there whose gradients are large enough for the link to matter. Batch 32
# per rank, PowerSGD rank 4 after 2 uncompressed steps (ours and DDP's hook alike).
TRAIN_NODES_ARGS = ["--model", "mlp", "--batch-size", "32", "--powersgd-rank", "4",
                    "--start-iter", "2", "--warmup", "4"]
# Timed steps (iterations x steps per iteration): at 100 Mbit/s an uncompressed step
# takes about a second, so fewer there; the same for every implementation at a rate.
TRAIN_NODES_STEPS = {"100mbit": (4, 3)}
TRAIN_NODES_DEFAULT_STEPS = (8, 5)


def train_nodes_job(label, impl, compression, np_, rate, timeout, net=None):
    """One training job: 2 fake nodes x 2 ranks over `net`, or np_ ranks on this node."""
    iters, per = TRAIN_NODES_STEPS.get(rate, TRAIN_NODES_DEFAULT_STEPS)
    args = TRAIN_NODES_ARGS + ["--compression", compression, "--iters", str(iters),
                               "--batches-per-iter", str(per)]
    env = TRAIN_NODES_ENV.get(label, {})
    if net is None:
        return run_job(impl, np_, args, timeout, extra_env=env)
    import netns
    return run_job(impl, 4, args + ["--link", netns.LINK], timeout,
                   launcher_args=net.launcher_args(per_node=2),
                   extra_env={**net.env(), **net.torch_env(), **env})


def collect_train_nodes(rounds, timeout, places=None, labels=None):
    """Training over 2 fake nodes x 2 ranks at each link rate, and the same on one node
    (2 and 4 ranks, no shaped link) for scaling efficiency: every implementation of
    TRAIN_NODES_IMPLS (or those of `labels`) in its own job, the order reversed every
    round. places: link rates, and "1node-2" / "1node-4" for one node.
    Returns {"rate/label": [{"round", "img_s": [samples], "link_bytes_per_step"}]}."""
    import netns
    why = netns.available()
    if why:
        return {}, [f"train-nodes skipped: {why}"]
    out = {}

    def record(key, res, rnd):
        out.setdefault(key, []).append({"round": rnd + 1, "img_s": next(iter(res["results"].values())),
                                        "link_bytes_per_step": res.get("link_bytes_per_step"),
                                        "cpu_s_per_step": res.get("cpu_s_per_step")})

    impls = [i for i in TRAIN_NODES_IMPLS + TRAIN_NODES_EXTRA
             if i[0] in (labels or [lab for lab, _, _ in TRAIN_NODES_IMPLS])]
    for place in places or TRAIN_NODES_PLACES:
        net = None
        ctx = netns.TwoNodes(rate=place) if "node" not in place else None
        try:
            if ctx is not None:
                net = ctx.__enter__()
            for rnd in range(rounds):
                for label, impl, compression in (impls if rnd % 2 == 0 else impls[::-1]):
                    t = time.time()
                    np_ = int(place.split("-")[1]) if ctx is None else 4
                    res = train_nodes_job(label, impl, compression, np_, place, timeout, net)
                    record(f"{place}/{label}", res, rnd)
                    print(f"  train-nodes {place} round {rnd + 1}/{rounds} {label}: "
                          f"{statistics.median(res['results'][next(iter(res['results']))]):.0f} "
                          f"img/s, {time.time() - t:.0f} s", file=sys.stderr, flush=True)
        finally:
            if ctx is not None:
                ctx.__exit__()
    return out, train_nodes_report(out, rounds)


def _round_medians(rows):
    return [statistics.median(r["img_s"]) for r in rows]


def train_nodes_report(out, rounds):
    """The table (img/s, median [min-max] of the rounds' medians), the ratios the targets
    name and scaling efficiency, as markdown lines."""
    med = {k: statistics.median(_round_medians(v)) for k, v in out.items()}
    rates = [r for r in TRAIN_NODES_RATES if any(k.startswith(r + "/") for k in out)]
    places = [p for p in ["1node-2", "1node-4"] if any(k.startswith(p + "/") for k in out)]
    names = {"1node-2": "one node, 2 ranks", "1node-4": "one node, 4 ranks",
             "100mbit": "2x2, 100 Mbit/s", "1gbit": "2x2, 1 Gbit/s", "10gbit": "2x2, 10 Gbit/s"}
    labels = [lab for lab, _, _ in TRAIN_NODES_IMPLS + TRAIN_NODES_EXTRA
              if any(k.endswith("/" + lab) for k in out)]
    lines = [f"training across nodes (img/s over all ranks, median [min-max] of {rounds} "
             f"rounds' medians):", "",
             "| where | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]
    for p in places + rates:
        cells = []
        for lab in labels:
            rows = out.get(f"{p}/{lab}")
            if not rows:
                cells.append("-")
                continue
            m = _round_medians(rows)
            cells.append(f"{statistics.median(m):.0f} [{min(m):.0f}-{max(m):.0f}]")
        lines.append(f"| {names[p]} | " + " | ".join(cells) + " |")
    lines.append("")

    def ratio(a, b):
        return f"{med[a] / med[b]:.2f}" if a in med and b in med else "-"

    lines.append(f"target: ours / DDP at 1 Gbit/s = {ratio('1gbit/ours', '1gbit/DDP')} (>= 1.2)")
    lines.append(f"target: ours+PowerSGD / ours at 100 Mbit/s = "
                 f"{ratio('100mbit/ours+PowerSGD', '100mbit/ours')} (>= 3)")
    lines.append(f"target: ours+PowerSGD / DDP+PowerSGD at 100 Mbit/s = "
                 f"{ratio('100mbit/ours+PowerSGD', '100mbit/DDP+PowerSGD')} (>= 1.0)")
    for rate in rates:
        lines.append(f"{names[rate]}: ours/DDP {ratio(rate + '/ours', rate + '/DDP')}, "
                     f"ours+fp16/ours {ratio(rate + '/ours+fp16', rate + '/ours')}, "
                     f"ours+PowerSGD/DDP+PowerSGD "
                     f"{ratio(rate + '/ours+PowerSGD', rate + '/DDP+PowerSGD')}, "
                     f"ours+PowerSGD/ours {ratio(rate + '/ours+PowerSGD', rate + '/ours')}, "
                     f"hierarchical/flat ring (ours/ours-ring) "
                     f"{ratio(rate + '/ours', rate + '/ours-ring')}")
    lines.append("")
    lines.append("scaling efficiency: 2x2 img/s / (2 x one node at 2 ranks) | "
                 "2x2 img/s / one node at 4 ranks")
    for rate in rates:
        cells = []
        for lab in labels:
            k = f"{rate}/{lab}"
            e2 = (f"{med[k] / (2 * med['1node-2/' + lab]):.2f}"
                  if k in med and f"1node-2/{lab}" in med else "-")
            e4 = f"{med[k] / med['1node-4/' + lab]:.2f}" if k in med and f"1node-4/{lab}" in med else "-"
            cells.append(f"{lab} {e2} | {e4}")
        lines.append(f"{names[rate]}: " + "; ".join(cells))
    lines.append("")
    lines.append("bytes each node sent across the link per timed step (median over rounds, "
                 "MiB, node 1 / node 2):")
    for rate in rates:
        cells = []
        for lab in labels:
            rows = out.get(f"{rate}/{lab}") or []
            per = [r["link_bytes_per_step"] for r in rows if r.get("link_bytes_per_step")]
            if per:
                cells.append(f"{lab} " + " / ".join(
                    f"{statistics.median(p[i] for p in per) / (1 << 20):.2f}"
                    for i in range(len(per[0]))))
        lines.append(f"{names[rate]}: " + "; ".join(cells))
    lines.append("")
    lines.append("CPU time per timed step, summed over the ranks (median over rounds, ms; "
                 "each rank's process, its engine or gloo threads included):")
    for p in places + rates:
        cells = []
        for lab in labels:
            per = [sum(r["cpu_s_per_step"]) for r in out.get(f"{p}/{lab}") or []
                   if r.get("cpu_s_per_step")]
            if per:
                cells.append(f"{lab} {statistics.median(per) * 1e3:.0f}")
        if cells:
            lines.append(f"{names[p]}: " + "; ".join(cells))
    return lines


def mark_slow(samples):
    """Mark each round {"slow": bool} by stats.is_slow, against the baseline of every
    round at the same rank count (every case and implementation: the calibration is the
    same work in all of them). Returns {np: baseline seconds}."""
    bases = {}
    for np_ in {k[1] for k in samples}:
        bases[np_] = stats.baseline([r["calibration"] for k, rs in samples.items()
                                     if k[1] == np_ for r in rs])
    for (_, np_, _, _), rs in samples.items():
        for r in rs:
            r["slow"] = stats.is_slow(r["calibration"], bases[np_])
    return bases


def kept_seconds(rounds):
    """The samples a row is built from: those of the rounds not marked slow (all of them
    when every round is)."""
    kept = [r for r in rounds if not r.get("slow")] or rounds
    return [v for r in kept for v in r["seconds"]]


def human(nbytes):
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= div:
            return f"{nbytes / div:g} {unit}"
    return f"{nbytes} B"


def cell(summary, scale, digits=3):
    """"median [lo-hi]" of one implementation's rounds, with its slow rounds counted."""
    text = (f"{summary['median'] * scale:.{digits}g} "
            f"[{summary['lo'] * scale:.{digits}g}-{summary['hi'] * scale:.{digits}g}]")
    if summary["all_slow"]:
        return text + f" ({summary['slow']} slow: all)"
    return text + (f" ({summary['slow']} slow)" if summary["slow"] else "")


def table(samples, impls):
    """A row per (case, ranks, size): each implementation's median over its kept rounds
    with the min-max of those rounds in brackets (ms), slow rounds counted in
    parentheses, and ours / each peer's median."""
    peers = [i for i in impls if i != "ours"]
    head = (["case", "ranks"] + [f"{i} (ms) median [min-max of rounds]" for i in impls]
            + [f"ours/{p}" for p in peers])
    rows = []
    keys = sorted({k[:3] for k in samples}, key=lambda k: (k[0], k[1], int(k[2]) if k[2].isdigit() else 0))
    for case, np_, label in keys:
        summ = {i: stats.summarize(samples[(case, np_, label, i)])
                for i in impls if (case, np_, label, i) in samples}
        name = human(int(label)) if label.isdigit() else label
        if case == "idle":
            cells = [f"{summ[i]['median'] * 100:.2f}% of a core" if i in summ else "-"
                     for i in impls]
            rows.append([name, str(np_)] + cells + ["" for _ in peers])
            continue
        cells = [cell(summ[i], 1e3) if i in summ else "-" for i in impls]
        ratios = [f"{stats.ratio(summ['ours'], summ[p]):.2f}" if "ours" in summ and p in summ
                  else "-" for p in peers]
        rows.append([name, str(np_)] + cells + ratios)
    widths = [max(len(r[c]) for r in rows + [head]) for c in range(len(head))]
    fmt = lambda r: "| " + " | ".join(v.rjust(w) for v, w in zip(r, widths)) + " |"  # noqa: E731
    lines = [fmt(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [fmt(r) for r in rows]
    return "\n".join(lines)


def slow_report(samples):
    """One line per implementation and row with slow rounds: which, and their medians."""
    lines = []
    for (case, np_, label, impl), rs in sorted(samples.items(), key=lambda kv: str(kv[0])):
        slow = [r for r in rs if r.get("slow")]
        if slow:
            name = human(int(label)) if label.isdigit() else label
            what = ", ".join(f"round {r['round']} {statistics.median(r['seconds']) * 1e3:.3g} ms"
                             for r in slow)
            lines.append(f"slow mode: {case} {name} np={np_} {impl}: {what}")
    return lines


def bus_bandwidth(nbytes, np_, seconds):
    """NCCL's convention: an allreduce moves 2(n-1)/n of the buffer over the slowest
    link, so bus bandwidth is comparable across rank counts."""
    return 2 * (np_ - 1) / np_ * nbytes / seconds


PEER_NAMES = {"ours": "horovodlike", "mpi": "mpi4py / OpenMPI", "gloo": "torch gloo",
              "deepspeed": "DeepSpeed shm"}


def plot(samples, path):
    """Time and bus bandwidth against message size, a row per rank count and a line per
    implementation (medians), written to path as a PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    curves = {}           # np -> impl -> [(bytes, median seconds)]
    for (case, np_, label, impl), vals in samples.items():
        if case == "sizes" and label.isdigit():
            curves.setdefault(np_, {}).setdefault(impl, []).append(
                (int(label), statistics.median(vals)))
    rows = sorted(n for n, c in curves.items() if max(len(v) for v in c.values()) > 1)
    if not rows:
        raise SystemExit("--plot: no rank count has more than one message size to plot")
    fig, axes = plt.subplots(len(rows), 2, figsize=(10, 3.6 * len(rows)), squeeze=False)
    for (ax_t, ax_b), np_ in zip(axes, rows):
        for impl, pts in sorted(curves[np_].items(), key=lambda kv: kv[0] != "ours"):
            pts.sort()
            x = [b for b, _ in pts]
            style = dict(marker="o", lw=2.2 if impl == "ours" else 1.2,
                         label=PEER_NAMES.get(impl, impl))
            ax_t.plot(x, [t * 1e3 for _, t in pts], **style)
            ax_b.plot(x, [bus_bandwidth(b, np_, t) / 1e9 for b, t in pts], **style)
        for ax, what in ((ax_t, "time (ms)"), (ax_b, "bus bandwidth (GB/s)")):
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted({b for pts in curves[np_].values() for b, _ in pts}))
            ax.set_xticklabels([human(b).replace(" ", "") for b in ax.get_xticks()],
                               fontsize=8)
            ax.set_xlabel("message size (float32 allreduce)")
            ax.set_ylabel(what)
            ax.set_title(f"{np_} ranks: {what.split(' (')[0]}", fontsize=10)
            ax.grid(alpha=0.3, which="both")
        ax_t.set_yscale("log")
        ax_t.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def load_samples(path):
    with open(path) as f:
        raw = json.load(f)
    return {(s["case"], s["np"], s["label"], s["impl"]): s["seconds"] for s in raw["samples"]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--cases", default="sizes,resnet50,idle,train,netns")
    ap.add_argument("--np", default="2,4,8", help="rank counts for the size sweep")
    ap.add_argument("--oversubscribed-sizes", default=str(64 << 20),
                    help="sizes for rank counts above the core count (peers that busy-poll "
                         "take minutes there)")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--places", help="train-nodes: comma-separated link rates and one-node "
                                     "runs (default " + ",".join(TRAIN_NODES_PLACES) + ")")
    ap.add_argument("--train-impls", help="train-nodes: comma-separated subset of " + ",".join(
        lab for lab, _, _ in TRAIN_NODES_IMPLS + TRAIN_NODES_EXTRA) + " (default: all but "
        "ours-ring)")
    ap.add_argument("--peers", help="comma-separated subset of the available peers "
                                    "(mpi, gloo, deepspeed); default: all of them")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "latest.json"))
    ap.add_argument("--plot", nargs="?", const=os.path.join(ROOT, "docs", "bench_sizes.png"),
                    help="also write a PNG of time and bus bandwidth against message size "
                         "(default docs/bench_sizes.png)")
    ap.add_argument("--replot", metavar="JSON",
                    help="only draw --plot from the raw samples of an earlier run")
    args = ap.parse_args(argv)
    if args.replot:
        return plot(load_samples(args.replot), args.plot or os.path.join(ROOT, "docs",
                                                                         "bench_sizes.png"))
    impls, notes = available_peers()
    if args.peers is not None:
        unknown = set(args.peers.split(",")) - set(impls) - {""}
        if unknown:
            raise SystemExit(f"--peers: {', '.join(sorted(unknown))} not available "
                             f"(available: {', '.join(impls)})")
        impls = [i for i in impls if i in args.peers.split(",")]
    impls = ["ours"] + impls
    # Rounds are cheap (a few seconds per job but at oversubscribed rank counts), and a
    # median and a spread over rounds need several of them; training and the shaped link
    # take minutes a round, so they keep their former counts unless --rounds says.
    rounds = args.rounds or 5
    long_rounds = args.rounds or (2 if args.quick else 3)
    budget = 0.3 if args.quick else 1.0
    sizes = QUICK_SIZES if args.quick else SIZES
    wanted = args.cases.split(",")
    cases = []
    if "sizes" in wanted:
        for np_ in [int(n) for n in args.np.split(",")]:
            over = np_ > (os.cpu_count() or 1)
            chosen = args.oversubscribed_sizes if over else ",".join(map(str, sizes))
            cases.append(("sizes", np_, ["--sizes", chosen]))
    if "resnet50" in wanted:
        cases.append(("resnet50", 2, []))
    if "idle" in wanted:
        cases.append(("idle", 2, []))
    print(f"benchmarking {', '.join(impls)}; {rounds} alternating rounds", file=sys.stderr)
    rounds_of = collect(cases, impls, rounds, budget, timeout=900)
    bases = mark_slow(rounds_of)
    samples = {k: kept_seconds(rs) for k, rs in rounds_of.items()}
    train_samples, train_lines = ({}, [])
    if "train" in wanted and "gloo" in impls:
        train_samples, train_lines = collect_train(long_rounds, timeout=900)
    nodes_samples, nodes_lines = ({}, [])
    if "train-nodes" in wanted:
        nodes_samples, nodes_lines = collect_train_nodes(
            long_rounds, timeout=900, places=args.places.split(",") if args.places else None,
            labels=args.train_impls.split(",") if args.train_impls else None)
    net_samples, net_lines = ({}, [])
    if "netns" in wanted:
        net_samples, net_lines = collect_netns(long_rounds, budget, timeout=900)
    if rounds_of:
        print(table(rounds_of, impls))
        print(f"rows: median of each implementation's rounds (each round's median sample), "
              f"[min-max] over those rounds; a round whose calibration took more than "
              f"{stats.SLOW_FACTOR}x the baseline is slow and left out (bench/stats.py); "
              f"baselines: " + ", ".join(f"{n} ranks {b * 1e3:.1f} ms" for n, b in
                                          sorted(bases.items()) if b is not None))
    for line in slow_report(rounds_of) + train_lines + net_lines + nodes_lines:
        print(line)
    if HUNG:
        notes.append(f"DeepSpeed hung and was killed in {len(HUNG)} job(s): {'; '.join(HUNG)}")
    for n in notes:
        print(f"note: {n}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"command": " ".join([sys.executable] + sys.argv), "notes": notes,
                   "samples": [{"case": k[0], "np": k[1], "label": k[2], "impl": k[3], "seconds": v}
                               for k, v in samples.items()],
                   "rounds": [{"case": k[0], "np": k[1], "label": k[2], "impl": k[3],
                               "round": r["round"], "median": statistics.median(r["seconds"]),
                               "calibration": r["calibration"], "slow": r["slow"],
                               "seconds": r["seconds"]}
                              for k, rs in rounds_of.items() for r in rs],
                   "slow_factor": stats.SLOW_FACTOR,
                   "calibration_baseline": {str(n): b for n, b in bases.items()},
                   "train": train_samples, "netns": net_samples,
                   "train_nodes": nodes_samples,
                   "summary": train_lines + net_lines + nodes_lines}, f, indent=1)
    print(f"raw samples: {args.out}")
    if args.plot:
        plot(samples, args.plot)


if __name__ == "__main__":
    main()
