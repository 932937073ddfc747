"""What the summary says, whatever it is rendered as: the title line, the headline (the
answer first) and the titled sections with their tables. Every cell is already a
formatted string or number; render_text lays them out in fixed-width columns and
render_html as HTML tables."""
import numpy as np

from .fmt import fmt_bytes, fmt_ms, fmt_pct, fmt_rate


def _ranks_label(ids):
    if not ids:
        return "none"
    runs, start = [], ids[0]
    for a, b in zip(ids, ids[1:] + [None]):
        if b != a + 1:
            runs.append(str(start) if start == a else f"{start}-{a}")
            start = b
    return ",".join(runs)


def pipeline_sentence(pl):
    """Who holds a pipeline up, in one sentence (None without a pipeline batch)."""
    if pl is None or pl.bottleneck < 0:
        return None
    b = pl.ranks[pl.bottleneck]
    others = [r.bubble for r in pl.ranks.values() if r.rank != b.rank]
    mean = sum(others) / len(others) if others else 0.0
    if not others or max(others) - b.bubble < 0.02:      # within the measurement's noise
        return (f"Pipeline ({pl.stages} stages, {pl.microbatches} micro-batches, "
                f"{pl.batches} batches): the stages are balanced, each idle "
                f"{fmt_pct(b.bubble)}-{fmt_pct(max(others or [b.bubble]))}; the bubble of "
                f"equal stages is (p-1)/(m+p-1) = {fmt_pct(pl.ideal)}.")
    return (f"Pipeline ({pl.stages} stages, {pl.microbatches} micro-batches, {pl.batches} "
            f"batches): stage {b.stage} (rank {b.rank}) holds the others up, idle "
            f"{fmt_pct(b.bubble)} while the others idle {fmt_pct(mean)} on average; the "
            f"bubble of equal stages is (p-1)/(m+p-1) = {fmt_pct(pl.ideal)}.")


def headline(rep):
    """The first lines: who is slow, and where the time goes."""
    st = rep.stragglers
    lines = [st.verdict.sentence]
    pl = pipeline_sentence(rep.pipeline)
    if pl:
        lines.append(pl)
    ph = rep.phases
    if not ph:
        return lines
    slow = st.verdict.slow_rank
    if slow is not None and slow in ph and len(ph) > 1:
        others = [p for r, p in ph.items() if r != slow and p.span_us > 0]
        if others:
            wait = np.mean([p.waiting_us / p.span_us for p in others])
            sp = ph[slow]
            idle = sp.idle_us / sp.span_us if sp.span_us else 0.0
            lines.append(f"The other ranks spent {fmt_pct(wait)} of their time waiting in "
                         f"negotiation; rank {slow} spent {fmt_pct(idle)} idle (in its own "
                         f"code, before submitting).")
            if st.per_tensor:
                worst = max(st.per_tensor, key=lambda p: p.total_late_us
                            if p.last_rank == slow else -1)
                if worst.last_rank == slow:
                    lines.append(f"Its worst tensor: {worst.tensor} ({worst.op}), last "
                                 f"{fmt_pct(worst.last_share)} of the time, on average "
                                 f"{fmt_ms(worst.mean_late_us)} late.")
    else:
        live = [p for p in ph.values() if p.span_us > 0]
        if live:
            d = np.mean([p.data_us / p.span_us for p in live])
            w = np.mean([p.waiting_us / p.span_us for p in live])
            i = np.mean([p.idle_us / p.span_us for p in live])
            lines.append(f"On average the ranks spent {fmt_pct(d)} of their time moving "
                         f"data, {fmt_pct(w)} waiting in negotiation and {fmt_pct(i)} idle "
                         f"(in the training script).")
    return lines


class Section:
    """One titled table (or a few lines) of the summary; rendered as text or HTML."""

    def __init__(self, title, headers=None, rows=None, right=None, lines=None, key=""):
        self.title, self.headers, self.rows = title, headers, rows or []
        self.right = set(range(1, len(headers))) if right is None and headers else \
            set(right or ())
        self.lines = lines or []          # sentences after the table
        self.key = key                    # a stable id for the HTML page


def title_line(rep):
    tl = rep.timeline
    lo, hi = tl.span()
    nsteps = len(rep.steps.steps)
    return (f"horovodlike timeline: {tl.size} rank(s), files for rank(s) "
            f"{_ranks_label(tl.rank_ids)}, {tl.n_events} events, {fmt_ms(hi - lo)} traced"
            + (f", {nsteps} steps" if nsteps else ""))


def sections(rep):
    tl, st, top = rep.timeline, rep.stragglers, rep.top
    out = []

    if rep.phases:
        rows = []
        for r, p in sorted(rep.phases.items()):
            s = p.span_us or 1.0
            rows.append([r, fmt_ms(p.span_us), fmt_pct(p.data_us / s),
                         fmt_pct(p.waiting_us / s), fmt_pct(p.idle_us / s)])
        out.append(Section("Where the time goes (share of each rank's traced span)",
                           ["rank", "span", "moving data", "waiting (negotiate/queue)",
                            "idle (no engine work)"], rows, key="time"))

    if st.n:
        src = " (from rank 0's ready_us for some rounds)" if (st.source == 1).any() else ""
        rows = [[p.rank, p.n_last, fmt_pct(p.share),
                 fmt_ms(p.mean_late_us) if p.n_last else "-",
                 fmt_ms(p.max_late_us) if p.n_last else "-",
                 fmt_ms(p.total_late_us) if p.n_last else "-"]
                for p in st.per_rank]
        out.append(Section(
            f"Who was last to submit ({st.n} tensor rounds matched across ranks{src}; "
            f"'late' = behind the second-to-last rank)",
            ["rank", "last on", "share", "mean late", "max late", "others waited"], rows,
            key="last"))
        rows = [[p.tensor, p.op, p.n, f"rank {p.last_rank} ({fmt_pct(p.last_share)})",
                 fmt_ms(p.mean_late_us), fmt_ms(p.max_late_us), fmt_ms(p.mean_spread_us)]
                for p in st.per_tensor[:top]]
        out.append(Section(f"Tensors by waiting caused (top {top})",
                           ["tensor", "op", "rounds", "usually last", "mean late",
                            "max late", "mean first->last"], rows, right={2, 4, 5, 6},
                           key="tensors"))
    if rep.top_rounds:
        rows = [[i + 1, s.rank, s.tensor, fmt_ms(s.late_us), fmt_ms(s.spread_us),
                 s.step if s.step >= 0 else "-", fmt_ms(s.t_us)]
                for i, s in enumerate(rep.top_rounds)]
        out.append(Section(f"Top {len(rep.top_rounds)} stragglers (single rounds)",
                           ["#", "rank", "tensor", "late", "behind first", "step", "at"],
                           rows, right={0, 1, 3, 4, 5, 6}, key="top"))
        if rep.top_pairs:
            rows = [[p.rank, p.tensor, p.times_last, fmt_ms(p.total_late_us),
                     fmt_ms(p.mean_late_us)] for p in rep.top_pairs]
            out.append(Section("Costliest (rank, tensor) pairs",
                               ["rank", "tensor", "times last", "total late", "mean late"],
                               rows, right={0, 2, 3, 4}, key="pairs"))

    sp = rep.steps
    if sp.steps:
        d = sp.durations_us
        worst = ", ".join(f"rank {r} in {n}" for r, n in
                          sorted(sp.worst_counts.items(), key=lambda x: -x[1])[:4])
        slowest = sorted(sp.steps, key=lambda s: -s.worst_late_us)[:top]
        rows = [[s.number, fmt_ms(s.start_us), fmt_ms(s.duration_us), s.n_instances,
                 s.worst_rank if s.worst_rank >= 0 else "-",
                 fmt_ms(s.worst_late_us) if s.worst_rank >= 0 else "-"]
                for s in sorted(slowest, key=lambda s: s.start_us)]
        out.append(Section(
            f"Steps ({len(sp.steps)}, {sp.source}): median {fmt_ms(float(np.median(d)))}, "
            f"min {fmt_ms(float(d.min()))}, max {fmt_ms(float(d.max()))}"
            + (f"; worst rank per step: {worst}" if worst else "")
            + f". The {len(rows)} steps with the most waiting:",
            ["step", "start", "duration", "rounds", "worst rank", "others waited"], rows,
            key="steps"))

    if rep.phases:
        names = {}
        for p in rep.phases.values():
            for n, t in p.phases.items():
                names.setdefault(n, t.lane)
        order = sorted(names, key=lambda n: (names[n], n))
        ranks = sorted(rep.phases)
        rows = [[n, tl.ranks[ranks[0]].lane_label(names[n])] +
                [fmt_ms(rep.phases[r].phases[n].busy_us) if n in rep.phases[r].phases
                 else "-" for r in ranks] for n in order]
        out.append(Section("Time per phase per rank (busy time; overlapping events "
                           "counted once)", ["phase", "lane"] + [f"rank {r}" for r in ranks],
                           rows, right=set(range(2, 2 + len(ranks))), key="phases"))

    if rep.bytes:
        rows = [[b.op, b.calls, b.tensors, fmt_bytes(b.bytes),
                 fmt_bytes(b.bytes / b.calls) if b.calls else "-",
                 fmt_ms(b.mean_time_us), fmt_rate(b.bytes, b.mean_time_us)]
                for b in rep.bytes]
        out.append(Section("Bytes per collective (rate includes waiting inside the op)",
                           ["op", "calls", "tensors", "bytes", "per call",
                            "time (mean rank)", "rate"], rows, key="bytes"))

    fu = rep.fusion
    if fu.ops:
        rows = [[o.op, o.buffers, o.tensors, f"{o.per_buffer_mean:.2f}", o.per_buffer_max,
                 o.single, fmt_pct(o.fill_mean), fmt_pct(o.fill_max),
                 fmt_bytes(o.threshold) if o.threshold else "-"] for o in fu.ops]
        lines = [f"{o.op} tensors per buffer: " +
                 ", ".join(f"{lab}: {n}" for lab, n in o.histogram)
                 for o in fu.ops[:3] if o.histogram and o.per_buffer_max > 1]
        if fu.hint:
            lines.append(fu.hint)
        out.append(Section("Fusion (tensors per collective; fill = bytes / fusion threshold)",
                           ["op", "buffers", "tensors", "per buffer", "max", "single",
                            "mean fill", "max fill", "threshold"], rows, lines=lines,
                           key="fusion"))

    pl = rep.pipeline
    if pl is not None and pl.batches:
        rows = [[r.rank, r.stage, fmt_ms(r.window_us), fmt_ms(r.idle_us), fmt_pct(r.bubble)]
                for r in sorted(pl.ranks.values(), key=lambda r: (r.stage, r.rank))]
        out.append(Section("Pipeline bubble (idle share of each batch; waits for activations "
                           "and gradients, and the tail after the rank's last message)",
                           ["rank", "stage", "batches", "idle", "bubble"], rows,
                           lines=[pipeline_sentence(pl)] + pl.notes, right={0, 1, 2, 3, 4},
                           key="pipeline"))

    if rep.idle:
        rows = []
        for r, ri in sorted(rep.idle.items()):
            g = ri.largest[0] if ri.largest else None
            rows.append([r, fmt_ms(ri.idle_us), fmt_pct(ri.fraction), ri.n_gaps,
                         f"{fmt_ms(g.dur_us)} at {fmt_ms(g.start_us)} ({g.before} -> {g.after})"
                         if g else "-"])
        out.append(Section("Engine idle gaps (no event in any lane; gaps >= 0.1 ms counted)",
                           ["rank", "idle", "of span", "gaps", "largest"], rows,
                           right={0, 1, 2, 3}, key="idle"))

    if st.clock_residual_us:
        worst = max(st.clock_residual_us.items(), key=lambda x: abs(x[1]))
        out.append(Section("Clock check", lines=[
            f"After alignment, responses reach the ranks within {fmt_ms(abs(worst[1]))} of "
            f"rank {st.ref_rank} (median; worst rank {worst[0]}); lateness below that is "
            f"noise."], key="clock"))

    if rep.notable:
        rows = [[n.rank, fmt_ms(n.t_us), n.kind, n.tensor, n.message[:160]]
                for n in rep.notable[:top * 2]]
        out.append(Section("Errors and notable events", ["rank", "at", "event", "tensor",
                                                         "message"], rows, right={0, 1},
                           key="errors"))
    if tl.notes:
        out.append(Section("Notes", lines=[f"- {n}" for n in tl.notes], key="notes"))
    return out
