"""Process sets as the torch binding sees them: Horovod's ProcessSet API re-exported from
horovodlike.common, plus the few facts a collective needs (engine id, size, this rank's
index, a checked root rank)."""
import operator

from horovodlike.common import basics
from horovodlike.common.process_sets import (ProcessSet, add_process_set,  # noqa: F401
                                             global_process_set, remove_process_set, set_id)


def resolve(process_set):
    """(ProcessSet, engine id) for a process_set= argument; None means the global set."""
    if process_set is None:
        process_set = global_process_set
    return process_set, set_id(process_set)


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
