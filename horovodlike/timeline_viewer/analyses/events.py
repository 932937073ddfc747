"""Notable instants: ERROR responses (tensor and message) and the engine's size cap."""
from dataclasses import dataclass

import numpy as np

from ..model import INSTANT


@dataclass
class Notable:
    rank: int
    t_us: float
    kind: str                # "ERROR" or "TIMELINE_TRUNCATED"
    tensor: str
    message: str


def notable(tl, limit=200):
    out = []
    for kind in ("ERROR", "TIMELINE_TRUNCATED"):
        nid = tl.name_id(kind)
        if nid < 0:
            continue
        for r, rt in tl.ranks.items():
            for i in np.flatnonzero((rt.name == nid) & (rt.phase == INSTANT)):
                a = rt.args[i] or {}
                out.append(Notable(rank=r, t_us=float(rt.t[i]), kind=kind,
                                   tensor=str(a.get("tensor", "")),
                                   message=str(a.get("message", ""))))
    out.sort(key=lambda x: (x.t_us, x.rank))
    return out[:limit]
