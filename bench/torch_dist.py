"""torch.distributed with backend="horovodlike" against gloo, in ONE invocation.

    python bench/torch_dist.py                          # every case, 2 and 4 ranks, 3 rounds
    python bench/torch_dist.py --cases allreduce,ddp --np 2 --rounds 3
    python bench/torch_dist.py --cases netns            # all_reduce + DDP over 2 fake nodes
    python bench/torch_dist.py --cases hangs --hang-runs 50     # pipelining, back to back
    python bench/torch_dist.py --replot bench/results/torch_dist.json --plot out.png

The implementations (each job ONE of them, in its own processes, under horovodlikerun,
as bench/run.py runs gloo):

  ours     import horovodlike.torch.distributed; dist.init_process_group("horovodlike")
  gloo     dist.init_process_group("gloo")
  engine   the engine's own torch call, hvd.allreduce(t, name="bench", op=hvd.Sum)
           (all_reduce case only: what the backend adds on top of the engine)
  engine_  the same in place, hvd.allreduce_ (no output to allocate, as dist.all_reduce)
  ours-direct  (with --impls) the backend's group called directly,
           dist.group.WORLD.allreduce([t]).wait(), without torch's dist.all_reduce
           wrapper: with ours and engine_, where a small all_reduce's time goes

The cases:

  allreduce  dist.all_reduce (SUM, in place, blocking) of float32 buffers, 4 KiB..4 MiB
  ddp        DistributedDataParallel training steps of the MLP of
             examples/pytorch_synthetic_benchmark.py (7.0 MiB of gradients), batch 32 per
             rank, SGD; the job also times the same steps under no_sync() (no allreduce),
             which says how much of a step the gradient allreduce is
  fsdp       FSDP2 (fully_shard per encoder layer and the root) training steps of the
             TransformerLM of examples/pytorch_sharded_transformer.py, made small
             (4 layers, d_model 256, vocab 4096, seq 64, batch 8), AdamW
  pipeline   torch.distributed.pipelining at 2 stages: PipelineStage + ScheduleGPipe,
             8 Linear(256, 256)+ReLU layers, batch 64 in 8 micro-batches, MSE, SGD; a job
             that does not end within --pipeline-timeout s is killed and counted as a hang
  netns      allreduce and ddp (and fsdp with --netns-cases) over two fake nodes of 2
             ranks joined by a --rate link (bench/netns.py; root, iproute2)
  hangs      --hang-runs pipelining jobs of ours back to back (2 stages), each killed
             after --pipeline-timeout s: the count of those that hung or failed

Rows follow bench/run.py's method: the rounds alternate the implementations' order, each
round gives its median sample, a row gives the median of the rounds' medians with their
min-max, and a round whose calibration (bench/worker.py's fixed workload, timed by every
rank around each measurement) took more than stats.SLOW_FACTOR x the lower quartile of
all readings at that rank count is marked slow and left out (bench/stats.py).
Ratios are ours / peer of the medians (times; for ddp also samples/s).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import run as house  # noqa: E402  (bench/run.py: free_port, human, cell, mark_slow...)
import stats  # noqa: E402

SIZES = [4096, 65536, 1 << 20, 4 << 20]
IMPLS = {"allreduce": ["ours", "engine", "engine_", "gloo"], "ddp": ["ours", "gloo"],
         "fsdp": ["ours", "gloo"], "pipeline": ["ours", "gloo"]}
DDP_BATCH = 32
PIPE = dict(d=256, layers=8, batch=64, microbatches=8)
FSDP = dict(vocab=4096, d_model=256, layers=4, seq=64, batch=8)


# ------------------------------------------------------------------ the job (one rank)

class Job:
    """One rank's implementation: torch.distributed on `backend`, or the engine's call."""

    def __init__(self, impl):
        import torch
        import torch.distributed as dist
        torch.set_num_threads(1)
        self.torch, self.dist, self.impl = torch, dist, impl
        if impl in ("engine", "engine_"):
            import horovodlike.torch as hvd
            hvd.init()
            self.hvd, self.rank, self.size = hvd, hvd.rank(), hvd.size()
            return
        if impl in ("ours", "ours-direct"):
            import horovodlike.torch.distributed  # noqa: F401  (registers the backend)
            dist.init_process_group("horovodlike")
        else:
            dist.init_process_group("gloo", rank=int(os.environ["HOROVOD_RANK"]),
                                    world_size=int(os.environ["HOROVOD_SIZE"]))
        self.rank, self.size = dist.get_rank(), dist.get_world_size()

    # what bench/worker.py's timed() and calibrate_with() call
    def allreduce(self, x):                 # a numpy buffer: the ranks' agreement flag
        t = self.torch.from_numpy(x)
        if self.impl.startswith("engine"):
            self.hvd.allreduce_(t, name="bench.flag", op=self.hvd.Sum)
        else:
            self.dist.all_reduce(t)

    def barrier(self):
        if self.impl.startswith("engine"):
            self.hvd.barrier()
        else:
            self.dist.barrier()

    def reducer(self, t):
        """The timed call for one buffer."""
        if self.impl == "engine":
            hvd = self.hvd
            return lambda: hvd.allreduce(t, name="bench", op=hvd.Sum)
        if self.impl == "engine_":
            hvd = self.hvd
            return lambda: hvd.allreduce_(t, name="bench", op=hvd.Sum)
        dist = self.dist
        if self.impl == "ours-direct":
            group, opts = dist.group.WORLD, dist.AllreduceOptions()
            return lambda: group.allreduce([t], opts).wait()
        return lambda: dist.all_reduce(t)

    def close(self):
        if not self.impl.startswith("engine"):
            self.dist.destroy_process_group()


def load_example(name):
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(ROOT, "examples", name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def steps_timed(job, step, iters, per):
    """Seconds per step, one sample per `per` steps, `iters` samples (fixed counts, so
    every rank runs the same steps)."""
    out = []
    for _ in range(iters):
        job.barrier()
        t = time.perf_counter()
        for _ in range(per):
            step()
        out.append((time.perf_counter() - t) / per)
    return out


def warm_and_time(job, step, args, results, calibration, key, warmup, per):
    """`warmup` untimed steps, then steps_timed between two calibrations, under `key`."""
    import worker
    for _ in range(warmup):
        step()
    before = worker.calibrate(job)
    results[key] = steps_timed(job, step, args.iters, per)
    calibration[key] = [before, worker.calibrate(job)]


def case_allreduce(job, args, results, calibration):
    import worker
    before = worker.calibrate(job)
    for nbytes in SIZES:
        t = job.torch.ones(nbytes // 4)
        results[str(nbytes)] = worker.timed(job, job.reducer(t), budget=args.budget)
        after = worker.calibrate(job)
        calibration[str(nbytes)], before = [before, after], after
    # the result, once: every rank's rank + 1 summed
    t = job.torch.full((1024,), float(job.rank + 1))
    if job.impl == "engine":
        t.copy_(job.reducer(t)())
    else:
        job.reducer(t)()
    return float(t[0]) == job.size * (job.size + 1) / 2


def checksum(params):
    """The sum of |p| over this rank's parameters (its shards, under FSDP2): the same
    seeds, data and step counts give the same figure whatever carries the gradients, so
    each implementation's figure is compared with the others' (a wrong result shows)."""
    import torch
    with torch.no_grad():
        return float(sum(getattr(p, "to_local", lambda p=p: p)().abs().sum() for p in params))


def case_ddp(job, args, results, calibration):
    import torch
    import torch.nn.functional as F
    import worker
    from torch.nn.parallel import DistributedDataParallel as DDP
    ex = load_example("pytorch_synthetic_benchmark")
    torch.manual_seed(0)
    model = DDP(ex.MODELS["mlp"](argparse.Namespace(num_classes=10, image_size=32)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    data = torch.randn(DDP_BATCH, 3, 32, 32)
    target = torch.randint(0, 10, (DDP_BATCH,))

    def step():
        opt.zero_grad()
        F.cross_entropy(model(data), target).backward()
        opt.step()

    def local_step():                      # the same step without the gradient allreduce
        with model.no_sync():
            step()

    for _ in range(4):
        step()
    before = worker.calibrate(job)
    results["mlp"] = steps_timed(job, step, args.iters, 5)
    mid = worker.calibrate(job)
    results["mlp no_sync"] = steps_timed(job, local_step, args.iters, 5)
    after = worker.calibrate(job)
    calibration["mlp"], calibration["mlp no_sync"] = [before, mid], [mid, after]
    return checksum(model.parameters())


def case_fsdp(job, args, results, calibration):
    import torch
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    ex = load_example("pytorch_sharded_transformer")
    torch.manual_seed(0)
    c = FSDP
    model = ex.TransformerLM(c["vocab"], c["d_model"], c["layers"], heads=4,
                             ff=4 * c["d_model"], seq=c["seq"])
    mesh = init_device_mesh("cpu", (job.size,))
    for layer in model.encoder.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(job.rank)
    tokens = torch.randint(0, c["vocab"], (c["batch"], c["seq"] + 1), generator=g)

    def step():
        opt.zero_grad()
        logits = model(tokens[:, :-1])
        F.cross_entropy(logits.reshape(-1, c["vocab"]), tokens[:, 1:].reshape(-1)).backward()
        opt.step()

    warm_and_time(job, step, args, results, calibration, "transformer", 2, 1)
    return checksum(model.parameters())


def case_pipeline(job, args, results, calibration):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
    c, rank, p = PIPE, job.rank, job.size
    torch.manual_seed(0)
    layers = [m for _ in range(c["layers"]) for m in (nn.Linear(c["d"], c["d"]), nn.ReLU())]
    per = len(layers) // p
    mod = nn.Sequential(*layers[rank * per:(rank + 1) * per])
    mb = c["batch"] // c["microbatches"]
    stage = PipelineStage(mod, rank, p, torch.device("cpu"),
                          input_args=torch.empty(mb, c["d"]))
    opt = torch.optim.SGD(mod.parameters(), lr=1e-3)
    sched = ScheduleGPipe(stage, n_microbatches=c["microbatches"], loss_fn=F.mse_loss)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(c["batch"], c["d"], generator=g), torch.randn(c["batch"], c["d"], generator=g)

    def step():
        opt.zero_grad()
        if rank == 0:
            sched.step(x)
        elif rank == p - 1:
            sched.step(target=y, losses=[])
        else:
            sched.step()
        opt.step()

    warm_and_time(job, step, args, results, calibration, "gpipe", 2, 2)
    return checksum(mod.parameters())


CASES = {"allreduce": case_allreduce, "ddp": case_ddp, "fsdp": case_fsdp,
         "pipeline": case_pipeline}


def worker_main(args):
    job = Job(args.impl)
    results, calibration = {}, {}
    check = CASES[args.worker](job, args, results, calibration)
    if job.rank == 0:
        print("BENCH " + json.dumps({"impl": args.impl, "case": args.worker, "np": job.size,
                                     "results": results, "calibration": calibration,
                                     "check": check}),
              flush=True)
    job.barrier()
    job.close()


# ------------------------------------------------------------------ the driver

class Hung(Exception):
    pass


def run_job(impl, case, np_, args, launcher_args=(), extra_env=None, timeout=600):
    """Rank 0's BENCH record of one job; Hung when it outlived `timeout` (its whole
    process group is killed: the launcher and every rank)."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(house.free_port()),
               PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1")
    env.update(extra_env or {})
    cmd = [shutil.which("horovodlikerun") or "horovodlikerun", "-np", str(np_), *launcher_args,
           sys.executable, os.path.abspath(__file__), "--worker", case, "--impl", impl,
           "--budget", str(args.budget), "--iters", str(args.iters)]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise Hung(f"{impl} {case} np={np_}: killed after {timeout} s") from None
    finally:
        if p.poll() is None:
            try:
                os.killpg(p.pid, 9)
            except ProcessLookupError:
                pass
            p.communicate()
    for line in out.splitlines():
        if "BENCH " in line:
            return json.loads(line.split("BENCH ", 1)[1])
    raise RuntimeError(f"{impl} {case} at {np_} ranks failed ({p.returncode}):\n"
                       f"{out[-2000:]}\n{err[-3000:]}")


def collect(plan, args, rounds_of, hangs, checks, net=None):
    """plan: [(case key, worker case, np)]. Fills rounds_of[(key, np, label, impl)]."""
    for key, case, np_ in plan:
        impls = IMPLS[case]
        for rnd in range(args.rounds):
            for impl in (impls if rnd % 2 == 0 else impls[::-1]):
                t = time.time()
                extra = {**net.env(), **net.torch_env()} if net else {}
                la = net.launcher_args(per_node=np_ // 2) if net else ()
                timeout = args.pipeline_timeout if case == "pipeline" else 600
                try:
                    out = run_job(impl, case, np_, args, la, extra, timeout)
                except Hung as e:
                    hangs.setdefault(f"{key}/{np_}/{impl}", []).append(rnd + 1)
                    print(f"  {e}", file=sys.stderr, flush=True)
                    continue
                checks.setdefault(f"{key}/{np_}", {}).setdefault(impl, []).append(out["check"])
                for label, vals in out["results"].items():
                    rounds_of.setdefault((key, np_, label, impl), []).append(
                        {"round": rnd + 1, "seconds": vals,
                         "calibration": out["calibration"].get(label)})
                print(f"  {key} np={np_} round {rnd + 1}/{args.rounds} {impl}: "
                      f"{time.time() - t:.1f} s", file=sys.stderr, flush=True)


def hang_runs(args):
    """args.hang_runs pipelining jobs of ours, back to back: (hung, failed, seconds each)."""
    hung, failed, secs = 0, [], []
    for i in range(args.hang_runs):
        t = time.time()
        try:
            run_job("ours", "pipeline", 2, args, timeout=args.pipeline_timeout)
        except Hung:
            hung += 1
        except RuntimeError as e:
            failed.append(str(e)[-500:])
        secs.append(time.time() - t)
        print(f"  hang run {i + 1}/{args.hang_runs}: {secs[-1]:.1f} s (hung {hung}, "
              f"failed {len(failed)})", file=sys.stderr, flush=True)
    return hung, failed, secs


def check_report(checks):
    """One line per row: all_reduce results right in every job; for the training cases,
    whether every job's parameter checksum (rank 0's, after the same steps) agrees
    with the first job's within 1e-4 relative, or the figures."""
    lines = []
    for what, by_impl in checks.items():
        vals = [(i, v) for i, vs in by_impl.items() for v in vs]
        if all(isinstance(v, bool) for _, v in vals):
            bad = [i for i, v in vals if not v]
            lines.append(f"check {what}: " + ("every result right" if not bad else
                                              f"WRONG results from {sorted(set(bad))}"))
            continue
        ref = vals[0][1]
        off = [(i, v) for i, v in vals if abs(v - ref) > 1e-4 * abs(ref)]
        lines.append(f"check {what}: parameter checksums " +
                     ("agree across all jobs" if not off else
                      f"DIFFER: {vals}"))
    return lines


def label_name(label):
    return house.human(int(label)) if label.isdigit() else label


def report(rounds_of, hangs):
    """Markdown lines: a table per case key, ms cells as bench/run.py's, ours / peer."""
    lines = []
    for key in dict.fromkeys(k[0] for k in rounds_of):
        case = key.split("@")[0]
        impls = IMPLS[case]
        peers = impls[1:]
        head = ["row", "ranks"] + [f"{i} (ms)" for i in impls] + [f"ours/{p}" for p in peers]
        if case == "ddp":
            head += ["samples/s ours / gloo", "allreduce share of gloo's step"]
        rows = []
        rowkeys = sorted({k[1:3] for k in rounds_of if k[0] == key},
                         key=lambda k: (k[0], int(k[1]) if k[1].isdigit() else 0, k[1]))
        for np_, label in rowkeys:
            summ = {i: stats.summarize(rounds_of[(key, np_, label, i)])
                    for i in impls if (key, np_, label, i) in rounds_of}
            cells = [house.cell(summ[i], 1e3) if i in summ else "hangs" if
                     f"{key}/{np_}/{i}" in hangs else "-" for i in impls]
            ratios = [f"{stats.ratio(summ['ours'], summ[p]):.3g}" if "ours" in summ and p in summ
                      else "-" for p in peers]
            extra = []
            if case == "ddp":
                if label == "mlp" and "ours" in summ and "gloo" in summ:
                    b = DDP_BATCH * np_
                    o, g = b / summ["ours"]["median"], b / summ["gloo"]["median"]
                    local = (key, np_, "mlp no_sync", "gloo")
                    share = "-"
                    if local in rounds_of:
                        ns = stats.summarize(rounds_of[local])["median"]
                        share = f"{1 - ns / summ['gloo']['median']:.2f}"
                    extra = [f"{o:.0f} / {g:.0f} = {o / g:.2f}x", share]
                else:
                    extra = ["", ""]
            rows.append([label_name(label), str(np_)] + cells + ratios + extra)
        widths = [max(len(r[c]) for r in rows + [head]) for c in range(len(head))]
        fmt = lambda r: "| " + " | ".join(v.rjust(w) for v, w in zip(r, widths)) + " |"  # noqa: E731
        lines += [f"{key}:", fmt(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
        lines += [fmt(r) for r in rows] + [""]
    for what, rnds in hangs.items():
        lines.append(f"hung: {what}, round(s) {rnds}")
    return lines


def plot(rounds_of, hangs, path):
    """all_reduce time against size, one panel per place (one node; the fake nodes), a
    colour per implementation and a line style per rank count; and ours' step time over
    gloo's for every training row (DDP, FSDP2, pipelining, fake nodes)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    places = sorted({k[0] for k in rounds_of if k[0].startswith("allreduce")}, key=len)
    fig, axes = plt.subplots(1, len(places) + 1, figsize=(5 * (len(places) + 1), 4.4),
                             squeeze=False)
    colors = {"ours": "tab:blue", "ours-direct": "tab:purple", "engine": "tab:orange",
              "engine_": "tab:green", "gloo": "tab:red"}
    names = {"ours": 'dist.all_reduce, "horovodlike"', "ours-direct": "group.allreduce",
             "engine": "hvd.allreduce", "engine_": "hvd.allreduce_",
             "gloo": "dist.all_reduce, gloo"}
    for ax, key in zip(axes[0], places):
        for np_ in sorted({k[1] for k in rounds_of if k[0] == key}):
            for impl in colors:
                pts = sorted((int(k[2]), stats.summarize(v)["median"])
                             for k, v in rounds_of.items() if k[:2] == (key, np_) and k[3] == impl)
                if pts:
                    ax.plot([b for b, _ in pts], [t * 1e3 for _, t in pts], marker="o",
                            color=colors[impl], ls="-" if np_ == 2 else "--",
                            lw=2.2 if impl == "ours" else 1.2,
                            label=f"{names[impl]}, {np_} ranks")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(SIZES)
        ax.set_xticklabels([house.human(s).replace(" ", "") for s in SIZES])
        ax.set_xlabel("float32 all_reduce size")
        ax.set_ylabel("ms (median of rounds)")
        ax.set_title("all_reduce, " + ("one node" if key == "allreduce" else key.split("@")[1]),
                     fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    ax_r = axes[0][-1]
    bars, labels = [], []
    for (key, np_, label, impl), rs in sorted(rounds_of.items()):
        if impl != "ours" or key.startswith("allreduce") or label.endswith("no_sync"):
            continue
        peer = rounds_of.get((key, np_, label, "gloo"))
        if peer:
            bars.append(stats.ratio(stats.summarize(rs), stats.summarize(peer)))
            where = "" if "@" not in key else "\n" + key.split("@")[1]
            labels.append(f"{key.split('@')[0]} {np_}r{where}")
    for what in hangs:
        if what.endswith("/gloo"):
            k, n, _ = what.split("/")
            bars.append(0)
            labels.append(f"{k} {n}r\ngloo hangs")
    xs = range(len(bars))
    ax_r.bar(xs, bars, color=["tab:green" if b < 1 else "tab:red" for b in bars])
    for x, b in zip(xs, bars):
        ax_r.text(x, b + 0.02, f"{b:.2f}x" if b else "-", ha="center", fontsize=8)
    ax_r.axhline(1.0, color="grey", lw=0.8)
    ax_r.set_xticks(list(xs))
    ax_r.set_xticklabels(labels, fontsize=7)
    ax_r.set_ylabel('step time, "horovodlike" / gloo')
    ax_r.set_title("training steps, ours / gloo (lower is better)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"plot: {path}")


def load(path):
    with open(path) as f:
        raw = json.load(f)
    rounds_of = {}
    for r in raw["rounds"]:
        rounds_of.setdefault((r["key"], r["np"], r["label"], r["impl"]), []).append(r)
    return rounds_of, raw.get("hangs", {})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", choices=CASES)
    ap.add_argument("--impl", choices=["ours", "ours-direct", "gloo", "engine", "engine_"])
    ap.add_argument("--impls", help="all_reduce: comma-separated implementations (default "
                    + ",".join(IMPLS["allreduce"]) + "; ours-direct too)")
    ap.add_argument("--cases", default="allreduce,ddp,fsdp,pipeline,netns")
    ap.add_argument("--np", default="2,4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budget", type=float, default=0.5, help="all_reduce: seconds a size")
    ap.add_argument("--iters", type=int, default=6, help="timed samples of the step cases")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--netns-cases", default="allreduce,ddp")
    ap.add_argument("--pipeline-timeout", type=int, default=60)
    ap.add_argument("--hang-runs", type=int, default=50)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "torch_dist.json"))
    ap.add_argument("--plot", nargs="?", const=os.path.join(ROOT, "docs", "bench_torch_dist.png"))
    ap.add_argument("--replot", metavar="JSON")
    args = ap.parse_args()
    if args.worker:
        return worker_main(args)
    if args.replot:
        rounds_of, hangs = load(args.replot)
        house.mark_slow(rounds_of)
        print("\n".join(report(rounds_of, hangs)))
        return plot(rounds_of, hangs, args.plot or os.path.join(ROOT, "docs", "bench_torch_dist.png"))
    wanted = args.cases.split(",")
    if args.impls:
        IMPLS["allreduce"] = args.impls.split(",")
    nps = [int(n) for n in args.np.split(",")]
    rounds_of, hangs, notes, checks = {}, {}, [], {}
    t0 = time.time()
    load0 = os.getloadavg()
    plan = [(c, c, n) for c in ("allreduce", "ddp", "fsdp") if c in wanted for n in nps]
    if "pipeline" in wanted:
        plan.append(("pipeline", "pipeline", 2))
    collect(plan, args, rounds_of, hangs, checks)
    if "netns" in wanted:
        import netns
        why = netns.available()
        if why:
            notes.append(f"netns skipped: {why}")
        else:
            with netns.TwoNodes(rate=args.rate) as net:
                collect([(f"{c}@2x2 {args.rate}", c, 4) for c in args.netns_cases.split(",")],
                        args, rounds_of, hangs, checks, net)
    bases = house.mark_slow(rounds_of)
    lines = report(rounds_of, hangs)
    lines += check_report(checks)
    lines += house.slow_report(rounds_of)
    if bases:
        lines.append("calibration baselines: " + ", ".join(
            f"{n} ranks {b * 1e3:.1f} ms" for n, b in sorted(bases.items()) if b is not None))
    hang_line = None
    if "hangs" in wanted:
        hung, failed, secs = hang_runs(args)
        hang_line = (f"pipelining (ours, 2 stages, GPipe) back to back: {hung} of "
                     f"{args.hang_runs} runs hung (killed after {args.pipeline_timeout} s), "
                     f"{len(failed)} failed; each run {statistics.median(secs):.1f} s median, "
                     f"{max(secs):.1f} s max")
        lines.append(hang_line)
        lines += [f"failed run: {f}" for f in failed]
    load1 = os.getloadavg()
    lines.append(f"wall {time.time() - t0:.0f} s; load average (1 min) {load0[0]:.2f} at the "
                 f"start, {load1[0]:.2f} at the end, on {os.cpu_count()} cores")
    lines += [f"note: {n}" for n in notes]
    print("\n".join(lines))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"command": " ".join([sys.executable] + sys.argv), "hangs": hangs,
                   "checks": checks,
                   "summary": lines, "slow_factor": stats.SLOW_FACTOR,
                   "rounds": [dict(r, key=k[0], np=k[1], label=k[2], impl=k[3])
                              for k, rs in rounds_of.items() for r in rs]}, f, indent=1)
    print(f"raw samples: {args.out}")
    if args.plot:
        plot(rounds_of, hangs, args.plot)


if __name__ == "__main__":
    main()
