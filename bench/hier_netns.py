"""Hierarchical against flat-ring allreduce (or reducescatter) over two fake nodes joined
by a shaped link.

    sudo python bench/hier_netns.py --rates 1gbit,10gbit --sizes 16777216,67108864 --rounds 5
    sudo python bench/hier_netns.py --op reducescatter --rates 1gbit --rounds 3

2 nodes x 2 ranks (bench/netns.py: network namespaces, the link shaped with tc to each
rate). For every rate, the rounds alternate hier, ring, ring, hier... each in its own
job (bench/worker.py's sizes case; reducescatter: this file's own worker), so slow drift
of a shared machine hits both alike. HOROVODLIKE_ALLREDUCE_ALGORITHM picks the
algorithm of both ops.
Prints the median time of every (rate, size, algorithm) and hier/flat with the spread of
the per-round ratios, and writes the samples as JSON (--out).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netns  # noqa: E402
from run import ROOT, run_job  # noqa: E402


def reducescatter_worker(sizes, budget):
    """One rank: hvd.reducescatter of each size (float32 rows of 1), timed like
    bench/worker.py's sizes case; rank 0 prints the BENCH line."""
    import numpy as np
    import horovodlike as hvd
    hvd.init()
    results = {}
    for n in sizes:
        x = np.ones((n // 4, 1), np.float32)
        t = time.perf_counter()
        hvd.reducescatter(x, name=f"warm.{n}")
        # every rank runs the same count: rank 0's, from its warm-up call's time
        want = min(50, max(5, int(budget / (time.perf_counter() - t))))
        samples = []
        for _ in range(int(hvd.broadcast(np.array([want]), 0, name=f"k.{n}")[0])):
            t = time.perf_counter()
            hvd.reducescatter(x, name=f"rs.{n}")
            samples.append(time.perf_counter() - t)
        results[str(n)] = samples
    if hvd.rank() == 0:
        print("BENCH " + json.dumps({"results": results}), flush=True)


def run_reducescatter(net, sizes, budget, timeout, alg):
    """A 2 x 2 reducescatter job over `net`, as run.py's run_job runs an allreduce job."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1", HOROVODLIKE_ALLREDUCE_ALGORITHM=alg, **net.env())
    argv = [shutil.which("horovodlikerun") or "horovodlikerun", "-np", "4",
            *net.launcher_args(per_node=2), sys.executable, os.path.abspath(__file__),
            "--worker", "--sizes", ",".join(map(str, sizes)), "--budget", str(budget)]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    for line in res.stdout.splitlines():
        if "BENCH " in line:
            return json.loads(line.split("BENCH ", 1)[1])
    raise RuntimeError(f"reducescatter {alg} failed ({res.returncode}):\n{res.stdout[-2000:]}\n"
                       f"{res.stderr[-2000:]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rates", default="1gbit,10gbit")
    ap.add_argument("--sizes", default=f"{16 << 20},{64 << 20}")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budget", type=float, default=2.0, help="seconds per size per job")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--out", default=None)
    ap.add_argument("--op", default="allreduce", choices=["allreduce", "reducescatter"])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return reducescatter_worker([int(s) for s in args.sizes.split(",")], args.budget)
    why = netns.available()
    if why:
        sys.exit(f"hier_netns: {why}")
    sizes = [int(s) for s in args.sizes.split(",")]
    samples = {}                 # "rate size alg" -> [per-job median seconds]
    for rate in args.rates.split(","):
        with netns.TwoNodes(rate=rate) as net:
            for rnd in range(args.rounds):
                for alg in (("hier", "ring") if rnd % 2 == 0 else ("ring", "hier")):
                    if args.op == "reducescatter":
                        out = run_reducescatter(net, sizes, args.budget, args.timeout, alg)
                    else:
                        out = run_job("ours", 4, ["--case", "sizes", "--sizes", args.sizes,
                                                  "--budget", str(args.budget)], args.timeout,
                                      launcher_args=net.launcher_args(per_node=2),
                                      extra_env={**net.env(),
                                                 "HOROVODLIKE_ALLREDUCE_ALGORITHM": alg})
                    for n in sizes:
                        med = statistics.median(out["results"][str(n)])
                        samples.setdefault(f"{rate} {n} {alg}", []).append(med)
                        print(f"  {rate} round {rnd + 1}/{args.rounds} {alg} {n >> 20} MiB: "
                              f"{med * 1e3:.1f} ms", file=sys.stderr, flush=True)
    print("| link | size | flat ring (ms) | hierarchical (ms) | hier/flat (median) | per-round ratios |")
    print("|---|---|---|---|---|---|")
    for rate in args.rates.split(","):
        for n in sizes:
            flat, hier = samples[f"{rate} {n} ring"], samples[f"{rate} {n} hier"]
            ratios = sorted(h / f for h, f in zip(hier, flat))
            print(f"| {rate} | {n >> 20} MiB | {statistics.median(flat) * 1e3:.1f} | "
                  f"{statistics.median(hier) * 1e3:.1f} | "
                  f"{statistics.median(hier) / statistics.median(flat):.3f} | "
                  f"{' '.join(f'{r:.3f}' for r in ratios)} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(samples, f, indent=1)


if __name__ == "__main__":
    main()
