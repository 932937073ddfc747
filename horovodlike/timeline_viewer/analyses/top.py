"""The top-N stragglers: the single rounds in which one rank kept the others waiting
longest, and the (rank, tensor) pairs that cost the most waiting in total."""
from dataclasses import dataclass

import numpy as np


@dataclass
class Straggle:
    rank: int
    tensor: str
    late_us: float           # behind the second-to-last rank
    spread_us: float         # behind the first rank
    t_us: float              # when the last rank submitted (common axis)
    step: int                # step number, -1 when unknown


@dataclass
class PairCost:
    rank: int
    tensor: str
    times_last: int
    total_late_us: float
    mean_late_us: float


def top_stragglers(tl, strag, steps=None, n=10):
    """([Straggle] worst rounds first, [PairCost] costliest pairs first)."""
    ok = np.flatnonzero(strag.complete)
    if ok.size == 0:
        return [], []
    step_starts = np.array([s.start_us for s in steps.steps]) if steps and steps.steps \
        else None
    worst = ok[np.argsort(-strag.late[ok], kind="stable")][:n]
    rounds = []
    for i in worst:
        step = -1
        if step_starts is not None:
            k = int(np.searchsorted(step_starts, strag.t_end[i], side="right")) - 1
            step = steps.steps[k].number if k >= 0 else -1
        rounds.append(Straggle(rank=int(strag.last[i]), tensor=tl.strings[int(strag.tensor[i])],
                               late_us=float(strag.late[i]), spread_us=float(strag.spread[i]),
                               t_us=float(np.nanmax(strag.submit[i])), step=step))
    key = strag.last[ok].astype(np.int64) * (int(strag.tensor.max()) + 1) + strag.tensor[ok]
    uniq, inv = np.unique(key, return_inverse=True)
    tot = np.bincount(inv, weights=strag.late[ok])
    cnt = np.bincount(inv)
    pairs = []
    for k in np.argsort(-tot, kind="stable")[:n]:
        i = ok[np.flatnonzero(inv == k)[0]]
        pairs.append(PairCost(rank=int(strag.last[i]), tensor=tl.strings[int(strag.tensor[i])],
                              times_last=int(cnt[k]), total_late_us=float(tot[k]),
                              mean_late_us=float(tot[k] / cnt[k])))
    return rounds, pairs
