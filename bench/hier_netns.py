"""Hierarchical against flat-ring allreduce over two fake nodes joined by a shaped link.

    sudo python bench/hier_netns.py --rates 1gbit,10gbit --sizes 16777216,67108864 --rounds 5

2 nodes x 2 ranks (bench/netns.py: network namespaces, the link shaped with tc to each
rate). For every rate, the rounds alternate hier, ring, ring, hier... each in its own
job (bench/worker.py's sizes case), so slow drift of a shared machine hits both alike.
Prints the median time of every (rate, size, algorithm) and hier/flat with the spread of
the per-round ratios, and writes the samples as JSON (--out).
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netns  # noqa: E402
from run import run_job  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rates", default="1gbit,10gbit")
    ap.add_argument("--sizes", default=f"{16 << 20},{64 << 20}")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budget", type=float, default=2.0, help="seconds per size per job")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    why = netns.available()
    if why:
        sys.exit(f"hier_netns: {why}")
    sizes = [int(s) for s in args.sizes.split(",")]
    samples = {}                 # "rate size alg" -> [per-job median seconds]
    for rate in args.rates.split(","):
        with netns.TwoNodes(rate=rate) as net:
            for rnd in range(args.rounds):
                for alg in (("hier", "ring") if rnd % 2 == 0 else ("ring", "hier")):
                    out = run_job("ours", 4, ["--case", "sizes", "--sizes", args.sizes,
                                              "--budget", str(args.budget)], args.timeout,
                                  launcher_args=net.launcher_args(per_node=2),
                                  extra_env={**net.env(), "HOROVODLIKE_ALLREDUCE_ALGORITHM": alg})
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
