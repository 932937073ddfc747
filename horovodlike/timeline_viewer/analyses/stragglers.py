"""Who was last to submit each tensor, and by how much.

A NEGOTIATE_<OP> event starts when its rank enqueued the tensor and ends when the
response arrived. The response reaches every rank at nearly the same moment, so the
k-th negotiation of a tensor on one rank is matched to the negotiation of the same
tensor on every other rank whose end lies nearest (within half the time to that
tensor's neighbouring negotiations). Each match is an *instance*: one tensor, one
round, a submit time per rank.

The ranks expected in a round are those whose files negotiate that tensor at all (with
process sets, only the set's members) plus any rank without a file. A round is
*complete* when every expected rank's submit is known. Where a file is missing, rank 0's
``ready_us`` (when rank 0 learned each rank was ready) stands in for every rank of that
round, so the comparison stays on one basis.

Lateness of an instance is how far the last rank's submit trailed the second-to-last:
the time every other rank spent waiting for that rank alone. Spread is last minus first.

No rank is called slow under the trace's noise floor: the larger of how far apart one
response is stamped on different ranks (it reaches them at nearly the same moment, so
that spread is the trace's own timing error) and one cross-process wake-up, the least
delay any hand-off between ranks has (50-60 us measured on a 2-core host; 0.1 ms here).
A rank last on every tensor by less than that is as likely the scheduler's doing.
"""
from dataclasses import dataclass, field

import numpy as np

from ..fmt import fmt_ms
from ..model import COMPLETE, covered, union

SOURCE_NEGOTIATE, SOURCE_READY = 0, 1
WAKEUP_US = 100.0        # the floor's least value: one cross-process wake-up, rounded up


@dataclass
class RankLateness:
    rank: int
    n_last: int              # instances this rank was last on
    share: float             # n_last / instances
    total_late_us: float     # time others waited for it (union of its late intervals)
    mean_late_us: float      # mean lateness where it was last
    max_late_us: float


@dataclass
class TensorLateness:
    tensor: str
    op: str
    n: int                   # instances
    last_rank: int           # the rank most often last
    last_share: float
    mean_late_us: float      # over all instances of this tensor
    max_late_us: float
    total_late_us: float
    mean_spread_us: float


@dataclass
class Verdict:
    slow_rank: object        # int, or None when no rank stands out
    share: float
    mean_late_us: float
    sentence: str


@dataclass
class Stragglers:
    ref_rank: int
    size: int
    tensor: np.ndarray       # int32 tensor id per instance (Timeline.strings)
    op: np.ndarray           # int32 NEGOTIATE_<OP> name id per instance
    t_ref: np.ndarray        # reference rank's submit time (common axis, us)
    t_end: np.ndarray        # reference rank's response time
    submit: np.ndarray       # (instances, size) submit times, NaN where unknown
    ev_index: np.ndarray     # (instances, size) index of the NEGOTIATE event, -1 if none
    source: np.ndarray       # SOURCE_NEGOTIATE or SOURCE_READY per instance
    complete: np.ndarray     # bool: every rank's submit time is known
    last: np.ndarray         # rank last to submit (-1 where incomplete)
    late: np.ndarray         # us behind the second-to-last (NaN where incomplete)
    spread: np.ndarray       # us from first to last (NaN where incomplete)
    clock_residual_us: dict = field(default_factory=dict)   # rank -> median end skew
    noise_us: float = WAKEUP_US     # lateness below this is not called a straggler
    per_rank: list = field(default_factory=list)
    per_tensor: list = field(default_factory=list)
    verdict: Verdict = None

    @property
    def n(self):
        return int(self.complete.sum())


def _negotiations(rt, neg_ids):
    """{tensor id: (starts, ends, event indices)} of one rank, sorted by start."""
    m = rt.select(neg_ids, phase=COMPLETE)
    out = {}
    for i in np.flatnonzero(m):
        tens = rt.tensors[i]
        if tens:
            out.setdefault(tens[0], []).append(i)
    res = {}
    for tid, idx in out.items():
        idx = np.asarray(idx)
        idx = idx[np.argsort(rt.t[idx], kind="stable")]
        res[tid] = (rt.t[idx], rt.t[idx] + rt.dur[idx], idx)
    return res


def _tolerance(ends):
    if ends.size < 2:
        return np.full(ends.size, np.inf)
    gaps = np.diff(ends)
    left = np.r_[np.inf, gaps]
    right = np.r_[gaps, np.inf]
    return 0.5 * np.minimum(left, right)


def _match(ref_end, tol, ends):
    """Index into `ends` nearest each ref_end within tol, or -1."""
    if ends.size == 0:
        return np.full(ref_end.size, -1)
    j = np.searchsorted(ends, ref_end)
    lo = np.clip(j - 1, 0, ends.size - 1)
    hi = np.clip(j, 0, ends.size - 1)
    pick = np.where(np.abs(ends[lo] - ref_end) <= np.abs(ends[hi] - ref_end), lo, hi)
    ok = np.abs(ends[pick] - ref_end) <= tol
    return np.where(ok, pick, -1)


def _ready_times(tl, rt, args, size):
    """rank 0's ready_us -> submit row on the common axis, or None."""
    ready = (args or {}).get("ready_us")
    if not isinstance(ready, dict) or rt.rank != 0:
        return None
    row = np.full(size, np.nan)
    for k, v in ready.items():
        try:
            r = int(k)
            row[r] = float(rt.to_axis(float(v)))
        except (TypeError, ValueError, IndexError):
            continue
    return row


def _noise_floor(residuals):
    """The noise floor (module docstring): twice the 90th percentile of how far a
    response's stamp on a rank strays from that rank's median offset, at least
    WAKEUP_US."""
    dev = [np.abs(x - np.median(x)) for x in
           (np.concatenate(v) for v in residuals.values() if v) if x.size]
    spread = float(np.percentile(np.concatenate(dev), 90)) if dev else 0.0
    return max(WAKEUP_US, 2.0 * spread)


def _verdict(per_rank, n, size, late_total, span_us, noise_us=WAKEUP_US):
    if size < 2:
        return Verdict(None, 0.0, 0.0, "a single rank: nobody to wait for.")
    if n == 0:
        return Verdict(None, 0.0, 0.0,
                       "no tensor was negotiated by every rank in these files, so who "
                       "was late cannot be told (give every rank's file).")
    best = max(per_rank, key=lambda p: p.total_late_us)
    if best.mean_late_us < noise_us:
        return Verdict(None, best.share, best.mean_late_us,
                       f"no rank stands out: the last rank to submit (most often rank "
                       f"{best.rank}) was on average {fmt_ms(best.mean_late_us)} behind the "
                       f"next, under this trace's noise floor of {fmt_ms(noise_us)}.")
    share_late = best.total_late_us / late_total if late_total > 0 else 0.0
    often = max(0.5, min(0.9, 2.0 / size))     # last on most rounds, well above 1/size
    stands_out = (best.total_late_us >= 0.01 * max(span_us, 1.0) and
                  ((best.share >= often and share_late >= 0.5) or
                   (best.share >= 1.0 / size and share_late >= 0.75)))
    if stands_out:
        why = "" if best.share >= often else f" and caused {share_late:.0%} of the waiting"
        return Verdict(best.rank, best.share, best.mean_late_us,
                       f"rank {best.rank} was last to submit on {best.share:.0%} of "
                       f"tensors, on average {fmt_ms(best.mean_late_us)} late{why}; "
                       f"it is the slow rank.")
    ordered = sorted((p for p in per_rank if p.n_last), key=lambda p: -p.total_late_us)
    parts = "; ".join(
        f"rank {p.rank} {p.total_late_us / max(late_total, 1e-9):.0%} (last on "
        f"{p.share:.0%} of tensors)" for p in ordered[:4])
    mean = sum(p.mean_late_us * p.n_last for p in per_rank) / n
    return Verdict(None, best.share, mean,
                   f"no single rank is consistently last to submit; the waiting is spread: "
                   f"{parts}; the last rank was on average {fmt_ms(mean)} behind the next.")


def stragglers(tl):
    """The straggler analysis over a Timeline."""
    size = tl.size
    neg_ids = tl.names_like(lambda s: s.startswith("NEGOTIATE_"))
    empty = Stragglers(ref_rank=-1, size=size, tensor=np.zeros(0, np.int32),
                       op=np.zeros(0, np.int32), t_ref=np.zeros(0), t_end=np.zeros(0),
                       submit=np.zeros((0, size)), ev_index=np.zeros((0, size), np.int64),
                       source=np.zeros(0, np.int8),
                       complete=np.zeros(0, bool), last=np.zeros(0, np.int64),
                       late=np.zeros(0), spread=np.zeros(0))
    if not tl.ranks or not neg_ids:
        empty.verdict = _verdict([], 0, size, 0.0, 0.0)
        return empty
    ref = 0 if 0 in tl.ranks else tl.rank_ids[0]
    per_rank_neg = {r: _negotiations(rt, neg_ids) for r, rt in tl.ranks.items() if r < size}
    missing = set(tl.missing_ranks)
    all_tensors = sorted({t for negs in per_rank_neg.values() for t in negs})

    tensors, ops, t_ref, t_end, rows, sources, evrows, oks = [], [], [], [], [], [], [], []
    residuals = {r: [] for r in tl.ranks if r != ref}
    for tid in all_tensors:
        # The tensor's own reference: rank 0, or (process sets) its lowest member.
        have = sorted(r for r, negs in per_rank_neg.items() if tid in negs)
        tref = ref if ref in have else have[0]
        s, e, idx = per_rank_neg[tref][tid]
        rt_ref = tl.ranks[tref]
        sub = np.full((s.size, size), np.nan)
        sub[:, tref] = s
        evi = np.full((s.size, size), -1, np.int64)
        evi[:, tref] = idx
        tol = _tolerance(e)
        for r in have:
            if r == tref:
                continue
            rs, re_, ri = per_rank_neg[r][tid]
            j = _match(e, tol, re_)
            ok = j >= 0
            sub[ok, r] = rs[j[ok]]
            evi[ok, r] = ri[j[ok]]
            if tref == ref:
                residuals[r].append(re_[j[ok]] - e[ok])
        # A round is complete when every rank expected in it is known: the ranks whose
        # files hold this tensor, plus any rank without a file. Rank 0's ready_us can
        # complete a round for all ranks at once (then it is the only basis used).
        expect = np.zeros(size, bool)
        expect[have] = True
        expect[list(missing)] = True
        ok = ~np.isnan(sub[:, expect]).any(axis=1)
        src = np.zeros(s.size, np.int8)
        for k in np.flatnonzero(~ok):
            row = _ready_times(tl, rt_ref, rt_ref.args[idx[k]], size)
            if row is None:
                continue
            ready = ~np.isnan(row)
            if ready[have].all() and (ready | ~expect).all() and ready.sum() >= 2:
                sub[k] = row
                src[k] = SOURCE_READY
                ok[k] = True
        ok &= (~np.isnan(sub)).sum(axis=1) >= 2
        tensors.append(np.full(s.size, tid, np.int32))
        ops.append(rt_ref.name[idx])
        t_ref.append(s)
        t_end.append(e)
        rows.append(sub)
        evrows.append(evi)
        sources.append(src)
        oks.append(ok)

    tensor = np.concatenate(tensors)
    order = np.argsort(np.concatenate(t_ref), kind="stable")
    tensor = tensor[order]
    op = np.concatenate(ops)[order]
    t_r = np.concatenate(t_ref)[order]
    t_e = np.concatenate(t_end)[order]
    submit = np.vstack(rows)[order]
    ev_index = np.vstack(evrows)[order]
    source = np.concatenate(sources)[order]
    complete = np.concatenate(oks)[order] if size > 1 else np.zeros(len(t_r), bool)

    last = np.full(len(t_r), -1, np.int64)
    late = np.full(len(t_r), np.nan)
    spread = np.full(len(t_r), np.nan)
    if complete.any():
        sc = np.where(np.isnan(submit[complete]), -np.inf, submit[complete])
        srt = np.sort(sc, axis=1)
        last[complete] = np.argmax(sc, axis=1)
        late[complete] = srt[:, -1] - srt[:, -2]
        spread[complete] = srt[:, -1] - np.nanmin(submit[complete], axis=1)

    n = int(complete.sum())
    t_last = np.nanmax(submit, axis=1, initial=-np.inf) if len(t_r) else np.zeros(0)
    per_rank = []
    for r in range(size):
        m = complete & (last == r)
        k = int(m.sum())
        lt = late[m]
        per_rank.append(RankLateness(
            rank=r, n_last=k, share=k / n if n else 0.0,
            # Union, not sum: tensors waiting on the same late submit overlap.
            total_late_us=covered(t_last[m] - lt, t_last[m]) if k else 0.0,
            mean_late_us=float(lt.mean()) if k else 0.0,
            max_late_us=float(lt.max()) if k else 0.0))

    per_tensor = []
    for tid in np.unique(tensor):
        m = complete & (tensor == tid)
        k = int(m.sum())
        if not k:
            continue
        counts = np.bincount(last[m], minlength=size)
        lr = int(np.argmax(counts))
        per_tensor.append(TensorLateness(
            tensor=tl.strings[int(tid)],
            op=tl.strings[int(op[m][0])].replace("NEGOTIATE_", ""),
            n=k, last_rank=lr, last_share=float(counts[lr] / k),
            mean_late_us=float(late[m].mean()), max_late_us=float(late[m].max()),
            total_late_us=float(late[m].sum()), mean_spread_us=float(spread[m].mean())))
    per_tensor.sort(key=lambda p: -p.total_late_us)

    clock = {r: float(np.median(np.concatenate(v))) for r, v in residuals.items()
             if v and sum(len(x) for x in v)}
    lo, hi = tl.span()
    noise = _noise_floor(residuals)
    res = Stragglers(ref_rank=ref, size=size, tensor=tensor, op=op, t_ref=t_r, t_end=t_e,
                     submit=submit, ev_index=ev_index, source=source,
                     complete=complete, last=last,
                     late=late, spread=spread, clock_residual_us=clock, noise_us=noise,
                     per_rank=per_rank, per_tensor=per_tensor)
    res.verdict = _verdict(per_rank, n, size, sum(p.total_late_us for p in per_rank), hi - lo,
                           noise)
    return res


def late_intervals(strag, rank):
    """(starts, ends) when the other ranks were waiting for `rank` alone: from the
    second-to-last submit to its own, over the rounds it was last on (merged)."""
    m = strag.complete & (strag.last == rank)
    if not m.any():
        return np.zeros(0), np.zeros(0)
    hi = np.nanmax(strag.submit[m], axis=1)
    return union(hi - strag.late[m], hi)
