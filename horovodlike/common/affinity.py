"""HOROVOD_THREAD_AFFINITY: pin each rank's background engine thread to a core.

Horovod reads a comma-separated list with one core id per local rank and pins local
rank i's background thread to the i-th id. horovodlike does the same without touching
the engine: a new thread inherits the CPU mask of the thread that creates it, so the
thread that starts the engine narrows its own mask to the chosen core for the duration
of the start and then restores it. One id with several local ranks pins local rank i
to core id + i (Horovod would log an error and pin nothing).
"""
import contextlib
import logging
import os

log = logging.getLogger("horovodlike.affinity")


def core_for(spec, local_rank, local_size):
    """The core local_rank's engine thread goes on, or None (with the reason)."""
    try:
        ids = [int(c) for c in spec.split(",") if c.strip()]
    except ValueError:
        return None, f"HOROVOD_THREAD_AFFINITY={spec!r} is not a list of core ids"
    if not ids or min(ids) < 0:
        return None, f"HOROVOD_THREAD_AFFINITY={spec!r}: core ids must be >= 0"
    if len(ids) == 1:
        return ids[0] + local_rank, None
    if len(ids) < local_size:
        return None, (f"HOROVOD_THREAD_AFFINITY={spec!r} has {len(ids)} core ids for "
                      f"{local_size} local ranks")
    return ids[local_rank], None


@contextlib.contextmanager
def engine_thread_affinity(local_rank, local_size):
    """Threads started inside this block run on the core HOROVOD_THREAD_AFFINITY names."""
    spec = os.environ.get("HOROVOD_THREAD_AFFINITY", "").strip()
    if not spec or not hasattr(os, "sched_setaffinity"):
        yield None
        return
    core, problem = core_for(spec, local_rank, local_size)
    saved = os.sched_getaffinity(0)   # pid 0: this thread only
    if core is not None and core not in saved:
        problem = (f"HOROVOD_THREAD_AFFINITY: core {core} is not available to this "
                   f"process (allowed: {sorted(saved)})")
    if problem:
        log.warning("horovodlike: %s; the background thread is not pinned", problem)
        yield None
        return
    os.sched_setaffinity(0, {core})
    try:
        yield core
    finally:
        os.sched_setaffinity(0, saved)
