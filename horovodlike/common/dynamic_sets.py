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
    return add_for_library(process_set)


def add_for_library(process_set):
    """add_process_set for a feature of this library that needs sets of its own (the
    sharded optimizer's groups): allowed without dynamic sets, as torch's ZeRO and FSDP
    need nothing special at init. Still a collective over every rank."""
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.process_set_id is not None:
        raise ValueError(f"{ps} is already registered")
    _agree(ps.ranks, "add")
    return process_sets._register(ps)


def remove_process_set(process_set):
    """Unregister a set on every rank (a collective). Returns True if it existed."""
    _need_dynamic("remove_process_set")
    sid = set_id(process_set)
    if sid == 0:
        raise ValueError("the global process set cannot be removed")
    _agree([sid], "remove")
    process_sets._unregister(sid)
    return True
