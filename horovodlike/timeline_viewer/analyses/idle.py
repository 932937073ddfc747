"""Engine idle gaps: stretches where none of a rank's lanes has an event running.

During such a gap no tensor of that rank is being negotiated, queued, copied or
reduced: the engine is waiting for the training script to submit work. Gaps shorter
than `min_gap_us` are counted in the idle total but not listed.
"""
from dataclasses import dataclass, field

import numpy as np

from ..model import COMPLETE, CYCLES, union


@dataclass
class Gap:
    rank: int
    start_us: float
    dur_us: float
    before: str              # the event that ended when the gap began
    after: str               # the event that started when it ended


@dataclass
class RankIdle:
    rank: int
    span_us: float
    idle_us: float
    n_gaps: int              # gaps of at least min_gap_us
    largest: list = field(default_factory=list)     # [Gap], longest first

    @property
    def fraction(self):
        return self.idle_us / self.span_us if self.span_us > 0 else 0.0


def idle(tl, top=10, min_gap_us=100.0):
    """{rank: RankIdle}."""
    out = {}
    for r, rt in tl.ranks.items():
        m = (rt.phase == COMPLETE) & (rt.lane != CYCLES)
        idx = np.flatnonzero(m)
        if idx.size == 0:
            out[r] = RankIdle(rank=r, span_us=0.0, idle_us=0.0, n_gaps=0)
            continue
        s, e = rt.t[idx], rt.t[idx] + rt.dur[idx]
        us, ue = union(s, e)
        gs, ge = ue[:-1], us[1:]
        glen = ge - gs
        span = float(ue[-1] - us[0])
        big = np.flatnonzero(glen >= min_gap_us)
        big = big[np.argsort(-glen[big], kind="stable")][:top]
        by_end = np.argsort(e, kind="stable")
        gaps = []
        for g in big:
            k = np.searchsorted(e[by_end], gs[g], side="right") - 1
            before = tl.strings[int(rt.name[idx[by_end[k]]])] if k >= 0 else ""
            j = np.searchsorted(s, ge[g], side="left")     # s is sorted (rt is)
            after = tl.strings[int(rt.name[idx[j]])] if j < s.size else ""
            gaps.append(Gap(rank=r, start_us=float(gs[g]), dur_us=float(glen[g]),
                            before=before, after=after))
        out[r] = RankIdle(rank=r, span_us=span, idle_us=float(glen.sum()),
                          n_gaps=int((glen >= min_gap_us).sum()), largest=gaps)
    return out
