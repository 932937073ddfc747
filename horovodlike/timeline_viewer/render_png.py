"""Swim lanes as a PNG (matplotlib, Agg): one row per (rank, lane) on one time axis, with
step marks, and below it each rank's time split into moving data / waiting / idle.

Events narrower than a pixel are merged with their neighbours before drawing, so a
trace of millions of events still draws in about the time of a few thousand.
"""
import textwrap

import numpy as np

from .fmt import fmt_ms
from .analyses.stragglers import late_intervals
from .model import COMPLETE, CYCLES, INSTANT, NEGOTIATE, union
from .style import LATE_COLOR, color_for

MAX_ROWS = 96          # beyond this, one row per rank (lanes overlaid)
WIDTH_PX = 1600


def _merge_close(s, e, eps):
    """Union of intervals, bridging gaps shorter than eps (sub-pixel)."""
    if s.size == 0:
        return s, e
    us, ue = union(s, e + eps)
    return us, np.maximum(ue - eps, us + eps)        # at least one pixel wide


def _rows(tl, collapse):
    rows = []                   # (rank, lanes tuple, label)
    for r, rt in tl.ranks.items():
        lanes = sorted(int(x) for x in np.unique(rt.lane[rt.phase == COMPLETE])
                       if int(x) != CYCLES)
        if collapse:
            rows.append((r, tuple(lanes), f"rank {r}"))
        else:
            rows.extend((r, (t,), f"rank {r} {rt.lane_label(t)}") for t in lanes)
    return rows


def fit_title(fig, ax, text, fontsize=10):
    """The headline above the lanes, whole: wrapped onto as many lines as it needs to
    fit the lanes' width, never cut."""
    title = ax.set_title(text, fontsize=fontsize, loc="left")
    renderer = fig.canvas.get_renderer()
    room = ax.get_window_extent(renderer).width            # the lanes' width
    cols = len(text)
    while cols > 20 and title.get_window_extent(renderer).width > room:
        # characters per line in proportion to the room, then one less until it fits
        cols = min(cols - 1, int(cols * room / title.get_window_extent(renderer).width))
        title.set_text(textwrap.fill(text, max(cols, 20)))
    return title


def render_png(rep, path, width_px=WIDTH_PX):
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    tl, st = rep.timeline, rep.stragglers
    lo, hi = tl.span()
    span = max(hi - lo, 1.0)
    scale, unit = (1e6, "s") if span > 20e6 else (1e3, "ms")
    n_lanes = sum(len(set(rt.lane.tolist()) - {CYCLES}) for rt in tl.ranks.values())
    collapse = n_lanes > MAX_ROWS
    rows = _rows(tl, collapse)
    n_ranks = len(tl.ranks)

    dpi = 100
    lane_h = 0.24 if not collapse else max(0.06, 0.24 * MAX_ROWS / max(len(rows), 1) / 2)
    top_h = 0.6 + max(len(rows), 1) * lane_h
    bot_h = 0.5 + 0.22 * n_ranks
    fig = plt.figure(figsize=(width_px / dpi, min(top_h + bot_h + 1.2, 60)), dpi=dpi)
    gs = fig.add_gridspec(2, 1, height_ratios=[top_h, bot_h], hspace=0.35)
    ax = fig.add_subplot(gs[0])
    eps = span / width_px                           # one pixel, in us

    used = {}
    for y, (r, lanes, _label) in enumerate(rows):
        rt = tl.ranks[r]
        m = (rt.phase == COMPLETE) & np.isin(rt.lane, lanes)
        for nid in np.unique(rt.name[m]):
            k = m & (rt.name == nid)
            name = tl.strings[int(nid)]
            s, e = _merge_close(rt.t[k], rt.t[k] + rt.dur[k], eps)
            color = color_for(name)
            used.setdefault(name, color)
            ax.broken_barh(list(zip((s - lo) / scale, (e - s) / scale)), (y - 0.4, 0.8),
                           facecolors=color, edgecolors="none")
        if NEGOTIATE in lanes and st.n:
            ls, le = late_intervals(st, r)
            if ls.size:
                ls, le = _merge_close(ls, le, eps)
                ax.broken_barh(list(zip((ls - lo) / scale, (le - ls) / scale)),
                               (y - 0.2, 0.4), facecolors=LATE_COLOR, edgecolors="none")
                used.setdefault("others waiting for this rank", LATE_COLOR)
        err = tl.name_id("ERROR")
        if err >= 0:
            for t in rt.t[(rt.name == err) & (rt.phase == INSTANT)]:
                ax.plot([(t - lo) / scale], [y], marker="v", color=LATE_COLOR, ms=6)

    # Step marks from the reference rank, as thin vertical lines.
    marks = np.array([s.start_us for s in rep.steps.steps])
    if 0 < marks.size <= width_px // 6:
        ax.vlines((marks - lo) / scale, -0.5, len(rows) - 0.5, colors="#555555", lw=0.4,
                  alpha=0.5, zorder=0)

    # Highlight the slow rank's rows.
    slow = st.verdict.slow_rank
    if slow is not None:
        for y, (r, _, _) in enumerate(rows):
            if r == slow:
                ax.axhspan(y - 0.5, y + 0.5, color=LATE_COLOR, alpha=0.06, zorder=0)

    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([lab for _, _, lab in rows],
                       fontsize=8 if len(rows) <= 48 else 5)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, span / scale)
    ax.set_xlabel(f"time ({unit}) since the first event, all ranks aligned")
    ax.grid(axis="x", color="#dddddd", lw=0.5)
    ax.set_axisbelow(True)
    fit_title(fig, ax, st.verdict.sentence)
    handles = [Patch(color=c, label=n) for n, c in list(used.items())[:16]]
    if handles:
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1),
                  frameon=False)

    # Where the time goes, per rank.
    bx = fig.add_subplot(gs[1])
    ranks = sorted(rep.phases)
    parts = [("moving data", "#1f77b4", "data_us"), ("waiting", "#f5b041", "waiting_us"),
             ("idle", "#dddddd", "idle_us")]
    left = np.zeros(len(ranks))
    for label, color, attr in parts:
        vals = np.array([getattr(rep.phases[r], attr) / max(rep.phases[r].span_us, 1.0)
                         for r in ranks])
        bx.barh(range(len(ranks)), vals * 100, left=left, color=color, label=label,
                height=0.7)
        left += vals * 100
    last = {p.rank: p for p in st.per_rank}
    labels = []
    for r in ranks:
        p = last.get(r)
        extra = f"  last {p.share:.0%}, {fmt_ms(p.mean_late_us)}" if p and p.n_last else ""
        labels.append(f"rank {r}{extra}")
    bx.set_yticks(range(len(ranks)))
    bx.set_yticklabels(labels, fontsize=7 if len(ranks) <= 32 else 4)
    bx.set_ylim(len(ranks) - 0.5, -0.5)
    bx.set_xlim(0, 100)
    bx.set_xlabel("% of the rank's traced span")
    bx.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1), frameon=False)
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return path
