"""Where each rank's time goes, phase by phase.

For each rank, over its traced span (first event start to last event end):

- busy time per phase (event name): the length of the union of that phase's events,
  so overlapping negotiations of several tensors count once;
- a three-way split of the span: *data* (some memcpy, collective or algorithm event
  running), *waiting* (only negotiation or queueing: the rank has submitted and waits
  for others or for its turn), *idle* (no event at all: the engine had no work, the
  time is in the training script).
"""
from dataclasses import dataclass, field

import numpy as np

from ..model import CYCLES, DATA_LANES, COMPLETE, covered


@dataclass
class PhaseTime:
    name: str
    lane: int
    count: int
    busy_us: float           # union of the phase's events
    total_us: float          # plain sum of durations


@dataclass
class RankPhases:
    rank: int
    span_us: float
    data_us: float
    waiting_us: float
    idle_us: float
    phases: dict = field(default_factory=dict)     # name -> PhaseTime
    lanes: dict = field(default_factory=dict)      # tid -> busy us


def phases(tl):
    """{rank: RankPhases}."""
    out = {}
    for r, rt in tl.ranks.items():
        m = (rt.phase == COMPLETE) & (rt.lane != CYCLES)
        span = rt.span()
        span_us = (span[1] - span[0]) if span else 0.0
        s, e = rt.t[m], rt.t[m] + rt.dur[m]
        any_us = covered(s, e)
        dm = np.isin(rt.lane[m], DATA_LANES)
        data_us = covered(s[dm], e[dm])
        ph = {}
        names, lanes = rt.name[m], rt.lane[m]
        for nid in np.unique(names):
            k = names == nid
            ph[tl.strings[int(nid)]] = PhaseTime(
                name=tl.strings[int(nid)], lane=int(np.bincount(lanes[k]).argmax()),
                count=int(k.sum()), busy_us=covered(s[k], e[k]),
                total_us=float((e[k] - s[k]).sum()))
        lane_busy = {int(t): covered(s[lanes == t], e[lanes == t]) for t in np.unique(lanes)}
        out[r] = RankPhases(rank=r, span_us=span_us, data_us=data_us,
                            waiting_us=any_us - data_us,
                            idle_us=max(0.0, span_us - any_us), phases=ph, lanes=lane_busy)
    return out
