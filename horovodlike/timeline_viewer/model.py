"""All ranks on one time axis.

Each rank's ts is microseconds since that rank's engine start on its own monotonic
clock. The common axis is

    global_us = start_time_since_epoch_in_micros + ts + clock_offset_us

(clock_offset_us = rank 0's clock minus this rank's, measured at init), and the model
stores ``t = global_us - t0_epoch_us`` with t0 the earliest rank's start, so every
rank's events share one axis that starts near 0.
"""
from dataclasses import dataclass, field

import numpy as np

from .load import COMPLETE, INSTANT, Strings, load  # noqa: F401  (re-exported)

# The engine's lanes (Chrome "threads"), in display order.
DEFAULT_LANES = {1: "negotiate", 2: "queue", 3: "memcpy", 4: "collective",
                 5: "algorithm", 6: "cycles", 7: "p2p"}
NEGOTIATE, QUEUE, MEMCPY, COLLECTIVE, ALGORITHM, CYCLES = 1, 2, 3, 4, 5, 6
DATA_LANES = (MEMCPY, COLLECTIVE, ALGORITHM)
OPS = ("ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLTOALL", "REDUCESCATTER", "BARRIER", "JOIN")


@dataclass
class RankTrace:
    rank: int
    path: str
    hostname: str
    start_epoch_us: float
    clock_offset_us: float
    lane_names: dict                 # tid -> name
    t: np.ndarray                    # float64 us on the common axis
    dur: np.ndarray                  # float64 us
    name: np.ndarray                 # int32 -> Timeline.strings
    lane: np.ndarray                 # int32 tid
    phase: np.ndarray                # int8 COMPLETE / INSTANT
    nbytes: np.ndarray               # int64, -1 = none
    tensors: list                    # tuple of tensor ids per event
    args: list                       # args dict (or None) per event
    recovered: bool = False
    capped: bool = False             # the engine hit HOROVOD_TIMELINE_MAX_MB
    t0_epoch_us: float = 0.0         # the common axis' zero (same for every rank)

    @property
    def end(self):
        return self.t + self.dur

    def to_axis(self, own_ts):
        """This rank's own ts (e.g. rank 0's ready_us) -> the common axis."""
        return self.start_epoch_us + np.asarray(own_ts, np.float64) + self.clock_offset_us \
            - self.t0_epoch_us

    def span(self):
        """(first start, last end) over complete events, or None."""
        m = self.phase == COMPLETE
        if not m.any():
            if len(self.t):
                return float(self.t.min()), float(self.t.max())
            return None
        return float(self.t[m].min()), float((self.t[m] + self.dur[m]).max())

    def select(self, name_ids=None, lane=None, phase=None):
        """Boolean mask of events matching all given criteria."""
        m = np.ones(len(self.t), bool)
        if name_ids is not None:
            m &= np.isin(self.name, np.asarray(list(name_ids), np.int32))
        if lane is not None:
            m &= np.isin(self.lane, np.atleast_1d(np.asarray(lane, np.int32)))
        if phase is not None:
            m &= self.phase == phase
        return m

    def lane_label(self, tid):
        return self.lane_names.get(tid) or DEFAULT_LANES.get(tid) or f"lane {tid}"


@dataclass
class Timeline:
    ranks: dict                      # rank -> RankTrace, sorted by rank
    strings: Strings
    size: int                        # the job's size (from the files' otherData)
    t0_epoch_us: float
    notes: list = field(default_factory=list)    # warnings worth showing the user

    @property
    def rank_ids(self):
        return sorted(self.ranks)

    @property
    def missing_ranks(self):
        return [r for r in range(self.size) if r not in self.ranks]

    def name_id(self, s):
        return self.strings.id(s)

    def names_like(self, pred):
        """Interned ids of every name for which pred(name) is true."""
        return [i for i, s in enumerate(self.strings.names) if pred(s)]

    def span(self):
        spans = [s for s in (r.span() for r in self.ranks.values()) if s]
        if not spans:
            return 0.0, 0.0
        return min(s[0] for s in spans), max(s[1] for s in spans)

    def lanes(self):
        """Every lane used by any rank, in display order: [(tid, name)]."""
        tids = set()
        for r in self.ranks.values():
            tids.update(int(x) for x in np.unique(r.lane))
            tids.update(r.lane_names)
        names = {}
        for r in self.ranks.values():
            for tid in tids:
                names.setdefault(tid, r.lane_names.get(tid))
        return [(tid, names.get(tid) or DEFAULT_LANES.get(tid) or f"lane {tid}")
                for tid in sorted(tids)]

    @property
    def n_events(self):
        return sum(len(r.t) for r in self.ranks.values())


def union(starts, ends):
    """Union of intervals -> (starts, ends) of disjoint sorted intervals."""
    s = np.asarray(starts, np.float64)
    e = np.asarray(ends, np.float64)
    if s.size == 0:
        return s, e
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    cmax = np.maximum.accumulate(e)
    new = np.empty(s.size, bool)
    new[0] = True
    new[1:] = s[1:] > cmax[:-1]
    first = np.flatnonzero(new)
    last = np.r_[first[1:] - 1, s.size - 1]
    return s[first], cmax[last]


def covered(starts, ends):
    """Total length of the union of intervals."""
    s, e = union(starts, ends)
    return float((e - s).sum())


def _int(x, default):
    try:
        return int(x)
    except (TypeError, ValueError):
        return default


def _float(x, default=0.0):
    try:
        v = float(x)
        return v if v == v else default
    except (TypeError, ValueError):
        return default


def build(strings, loaded):
    """[LoadedRank] -> Timeline aligned on one axis."""
    notes = []
    by_rank = {}
    for lr in loaded:
        notes.extend(lr.notes)
        if lr.dropped:
            notes.append(f"{lr.path}: {lr.dropped} unusable events skipped")
        if lr.rank in by_rank:
            notes.append(f"{lr.path}: rank {lr.rank} given twice; kept "
                         f"{by_rank[lr.rank].path}")
            continue
        by_rank[lr.rank] = lr

    sizes = {_int(lr.meta.get("size"), 0) for lr in by_rank.values()} - {0}
    if len(sizes) > 1:
        notes.append(f"the files disagree on the job size ({sorted(sizes)}): "
                     f"were they written by different jobs?")
    size = max(sizes | {max(by_rank, default=-1) + 1})

    starts = {r: _float(lr.meta.get("start_time_since_epoch_in_micros")) for r, lr
              in by_rank.items()}
    offsets = {r: _float(lr.meta.get("clock_offset_us")) for r, lr in by_rank.items()}
    if len(by_rank) > 1 and any(v == 0.0 for v in starts.values()):
        notes.append("some files carry no start_time_since_epoch_in_micros; their "
                     "ranks are drawn as if they started together")
    t0 = min((starts[r] + offsets[r] + (float(lr.ts.min()) if lr.ts.size else 0.0)
              for r, lr in by_rank.items()), default=0.0)

    truncated_id = strings.id("TIMELINE_TRUNCATED")
    ranks = {}
    for r in sorted(by_rank):
        lr = by_rank[r]
        base = starts[r] + offsets[r] - t0
        order = np.argsort(lr.ts, kind="stable")
        tr = RankTrace(
            rank=r, path=lr.path,
            hostname=str(lr.meta.get("hostname") or lr.process_name or ""),
            start_epoch_us=starts[r], clock_offset_us=offsets[r],
            lane_names=dict(lr.lane_names),
            t=lr.ts[order] + base, dur=lr.dur[order], name=lr.name[order],
            lane=lr.lane[order], phase=lr.phase[order], nbytes=lr.nbytes[order],
            tensors=[lr.tensors[i] for i in order], args=[lr.args[i] for i in order],
            recovered=lr.recovered, t0_epoch_us=t0)
        tr.capped = bool(truncated_id >= 0 and (tr.name == truncated_id).any())
        if tr.capped:
            notes.append(f"rank {r}: the engine stopped recording at "
                         f"HOROVOD_TIMELINE_MAX_MB (TIMELINE_TRUNCATED); later activity "
                         f"is not in the file")
        ranks[r] = tr
    tl = Timeline(ranks=ranks, strings=strings, size=size, t0_epoch_us=t0, notes=notes)
    if tl.missing_ranks and len(ranks):
        miss = tl.missing_ranks
        shown = ", ".join(map(str, miss[:8])) + (", ..." if len(miss) > 8 else "")
        notes.append(f"no file for rank(s) {shown} of {size}; analyses that compare "
                     f"ranks use rank 0's ready_us for them where it has it")
    return tl


def open_timeline(paths):
    """Paths as given on the command line -> Timeline."""
    strings, loaded = load(paths)
    return build(strings, loaded)
