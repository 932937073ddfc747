"""Process sets: collectives over a subset of the ranks (Horovod's ProcessSet API).

The engine identifies a set by a small integer that must mean the same ranks on every
rank, so ids are handed out here in call order — every rank adds and removes sets in the
same order, as Horovod requires. Adding and removing sets after init are collectives,
and live above the collectives in dynamic_sets.
"""
import os

from . import basics, engine


class ProcessSet:
    """A set of global ranks. Pass it as `process_set=` to any collective."""

    def __init__(self, ranks_or_comm):
        # Horovod's ProcessSet(ranks_or_comm): the communicator stays reachable.
        ranks = ranks_or_comm
        self.mpi_comm = ranks if hasattr(ranks, "Get_group") else None
        if self.mpi_comm is not None:              # an mpi4py communicator
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
# Bumped whenever a set gets or loses its id: request.py's cached requests hold set ids,
# and drop them all when this moves.
changes = 0


def _changed():
    global changes
    changes += 1


def set_id(process_set):
    """The engine's id for a process_set= argument (None means the global set)."""
    if process_set is None or process_set is global_process_set:
        return 0
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"process_set must be a hvd.ProcessSet, got {type(process_set).__name__}")
    sid = process_set.process_set_id
    if sid is None:
        raise ValueError(f"{process_set} is not registered: pass it to hvd.init(process_sets=...) "
                         f"or hvd.add_process_set()")
    # An id set by hand, or one this engine never gave out, is refused here, when the op
    # is made (in a TF graph: when it is built), as Horovod refuses it.
    if sid == 0:
        if process_set.ranks in ([], list(range(basics.size()))):
            return 0
    elif sid in _sets and _sets[sid].ranks == process_set.ranks:
        return sid
    raise ValueError(f"{process_set}: no process set with id {sid} and these ranks exists "
                     f"(registered: {get_process_sets()}); use the ProcessSet that "
                     f"hvd.init(process_sets=...) or hvd.add_process_set() returned")


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
    _changed()
    ps.process_set_id = _next_id
    _sets[_next_id] = ps
    _next_id += 1
    return ps


def start(comm=None, process_sets=None):
    """Start the engine (basics.start) and register `process_sets` on it: a list of
    ProcessSet or rank lists, "dynamic" to allow adding sets later, or None. Nothing
    happens if the engine is already running. The public init() adds elastic mode on
    top (api.init)."""
    basics.start(comm, after_start=lambda: _init_sets(process_sets))


def _init_sets(process_sets):
    global _dynamic, _next_id
    forget_all()        # a set of an earlier engine must not alias one of this engine
    _next_id = 1
    _dynamic = process_sets == "dynamic" or os.environ.get("HOROVOD_DYNAMIC_PROCESS_SETS", "0") \
        not in ("", "0")
    if process_sets in (None, "dynamic"):
        return
    everyone = list(range(basics.size()))
    for ps in process_sets:
        ps = ps if isinstance(ps, ProcessSet) else ProcessSet(ps)
        # As Horovod's init does, a set given again, or one of every rank (the global
        # set), is ignored: such an entry only takes the id of the set it repeats.
        same = global_process_set if ps.ranks == everyone else find(ps.ranks)
        if same is not None:
            ps.process_set_id = same.process_set_id
            continue
        _register(ps)


def get_process_sets():
    """Horovod's {process set id: its ranks}, the global set (id 0) included."""
    out = {0: list(range(basics.size()))}
    out.update((sid, list(ps.ranks)) for sid, ps in sorted(_sets.items()))
    return out


def dynamic():
    """True when sets may be added and removed after init (see dynamic_sets)."""
    return _dynamic


def _unregister(sid):
    engine.process_set_remove(sid)
    _changed()
    ps = _sets.pop(sid, None)
    if ps is not None:
        ps.process_set_id = None


def find(ranks):
    """The registered set whose members are exactly `ranks` (sorted), or None."""
    ranks = list(ranks)
    return next((ps for ps in list(_sets.values()) if ps.ranks == ranks), None)


def by_id(sid):
    """The registered set with engine id `sid` (0 is the global set)."""
    if sid == 0:
        return global_process_set
    try:
        return _sets[sid]
    except KeyError:
        raise ValueError(f"no process set with id {sid}") from None


def forget_all():
    """Unregister every user set on this side only, after the engine that knew them has
    stopped (elastic reset: the ranks now mean other processes). Passing one of them
    afterwards raises 'not registered'."""
    _changed()
    for ps in list(_sets.values()):
        ps.process_set_id = None
    _sets.clear()
