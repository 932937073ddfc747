"""Pipeline parallelism end to end: one training step of the same model, schedule and
micro-batches, at p stages on one node, in

  hvd      horovodlike.torch.pipeline (PipelineModule + Schedule1F1B / ScheduleGPipe),
           p ranks under horovodlikerun (point-to-point messages over shared memory)
  torch    torch.distributed.pipelining (PipelineStage + the schedule of the same name)
           over gloo, p processes

The model is a stack of `--layers` blocks Linear(d, d) + ReLU cut evenly into p stages,
float32, batch `--batch` split into m micro-batches, MSE loss, SGD; one torch thread per
process. Each run is its own processes, and the order alternates every round. A run that
does not finish within --timeout seconds is killed and counted as a hang. Printed per
mode: the median of the per-round median step times, their spread over rounds, and the
hang count.

    python bench/pipeline.py --np 2 --d 512 --microbatches 8 --rounds 5     # compute-bound
    python bench/pipeline.py --np 2 --d 64 --microbatches 32 --rounds 5     # message-bound

--detail DIR adds, per rank, where the measured steps' time went (per-thread CPU and
run-queue wait, context switches, horovodlike's time blocked in recv); --json FILE
appends the per-round figures for bench/plot_pipeline.py.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODES = ["hvd", "torch"]
LABELS = {"hvd": "horovodlike pipeline (p2p, shm)",
          "torch": "torch.distributed.pipelining (gloo)"}


def _layers(args):
    import torch.nn as nn
    out = []
    for _ in range(args.layers):
        out += [nn.Linear(args.d, args.d), nn.ReLU()]
    return out


def _data(args):
    import torch
    g = torch.Generator().manual_seed(0)
    return (torch.randn(args.batch, args.d, generator=g),
            torch.randn(args.batch, args.d, generator=g))


def _threads():
    """Per thread of this process: CPU ns run, ns waited on a run queue (schedstat),
    voluntary and involuntary context switches."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            run, waited, _ = open(f"/proc/self/task/{tid}/schedstat").read().split()
            st = dict(line.split(":\t") for line in
                      open(f"/proc/self/task/{tid}/status").read().splitlines()
                      if ":\t" in line)
        except (OSError, ValueError):
            continue                               # the thread ended meanwhile
        out[tid] = [int(run), int(waited), int(st["voluntary_ctxt_switches"]),
                    int(st["nonvoluntary_ctxt_switches"])]
    return out


def _detail(args, mode, rank, before, after, extra):
    """With --detail DIR: where this rank's time went over the measured steps, per
    thread (the main thread is the one whose id is the process's), to DIR/mode.rank.json."""
    if not args.detail:
        return
    main = str(os.getpid())
    rows = {("main" if t == main else t): [b - a for a, b in zip(before.get(t, [0] * 4), v)]
            for t, v in after.items()}
    with open(os.path.join(args.detail, f"{mode}.{rank}.json"), "w") as f:
        json.dump(dict(extra, rank=rank, steps=args.steps,
                       threads={t: dict(zip(("run_ns", "runq_wait_ns", "vcsw", "ivcsw"), v))
                                for t, v in rows.items()}), f)


def worker_hvd(args):
    import torch
    import torch.nn.functional as F
    import horovodlike.torch as hvd
    from horovodlike.common.topology import Topology
    from horovodlike.torch.pipeline import PipelineModule, Schedule1F1B, ScheduleGPipe
    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(0)
    topo = Topology(pp=hvd.size())
    pipe = PipelineModule(_layers(args), topology=topo, partition="uniform",
                          loss_fn=F.mse_loss)
    opt = torch.optim.SGD(pipe.parameters(), lr=1e-3)
    cls = Schedule1F1B if args.schedule == "1f1b" else ScheduleGPipe
    sched = cls(pipe, microbatches=args.microbatches)
    x, y = _data(args)
    times, waits, walls = [], [], []
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            before = _threads()
        t0 = time.perf_counter()
        opt.zero_grad()
        sched.train_batch(x, y)
        opt.step()
        times.append(time.perf_counter() - t0)
        waits.append(sched.last_wait_s)
        walls.append(sched.last_wall_s)
    _detail(args, "hvd", hvd.rank(), before, _threads(),
            {"step_s": times[args.warmup:], "recv_wait_s": waits[args.warmup:],
             "train_batch_s": walls[args.warmup:]})
    if hvd.rank() == 0:
        print(json.dumps({"times": times[args.warmup:]}), flush=True)
    # the last stage finishes its last batch first; a shutdown now would end the job
    # before the first stage has received its last messages (see docs/pipeline.md)
    hvd.barrier()
    hvd.shutdown()


def worker_torch(args):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, p = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    layers = _layers(args)
    per = len(layers) // p
    stage_mod = nn.Sequential(*layers[rank * per:(rank + 1) * per if rank < p - 1 else None])
    mb = args.batch // args.microbatches
    stage = PipelineStage(stage_mod, rank, p, torch.device("cpu"),
                          input_args=torch.empty(mb, args.d))
    opt = torch.optim.SGD(stage_mod.parameters(), lr=1e-3)
    cls = Schedule1F1B if args.schedule == "1f1b" else ScheduleGPipe
    sched = cls(stage, n_microbatches=args.microbatches, loss_fn=F.mse_loss)
    x, y = _data(args)
    times = []
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            before = _threads()
        t0 = time.perf_counter()
        opt.zero_grad()
        if rank == 0:
            sched.step(x)
        elif rank == p - 1:
            sched.step(target=y, losses=[])
        else:
            sched.step()
        opt.step()
        times.append(time.perf_counter() - t0)
    _detail(args, "torch", rank, before, _threads(), {"step_s": times[args.warmup:]})
    if rank == 0:
        print(json.dumps({"times": times[args.warmup:]}), flush=True)
    dist.destroy_process_group()


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


def _kill(procs):
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, 9)
            except ProcessLookupError:
                pass
        p.wait()


def run_mode(mode, args):
    """The step times of one run, or None when it hung (killed after --timeout)."""
    me = [sys.executable, os.path.abspath(__file__), "--worker", mode] + \
        [f"--{k}={getattr(args, k)}" for k in ("d", "layers", "batch", "microbatches",
                                                "schedule", "steps", "warmup")] + \
        ([f"--detail={os.path.abspath(args.detail)}"] if args.detail else [])
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if mode == "hvd":
        cmds = [(["horovodlikerun", "-np", str(args.np)] + me, env)]
    else:
        port = _free_port()
        cmds = [(me, dict(env, RANK=str(r), WORLD_SIZE=str(args.np), MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))) for r in range(args.np)]
    procs = [subprocess.Popen(c, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, start_new_session=True) for c, e in cmds]
    deadline = time.monotonic() + args.timeout
    text = ""
    try:
        for p in procs:
            o, e = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            text += o
            if p.returncode:
                raise RuntimeError(f"{mode} run failed:\n{e[-3000:]}")
    except subprocess.TimeoutExpired:
        return None
    finally:
        _kill(procs)
    return _result(text)["times"]


def print_detail(d, modes, np_):
    """Per rank, per measured step: where the time of bench/pipeline.py --detail went."""
    print("per rank, per step (last round): step ms, recv wait ms (horovodlike), CPU ms of "
          "the main thread / of all other threads, run-queue wait ms (all threads), "
          "context switches voluntary / involuntary (all threads), busy threads")
    for m in modes:
        for r in range(np_):
            try:
                x = json.load(open(os.path.join(d, f"{m}.{r}.json")))
            except OSError:
                continue
            n, th = x["steps"], x["threads"]
            busy = sum(1 for v in th.values() if v["run_ns"] > 1e6)
            main_ms = th["main"]["run_ns"] / n / 1e6
            other_ms = sum(v["run_ns"] for t, v in th.items() if t != "main") / n / 1e6
            runq = sum(v["runq_wait_ns"] for v in th.values()) / n / 1e6
            vc = sum(v["vcsw"] for v in th.values()) / n
            ic = sum(v["ivcsw"] for v in th.values()) / n
            wait = (f"{statistics.median(x['recv_wait_s']) * 1e3:6.2f}"
                    if "recv_wait_s" in x else "     -")
            print(f"  {m:5s} rank {r}: step {statistics.median(x['step_s']) * 1e3:7.2f}  "
                  f"recv wait {wait}  CPU main {main_ms:6.2f} other {other_ms:6.2f}  "
                  f"runq {runq:6.2f}  csw {vc:6.0f} / {ic:4.0f}  busy threads {busy}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", choices=MODES)
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--d", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--schedule", choices=["1f1b", "gpipe"], default="1f1b")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--timeout", type=int, default=120)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--detail", help="each rank writes where its time went (per-thread CPU, "
                    "run-queue wait, context switches; horovodlike also its recv waits) "
                    "to DIR/<mode>.<rank>.json, the last round's")
    ap.add_argument("--json", help="append this run's per-round figures, as one JSON line, "
                    "to this file (bench/plot_pipeline.py draws them)")
    args = ap.parse_args()
    if args.worker:
        {"hvd": worker_hvd, "torch": worker_torch}[args.worker](args)
        return
    modes = args.modes.split(",")
    per_round = {m: [] for m in modes}
    hangs = {m: 0 for m in modes}
    for r in range(args.rounds):
        for m in (modes if r % 2 == 0 else modes[::-1]):
            times = run_mode(m, args)
            if times is None:
                hangs[m] += 1
                print(f"round {r} {m}: hung (killed after {args.timeout} s)", file=sys.stderr,
                      flush=True)
                continue
            per_round[m].append(statistics.median(times) * 1e3)
            print(f"round {r} {m}: {per_round[m][-1]:.2f} ms", file=sys.stderr, flush=True)
    print(f"{args.schedule} p={args.np} m={args.microbatches} d={args.d} layers={args.layers} "
          f"batch={args.batch}, {args.rounds} rounds × {args.steps} steps: median (min..max) "
          f"step ms, hangs")
    for m in modes:
        v = per_round[m]
        cell = (f"{statistics.median(v):8.2f}  ({min(v):.2f}..{max(v):.2f})" if v
                else "       -")
        print(f"  {LABELS[m]:40s} {cell}  hangs {hangs[m]}/{args.rounds}")
    if all(per_round.get(m) for m in ("hvd", "torch")):
        paired = [h / t for h, t in zip(per_round["hvd"], per_round["torch"])]
        print(f"  horovodlike / torch: per round {statistics.median(paired):.2f}x "
              f"({min(paired):.2f}..{max(paired):.2f})")
    if args.detail:
        print_detail(args.detail, modes, args.np)
    if args.json:
        # per-round medians in ms, in round order; a hung run leaves no entry
        with open(args.json, "a") as f:
            f.write(json.dumps({
                "np": args.np, "d": args.d, "microbatches": args.microbatches,
                "layers": args.layers, "batch": args.batch, "schedule": args.schedule,
                "rounds": args.rounds, "steps": args.steps, "ms": per_round, "hangs": hangs,
                "loadavg": os.getloadavg()[0], "when": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                     time.gmtime())}) + "\n")


if __name__ == "__main__":
    main()
