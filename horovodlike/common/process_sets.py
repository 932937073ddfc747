"""Process sets: collectives over a subset of the ranks (Horovod's ProcessSet API).

The engine identifies a set by a small integer that must mean the same ranks on every
rank, so ids are handed out here in call order — every rank adds and removes sets in the
same order, as Horovod requires — and each dynamic addition is first agreed on with an
allgather, so a rank that proposes different members gets an error instead of a hang.
"""
import os

import numpy as np

from . import basics, engine


class ProcessSet:
    """A set of global ranks. Pass it as `process_set=` to any collective."""

    def __init__(self, ranks):
        if hasattr(ranks, "Get_group"):            # an mpi4py communicator
            from mpi4py import MPI
            world = MPI.COMM_WORLD.Get_group()
            ranks = MPI.Group.Translate_ranks(ranks.Get_group(),
                                              list(range(ranks.Get_size())), world)
        self.ranks = sorted(int(r) for r in ranks)
        if len(set(self.ranks)) != len(self.ranks):
            raise ValueError(f"process set ranks must be unique: {list(ranks)}")
        self.process_set_id = None

    def size(self):
        return len(self.ranks) if self.ranks else basics.size()

    def rank(self):
        """This process's rank within the set, or None if it is not a member."""
        if self.process_set_id == 0:
            return basics.rank()
        me = basics.rank()
        return self.ranks.index(me) if me in self.ranks else None

    def included(self):
        return self.rank() is not None

    def __eq__(self, other):
        return isinstance(other, ProcessSet) and self.ranks == other.ranks

    def __hash__(self):
        return hash(tuple(self.ranks))

    def __repr__(self):
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0

_sets = {}           # id -> ProcessSet, this engine's registrations
_next_id = 1
_dynamic = False


def set_id(process_set):
    """The engine's id for a process_set= argument (None means the global set)."""
    if process_set is None or process_set is global_process_set:
        return 0
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"process_set must be a hvd.ProcessSet, got {type(process_set).__name__}")
    if process_set.process_set_id is None:
        raise ValueError(f"{process_set} is not registered: pass it to hvd.init(process_sets=...) "
                         f"or hvd.add_process_set()")
    return process_set.process_set_id


def _register(ps):
    global _next_id
    for other in _sets.values():
        if other == ps:
            raise ValueError(f"a process set with ranks {ps.ranks} already exists "
                             f"(id {other.process_set_id})")
    bad = [r for r in ps.ranks if r >= basics.size()]
    if bad or not ps.ranks:
        raise ValueError(f"process set ranks {ps.ranks} are not a non-empty subset of "
                         f"[0, {basics.size()})")
    engine.process_set_add(_next_id, ps.ranks)
    ps.process_set_id = _next_id
    _sets[_next_id] = ps
    _next_id += 1
    return ps


def init_sets(process_sets):
    """Called by init(): static sets (a list), or "dynamic"."""
    global _dynamic, _next_id
    _sets.clear()
    _next_id = 1
    _dynamic = process_sets == "dynamic" or os.environ.get("HOROVOD_DYNAMIC_PROCESS_SETS", "0") \
        not in ("", "0")
    if process_sets in (None, "dynamic"):
        return
    for ps in process_sets:
        _register(ps if isinstance(ps, ProcessSet) else ProcessSet(ps))


def _agree(ranks, what):
    from . import ops
    mine = np.full(basics.size() + 1, -1, np.int64)
    mine[0] = len(ranks)
    mine[1:1 + len(ranks)] = ranks
    every = ops.allgather(mine[None, :], name=f"process_set.{what}.{_next_id}")
    if not (every == every[0]).all():
        raise ValueError(f"ranks proposed different process sets to {what}: "
                         f"{[list(row[1:1 + row[0]]) for row in every]}")


def add_process_set(process_set):
    """Register a set on every rank (a collective: all ranks call it, same order)."""
    if not _dynamic:
        raise ValueError("add_process_set() needs HOROVOD_DYNAMIC_PROCESS_SETS=1 or "
                         "hvd.init(process_sets='dynamic')")
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.process_set_id is not None:
        raise ValueError(f"{ps} is already registered")
    _agree(ps.ranks, "add")
    return _register(ps)


def remove_process_set(process_set):
    """Unregister a set on every rank (a collective). Returns True if it existed."""
    if not _dynamic:
        raise ValueError("remove_process_set() needs HOROVOD_DYNAMIC_PROCESS_SETS=1 or "
                         "hvd.init(process_sets='dynamic')")
    sid = set_id(process_set)
    if sid == 0:
        raise ValueError("the global process set cannot be removed")
    _agree([sid], "remove")
    engine.process_set_remove(sid)
    _sets.pop(sid, None)
    process_set.process_set_id = None
    return True
