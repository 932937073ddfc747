"""Adding and removing process sets after init (HOROVOD_DYNAMIC_PROCESS_SETS=1 or
hvd.init(process_sets="dynamic")).

Both are collectives: every rank calls them, in the same order. Each first agrees on
the change with an allgather, so a rank that proposes different members gets an error
instead of a hang; then every rank registers it under the same id (process_sets).
"""
import numpy as np

from . import basics, ops, process_sets
from .process_sets import ProcessSet, set_id


def _agree(ranks, what):
    mine = np.full(basics.size() + 1, -1, np.int64)
    mine[0] = len(ranks)
    mine[1:1 + len(ranks)] = ranks
    every = ops.allgather(mine[None, :], name=f"process_set.{what}.{process_sets._next_id}")
    if not (every == every[0]).all():
        raise ValueError(f"ranks proposed different process sets to {what}: "
                         f"{[list(row[1:1 + row[0]]) for row in every]}")


def _need_dynamic(what):
    if not process_sets.dynamic():
        raise ValueError(f"{what}() needs HOROVOD_DYNAMIC_PROCESS_SETS=1 or "
                         f"hvd.init(process_sets='dynamic')")


def add_process_set(process_set):
    """Register a set on every rank (a collective: all ranks call it, same order)."""
    _need_dynamic("add_process_set")
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.process_set_id is not None:
        raise ValueError(f"{ps} is already registered")
    _agree(ps.ranks, "add")
    return process_sets._register(ps)


def ensure_process_sets(rank_lists, what):
    """The registered sets with exactly these members, registering the missing ones: a
    collective that every rank calls with the same lists in the same order, as
    hvd.init(process_sets=...) is. Unlike add_process_set it needs no dynamic mode: the
    engine accepts a set at any time (a request for a set rank 0 does not know yet
    waits for it), so a caller that builds its sets as one agreed collective — the
    parallelism Topology — works after a plain hvd.init(). One allgather agrees on all
    of them first, so ranks that disagree get an error naming `what`, not a hang.
    The list of every rank is the global set itself; it is returned, not re-added."""
    everyone = list(range(basics.size()))
    lists = [sorted(int(r) for r in ranks) for ranks in rank_lists]
    flat = [len(lists)] + [x for ranks in lists for x in [len(ranks)] + ranks]
    mine = np.full(1 + len(lists) * (basics.size() + 1), -1, np.int64)
    mine[:len(flat)] = flat
    sizes = ops.allgather(np.array([mine.size], np.int64), name=f"process_set.{what}.n")
    if not (sizes == sizes[0]).all():
        raise ValueError(f"{what}: ranks proposed different numbers of process sets "
                         f"({sizes.tolist()})")
    every = ops.allgather(mine[None, :], name=f"process_set.{what}")
    if not (every == every[0]).all():
        raise ValueError(f"{what}: ranks proposed different process sets")
    out = []
    for ranks in lists:
        if ranks == everyone:
            out.append(process_sets.global_process_set)
            continue
        found = process_sets.find(ranks)
        out.append(found if found is not None else process_sets._register(ProcessSet(ranks)))
    return out


def remove_process_set(process_set):
    """Unregister a set on every rank (a collective). Returns True if it existed."""
    _need_dynamic("remove_process_set")
    sid = set_id(process_set)
    if sid == 0:
        raise ValueError("the global process set cannot be removed")
    _agree([sid], "remove")
    process_sets._unregister(sid)
    return True
