"""Draw bench/pipeline.py's results: horovodlike's step time over torch.distributed.pipelining's,
one bar per run (p, d, m), at the median of the per-round ratios with the min..max spread,
against the issue's targets (1.0x compute-bound, 0.7x communication-bound).

    python bench/pipeline.py ... --json pipeline.jsonl      # once per row
    python bench/plot_pipeline.py pipeline.jsonl -o docs/bench_pipeline.png
"""
import argparse
import json
import statistics


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("jsonl", help="the file bench/pipeline.py --json appended to")
    ap.add_argument("-o", "--out", default="docs/bench_pipeline.png")
    args = ap.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in open(args.jsonl) if line.strip()]
    labels, med, lo, hi, targets = [], [], [], [], []
    for r in rows:
        # rounds alternate the two modes, so round i of each is a pair taken minutes apart
        ratios = [h / t for h, t in zip(r["ms"]["hvd"], r["ms"]["torch"])]
        labels.append(f"p={r['np']} d={r['d']} m={r['microbatches']}\n"
                      f"hangs {r['hangs']['hvd']}/{r['hangs']['torch']}")
        med.append(statistics.median(ratios))
        lo.append(med[-1] - min(ratios))
        hi.append(max(ratios) - med[-1])
        # d = 64 with many micro-batches is the message-bound case of the issue
        targets.append(0.7 if r["d"] <= 64 else 1.0)

    fig, ax = plt.subplots(figsize=(7, 4))
    xs = range(len(rows))
    colors = ["tab:green" if m <= t else "tab:red" for m, t in zip(med, targets)]
    ax.bar(xs, med, yerr=[lo, hi], capsize=5, color=colors, alpha=0.8)
    for x, t in zip(xs, targets):
        ax.plot([x - 0.4, x + 0.4], [t, t], "k--", lw=1)
    for x, m in zip(xs, med):
        ax.text(x, m / 2, f"{m:.2f}x", ha="center", color="white", weight="bold")
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel("step time, horovodlike / torch pipelining")
    ax.set_title("1F1B training step against torch.distributed.pipelining (gloo)\n"
                 "bar: median of per-round ratios, whisker: min..max, dashed: target",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
