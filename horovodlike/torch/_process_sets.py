"""Process sets as the torch binding sees them: Horovod's ProcessSet API re-exported from
horovodlike.common, plus the few facts a collective needs (engine id, size, this rank's
index, a root rank's index).

If the common layer has no process-set support (an older build), a stand-in offers the
global set only, so that `import horovodlike.torch` always works.
"""
import operator

from horovodlike.common import basics

try:
    from horovodlike.common.process_sets import (ProcessSet, add_process_set,
                                                 global_process_set, remove_process_set)
    try:
        from horovodlike.common.process_sets import set_id as _common_set_id
    except ImportError:                                   # pragma: no cover
        _common_set_id = None
except ImportError:                                       # pragma: no cover
    _common_set_id = None

    class ProcessSet:
        """Stand-in: this build of horovodlike has no process sets beyond the global one."""

        def __init__(self, ranks):
            self.ranks = sorted(int(r) for r in ranks)
            self.process_set_id = None

        def size(self):
            return len(self.ranks) if self.ranks else basics.size()

        def rank(self):
            if self.process_set_id == 0:
                return basics.rank()
            me = basics.rank()
            return self.ranks.index(me) if me in self.ranks else None

        def included(self):
            return self.rank() is not None

    global_process_set = ProcessSet([])
    global_process_set.process_set_id = 0

    def add_process_set(process_set):
        raise NotImplementedError("process sets are not available in this build of "
                                  "horovodlike (horovodlike.common.process_sets is missing)")

    def remove_process_set(process_set):
        raise NotImplementedError("process sets are not available in this build of "
                                  "horovodlike (horovodlike.common.process_sets is missing)")


def resolve(process_set):
    """(ProcessSet, engine id) for a process_set= argument; None means the global set."""
    if process_set is None:
        process_set = global_process_set
    if _common_set_id is not None:
        return process_set, _common_set_id(process_set)
    sid = getattr(process_set, "process_set_id", None)
    if sid is None:
        raise ValueError(f"{process_set!r} is not a registered process set")
    return process_set, sid


def member_index(process_set, what):
    """This rank's index in the set; a clear error if it is not a member."""
    i = process_set.rank()
    if i is None:
        raise ValueError(f"{what}: rank {basics.rank()} is not a member of {process_set!r}")
    return i


def root_index(process_set, root_rank, what):
    """Horovod's root_rank is a global rank, also for a process set (the engine's too);
    checked here so the error names the set."""
    try:
        if isinstance(root_rank, bool):
            raise TypeError
        root_rank = operator.index(root_rank)
    except TypeError:
        raise TypeError(f"{what}: root_rank must be an int, got {root_rank!r}") from None
    if getattr(process_set, "process_set_id", None) == 0:
        return root_rank
    ranks = list(process_set.ranks)
    if root_rank not in ranks:
        raise ValueError(f"{what}: root rank {root_rank} is not a member of {process_set!r}")
    return root_rank
