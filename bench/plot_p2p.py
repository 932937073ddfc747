"""Draw bench/p2p.py --json: one-way time and bandwidth per message size, one line per
backend, with the 10th..90th percentile over rounds as the band.

    mpirun -np 2 python bench/p2p.py --json p2p.json
    python bench/plot_p2p.py p2p.json -o docs/bench_p2p.png
"""
import argparse
import json


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json", help="the file bench/p2p.py --json wrote")
    ap.add_argument("-o", "--out", default="docs/bench_p2p.png")
    args = ap.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = json.load(open(args.json))
    rows = res["rows"]
    sizes = [r["bytes"] for r in rows]
    fig, (lat, bw) = plt.subplots(1, 2, figsize=(10, 4))
    for k in rows[0]["median_s"]:
        med = [r["median_s"][k] for r in rows]
        lo = [r["p10_p90_s"][k][0] for r in rows]
        hi = [r["p10_p90_s"][k][1] for r in rows]
        line, = lat.plot(sizes, [t * 1e6 for t in med], "o-", label=k)
        lat.fill_between(sizes, [t * 1e6 for t in lo], [t * 1e6 for t in hi],
                         color=line.get_color(), alpha=0.2)
        bw.plot(sizes, [s / t / 1e9 for s, t in zip(sizes, med)], "o-", label=k)
        bw.fill_between(sizes, [s / t / 1e9 for s, t in zip(sizes, hi)],
                        [s / t / 1e9 for s, t in zip(sizes, lo)],
                        color=line.get_color(), alpha=0.2)
    for ax, what in ((lat, "one-way time (us)"), (bw, "bandwidth (GB/s)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message bytes")
        ax.set_ylabel(what)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(f"p2p ping-pong, 2 ranks, one node: median of {res['rounds']} alternated "
                 f"rounds (band: 10th..90th percentile)", fontsize=9)
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
