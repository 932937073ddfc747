"""Bytes moved per collective op, and the rate each rank achieved.

Counted on the collective lane (ALLREDUCE, ALLGATHER, ...): one event per (possibly
fused) collective, `args.bytes` its payload. Rate = bytes / time spent in the op on that
rank; it includes waiting for the slowest peer inside the op.
"""
from dataclasses import dataclass, field

import numpy as np

from ..model import COLLECTIVE, COMPLETE, OPS


@dataclass
class OpBytes:
    op: str
    calls: int               # on the reference rank
    tensors: int
    bytes: int
    time_us: dict = field(default_factory=dict)    # rank -> time in this op

    @property
    def mean_time_us(self):
        return float(np.mean(list(self.time_us.values()))) if self.time_us else 0.0


def bytes_moved(tl, ref_rank=None):
    """[OpBytes], largest payload first."""
    if not tl.ranks:
        return []
    ref = ref_rank if ref_rank in tl.ranks else (0 if 0 in tl.ranks else tl.rank_ids[0])
    op_ids = set(tl.names_like(lambda s: s in OPS))
    out = {}
    for r, rt in tl.ranks.items():
        m = (rt.phase == COMPLETE) & ((rt.lane == COLLECTIVE) |
                                      np.isin(rt.name, list(op_ids) or [-1]))
        for nid in np.unique(rt.name[m]):
            k = m & (rt.name == nid)
            name = tl.strings[int(nid)]
            ob = out.setdefault(name, OpBytes(op=name, calls=0, tensors=0, bytes=0))
            ob.time_us[r] = float(rt.dur[k].sum())
            if r == ref:
                idx = np.flatnonzero(k)
                ob.calls = int(idx.size)
                ob.tensors = int(sum(max(1, len(rt.tensors[i])) for i in idx))
                b = rt.nbytes[idx]
                ob.bytes = int(b[b > 0].sum())
    return sorted(out.values(), key=lambda o: (-o.bytes, o.op))
