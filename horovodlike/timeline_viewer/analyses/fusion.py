"""How well tensor fusion worked.

For each collective on the reference rank: tensors per fused buffer (`args.fused`, or
the length of `args.tensors`) and buffer fill = bytes / fusion_threshold. Many buffers
of one tensor each, or buffers far from full, mean fusion is limited by when tensors
arrive (HOROVOD_CYCLE_TIME, the order of the backward pass), not by the threshold;
buffers that often hit the threshold mean a larger HOROVOD_FUSION_THRESHOLD could fuse
more.
"""
from dataclasses import dataclass, field

import numpy as np

from ..model import COLLECTIVE, COMPLETE

BUCKETS = ((1, 1), (2, 2), (3, 4), (5, 8), (9, 16), (17, 1 << 62))


@dataclass
class OpFusion:
    op: str
    buffers: int
    tensors: int
    per_buffer_mean: float
    per_buffer_max: int
    single: int              # buffers holding one tensor
    fill_mean: float         # NaN where no threshold was reported
    fill_median: float
    fill_max: float
    threshold: int           # the (most common) fusion threshold, 0 when unknown
    histogram: list = field(default_factory=list)   # [(label, buffers)]


@dataclass
class Fusion:
    ops: list
    hint: str


def _bucket_label(lo, hi):
    return str(lo) if lo == hi else (f"{lo}+" if hi > 1 << 40 else f"{lo}-{hi}")


def fusion(tl, ref_rank=None):
    if not tl.ranks:
        return Fusion(ops=[], hint="")
    ref = ref_rank if ref_rank in tl.ranks else (0 if 0 in tl.ranks else tl.rank_ids[0])
    rt = tl.ranks[ref]
    m = (rt.phase == COMPLETE) & (rt.lane == COLLECTIVE)
    per_op = {}
    for i in np.flatnonzero(m):
        a = rt.args[i] or {}
        n = a.get("fused")
        try:
            n = int(n)
        except (TypeError, ValueError):
            n = len(rt.tensors[i]) or 1
        try:
            thr = int(a.get("fusion_threshold") or 0)
        except (TypeError, ValueError):
            thr = 0
        b = int(rt.nbytes[i])
        fill = b / thr if thr > 0 and b >= 0 else np.nan
        per_op.setdefault(tl.strings[int(rt.name[i])], []).append((n, fill, thr))
    ops = []
    for op, rows in per_op.items():
        n = np.array([x[0] for x in rows])
        fill = np.array([x[1] for x in rows], float)
        thr = [x[2] for x in rows if x[2] > 0]
        ok = fill[~np.isnan(fill)]
        hist = [(_bucket_label(lo, hi), int(((n >= lo) & (n <= hi)).sum()))
                for lo, hi in BUCKETS]
        ops.append(OpFusion(
            op=op, buffers=int(n.size), tensors=int(n.sum()),
            per_buffer_mean=float(n.mean()), per_buffer_max=int(n.max()),
            single=int((n == 1).sum()),
            fill_mean=float(ok.mean()) if ok.size else np.nan,
            fill_median=float(np.median(ok)) if ok.size else np.nan,
            fill_max=float(ok.max()) if ok.size else np.nan,
            threshold=max(set(thr), key=thr.count) if thr else 0,
            histogram=[h for h in hist if h[1]]))
    ops.sort(key=lambda o: -o.buffers)
    return Fusion(ops=ops, hint=_hint(ops))


def _hint(ops):
    fused = [o for o in ops if o.per_buffer_max > 1 or o.op == "ALLREDUCE"]
    if not fused:
        return ""
    o = fused[0]
    known = o.fill_max == o.fill_max            # a threshold was reported
    if known and o.fill_max >= 0.9:
        full = o.fill_median >= 0.9
        return (f"{o.op} buffers {'usually' if full else 'sometimes'} reach the fusion "
                f"threshold; a larger HOROVOD_FUSION_THRESHOLD may fuse more tensors per "
                f"collective.")
    below = " and no buffer came near the threshold" if known else ""
    if o.single / max(o.buffers, 1) >= 0.5:
        return (f"{o.single} of {o.buffers} {o.op} buffers carried a single tensor{below}: "
                f"fusion is limited by when tensors are submitted (HOROVOD_CYCLE_TIME, "
                f"submission order), not by HOROVOD_FUSION_THRESHOLD.")
    if known:
        return (f"{o.op} fuses {o.per_buffer_mean:.1f} tensors per buffer on average; "
                f"buffers stay below the threshold, so it does not limit fusion.")
    return f"{o.op} fuses {o.per_buffer_mean:.1f} tensors per buffer on average."
