"""Per training step: how long it took and which rank held it up.

Steps come from the engine's STEP instants (it counts a step each time the first
tensor it ever saw is submitted again). A job whose first tensor never comes back (a
broadcast of initial weights, say) has no STEP marks; then a step is inferred to
start at each submit of the most often negotiated tensor, and the result says so.

A straggler instance belongs to the step in which its response arrived; a step's
worst rank is the one the others waited for longest in that step (the union of its
late intervals, so tensors waiting on the same late submit count once).
"""
from dataclasses import dataclass, field

import numpy as np

from ..model import INSTANT, covered


@dataclass
class Step:
    number: int              # the engine's step number (or a running count if inferred)
    start_us: float
    end_us: float
    n_instances: int
    late_by_rank: np.ndarray  # per rank: time others waited for it in this step (us)
    worst_rank: int          # -1 when nobody was late
    worst_late_us: float

    @property
    def duration_us(self):
        return self.end_us - self.start_us


@dataclass
class Steps:
    source: str              # "STEP marks", "inferred from <tensor>", or "none"
    steps: list = field(default_factory=list)
    worst_counts: dict = field(default_factory=dict)   # rank -> steps it was worst in

    @property
    def durations_us(self):
        return np.array([s.duration_us for s in self.steps])


def _marks(tl, ref):
    sid = tl.name_id("STEP")
    rt = tl.ranks.get(ref)
    if rt is None or sid < 0:
        return None, None
    m = (rt.name == sid) & (rt.phase == INSTANT)
    if not m.any():
        return None, None
    idx = np.flatnonzero(m)
    nums = []
    for k, i in enumerate(idx):
        a = rt.args[i] or {}
        try:
            nums.append(int(a.get("step")))
        except (TypeError, ValueError):
            nums.append(k + 1)
    return rt.t[idx], np.asarray(nums)


def steps(tl, strag):
    """Steps over the straggler instances of `strag` (see stragglers.py)."""
    ref = strag.ref_rank if strag.ref_rank >= 0 else (tl.rank_ids or [0])[0]
    starts, numbers = _marks(tl, ref)
    source = "STEP marks"
    if starts is None:
        if strag.tensor.size == 0:
            return Steps(source="none")
        ids, counts = np.unique(strag.tensor, return_counts=True)
        if counts.max() < 2:
            return Steps(source="none")
        best = ids[counts == counts.max()]
        first = [strag.t_ref[strag.tensor == b].min() for b in best]
        tid = best[int(np.argmin(first))]
        starts = np.sort(strag.t_ref[strag.tensor == tid])
        numbers = np.arange(1, starts.size + 1)
        source = f"inferred from the submits of {tl.strings[int(tid)]}"
    rt = tl.ranks.get(ref)
    span = rt.span() if rt is not None else None
    end_all = span[1] if span else float(starts[-1])
    if span and strag.tensor.size and (strag.t_end < starts[0]).any() and span[0] < starts[0]:
        # The rounds before the first mark are the first pass (step 0 to the engine).
        starts = np.r_[span[0], starts]
        numbers = np.r_[numbers[0] - 1, numbers]
    ends = np.r_[starts[1:], max(end_all, float(starts[-1]))]

    which = np.searchsorted(starts, strag.t_end, side="right") - 1
    size = strag.size
    ok = np.flatnonzero(strag.complete & (which >= 0))
    ok = ok[np.argsort(which[ok], kind="stable")]
    bounds = np.searchsorted(which[ok], np.arange(starts.size + 1))
    counts = np.bincount(which[ok], minlength=starts.size)
    t_last = np.nanmax(strag.submit, axis=1) if len(strag.submit) else np.zeros(0)
    out = []
    worst_counts = {}
    for k in range(starts.size):
        g = ok[bounds[k]:bounds[k + 1]]
        late = np.zeros(size)
        for r in np.unique(strag.last[g]):
            q = g[strag.last[g] == r]
            late[r] = covered(t_last[q] - strag.late[q], t_last[q])
        worst = int(np.argmax(late)) if late.max() > 0 else -1
        if worst >= 0:
            worst_counts[worst] = worst_counts.get(worst, 0) + 1
        out.append(Step(number=int(numbers[k]), start_us=float(starts[k]),
                        end_us=float(ends[k]), n_instances=int(counts[k]),
                        late_by_rank=late, worst_rank=worst,
                        worst_late_us=float(late[worst]) if worst >= 0 else 0.0))
    return Steps(source=source, steps=out, worst_counts=worst_counts)
