"""Draw bench/run.py's train-nodes results: img/s of every implementation at every link
rate (2 fake nodes x 2 ranks) and on one node, bars at the median of the rounds' medians
with their min..max, and print the case's report again.

    python bench/run.py --cases train-nodes --out results.json
    python bench/plot_train_nodes.py results.json -o docs/bench_train_nodes.png
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402

NAMES = {"1node-2": "one node\n2 ranks", "1node-4": "one node\n4 ranks",
         "100mbit": "2 x 2 ranks\n100 Mbit/s", "1gbit": "2 x 2 ranks\n1 Gbit/s",
         "10gbit": "2 x 2 ranks\n10 Gbit/s"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json", help="the --out file of bench/run.py --cases train-nodes")
    ap.add_argument("-o", "--out", default="docs/bench_train_nodes.png")
    args = ap.parse_args()
    with open(args.json) as f:
        data = json.load(f)["train_nodes"]
    rounds = max(len(v) for v in data.values())
    print("\n".join(run.train_nodes_report(data, rounds)))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    places = [p for p in run.TRAIN_NODES_PLACES if any(k.startswith(p + "/") for k in data)]
    labels = [lab for lab, _, _ in run.TRAIN_NODES_IMPLS + run.TRAIN_NODES_EXTRA
              if any(k.endswith("/" + lab) for k in data)]
    width = 0.8 / len(labels)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for j, lab in enumerate(labels):
        xs, med, lo, hi = [], [], [], []
        for i, place in enumerate(places):
            rows = data.get(f"{place}/{lab}")
            if not rows:
                continue
            m = [statistics.median(r["img_s"]) for r in rows]
            xs.append(i + (j - (len(labels) - 1) / 2) * width)
            med.append(statistics.median(m))
            lo.append(med[-1] - min(m))
            hi.append(max(m) - med[-1])
        ax.bar(xs, med, width, yerr=[lo, hi], capsize=2, label=lab,
               hatch="//" if lab.startswith("DDP") else None, alpha=0.85)
        for x, v in zip(xs, med):
            ax.text(x, v * 1.05, f"{v:.0f}", ha="center", va="bottom", fontsize=6, rotation=90)
    ax.set_yscale("log")
    ax.set_xticks(range(len(places)))
    ax.set_xticklabels([NAMES.get(p, p) for p in places], fontsize=8)
    ax.set_ylabel("img/s over all ranks (log)")
    ax.set_title("MLP (7 MiB of gradients), batch 32 per rank: horovodlike against torch DDP "
                 "(gloo)\nbar: median of the rounds' medians, whisker: min..max", fontsize=9)
    ax.legend(fontsize=8, ncol=3)
    ax.grid(axis="y", alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
