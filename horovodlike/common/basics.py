"""Starting and stopping the engine, and the topology queries every binding shares.

Nothing here knows of process sets, collectives or elastic mode: those sit above
(see horovodlike/common/__init__.py for the layers) and hook in through start()'s
after_start and _on_shutdown."""
import atexit
import logging
import os
import sys
import threading

from . import affinity, bootstrap, engine, mpi_end, mpi_init

_lock = threading.Lock()
_topo = None
_atexit_registered = False


def start(comm=None, after_start=None):
    """Start the engine on this process, if it is not running. True if it started one.

    comm: an mpi4py communicator to run on, or a list of MPI_COMM_WORLD ranks (Horovod's
    argument); by default the launch environment decides. after_start() runs under the
    start-up lock once the engine is up (the layers above register their state there);
    if it raises, the engine is stopped again. The public init() is api.init().
    """
    global _topo, _atexit_registered, _mpi_hooked, _forked
    if _forked:
        # the parent's engine state, copied at the fork: this process starts its own
        _topo, _forked = None, False
        for fn in _on_shutdown:
            fn()
    with _lock:
        if _topo is not None and engine.is_running():
            return False
        if _topo is not None:   # the engine failed: stop it before starting the next
            _stop_engine()
        if isinstance(comm, (list, tuple)):
            comm = _world_subset(comm)
        if comm is not None:
            launcher, rank, size = "mpi", comm.Get_rank(), comm.Get_size()
        else:
            launcher, rank, size = bootstrap.detect()
        under_mpi = launcher in _MPI_LAUNCHERS
        # MPI's own waits have no limit: bound them, and end the job if this fails.
        guard = None
        if under_mpi:
            mpi_end.engine_starting()
            guard = mpi_end.guard_start(rank)
        try:
            topo = _start_engine(launcher, rank, size, comm)
        except ValueError:
            raise                      # a bad argument, the same on every rank
        except Exception as exc:
            if under_mpi:
                mpi_end.watch(rank, launcher)
                mpi_end.job_failed(rank, f"start-up failed: {exc}")
            raise
        finally:
            if guard is not None:
                guard.cancel()
        if under_mpi and not _mpi_hooked:
            mpi_end.watch(rank, launcher)
            engine.on_job_failure.append(lambda why: mpi_end.job_failed(rank, why))
            _mpi_hooked = True
        _topo = topo
        if after_start is not None:
            try:
                after_start()
            except Exception:
                _stop_engine()
                raise
        if not _atexit_registered:
            atexit.register(shutdown)
            _atexit_registered = True
            if topo.rank == 0:
                _notice_ineffective_env(os.environ)
            if topo.size > 1:
                _quiet_interrupt(topo.rank)
        return True


def _quiet_interrupt(rank):
    """Ctrl-C reaches every rank of a job at once: each says so in one line instead of
    printing a traceback (the exit status stays Python's own for SIGINT, 130)."""
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        if issubclass(exc_type, KeyboardInterrupt):
            logging.getLogger("horovodlike").warning(
                "horovodlike rank %d: interrupted (Ctrl-C); exiting", rank)
        else:
            previous(exc_type, exc, tb)
    sys.excepthook = hook


# Horovod variables that change nothing here, by prefix or name: why. horovodlikerun
# says so of its flags (runner/args.py); a variable set directly gets this one notice.
_GPU_OPS = "collectives run in horovodlike's own engine (no NCCL, Gloo, MPI or oneCCL paths)"
INEFFECTIVE_ENV = {
    "HOROVOD_CONTROLLER": "the engine has one controller of its own (TCP, shared memory)",
    "HOROVOD_CPU_OPERATIONS": _GPU_OPS,
    "HOROVOD_GPU_": _GPU_OPS,
    "HOROVOD_NCCL_": _GPU_OPS,
    "HOROVOD_CCL_": _GPU_OPS,
    "HOROVOD_NUM_NCCL_STREAMS": _GPU_OPS,
    "HOROVOD_TORUS_ALLREDUCE": _GPU_OPS,
    "HOROVOD_MPI_THREADS_DISABLE": "the engine never calls MPI",
    "HOROVOD_ADASUM_MPI_CHUNK_SIZE": "Adasum is not provided",
    "HOROVOD_BATCH_D2D_MEMCOPIES": _GPU_OPS,
    "HOROVOD_ENABLE_ASYNC_COMPLETION": _GPU_OPS,
    "HOROVOD_DISABLE_GROUP_FUSION": "grouped ops are fused by the engine's own rule",
    "HOROVOD_ENABLE_XLA_OPS": "there are no XLA ops",
}


def _notice_ineffective_env(environ):
    """One notice (rank 0, once per process) naming the HOROVOD_* variables that are set
    but have no effect here, and why; nothing when there are none."""
    found = []
    for var in sorted(environ):
        why = next((w for key, w in INEFFECTIVE_ENV.items()
                    if var == key or (key.endswith("_") and var.startswith(key))),
                   None)
        if why is not None:
            found.append(f"{var} ({why})")
    if found:
        logging.getLogger("horovodlike").warning(
            "these Horovod variables are set but have no effect in horovodlike: %s",
            "; ".join(found))


_on_shutdown = []   # callbacks run once the engine has stopped (the layers above use it)
# Launches whose job does not end when one rank fails, only when it exits (see mpi_end):
# mpirun's (MPI_Abort ends it) and srun's (scancel of the step ends it).
_MPI_LAUNCHERS = ("mpi", "slurm")
_mpi_hooked = False


def _start_engine(launcher, rank, size, comm):
    """Key, addresses, the exchange and the engine's start; this rank's Topology."""
    key = bootstrap.job_key(launcher, rank, comm)
    bind, advertise = bootstrap.listen_addresses(launcher, size, comm)
    blob = engine.prepare(bootstrap.hostname(), advertise, bind, key)
    peers = bootstrap.exchange(launcher, rank, size, blob, comm)
    topo = bootstrap.topology(launcher, rank, [h for h, _ in peers])
    with affinity.engine_thread_affinity(topo.local_rank, topo.local_size):
        engine.start(rank, size, [b for _, b in peers])
    return topo


def _world_subset(ranks):
    """Horovod's init(comm=[ranks]): a communicator of those MPI_COMM_WORLD ranks, in the
    order given. Every world rank takes part in making it; the others are refused."""
    try:
        MPI = mpi_init.mpi()      # initialised here if the script left it to us
    except ImportError:
        raise ValueError("init(comm=[ranks]) needs mpi4py and an MPI launch") from None
    world = MPI.COMM_WORLD
    order = [int(r) for r in ranks]
    if len(set(order)) != len(order) or any(not 0 <= r < world.Get_size() for r in order):
        raise ValueError(f"init(comm={list(ranks)}): ranks must be distinct MPI_COMM_WORLD "
                         f"ranks in [0, {world.Get_size()})")
    me = world.Get_rank()
    sub = world.Split(0 if me in order else MPI.UNDEFINED, order.index(me) if me in order else 0)
    if sub == MPI.COMM_NULL:
        raise ValueError(f"init(comm={order}): this process is MPI rank {me}, not one of them")
    return sub


def shutdown():
    """End this rank's part in the job; also run at exit.

    A rank's shutdown is its own (as torch's destroy_process_group): the ops of process
    sets it is not in go on, and an op that needs it and that it never submitted fails at
    once on the ranks that do submit it, naming it. It returns when every rank has shut
    down, as MPI_Finalize does, or when a silent rank has been named lost (after
    HOROVODLIKE_PEER_TIMEOUT_SECONDS): never for ever. Horovod's shutdown ends every
    rank's engine at once (docs/moving-from-horovod.md)."""
    with _lock:
        _stop_engine()


def _stop_engine():
    global _topo
    engine.shutdown()
    if _mpi_hooked and _topo is not None:
        # nothing is left to notice this rank stopping before MPI_Finalize (mpi_end)
        mpi_end.engine_stopped(_topo.rank, bootstrap.hostname())
    _topo = None
    for fn in _on_shutdown:
        fn()


def start_timeline(file_path, mark_cycles=False):
    """Start writing a trace; every rank writes <stem>.rank<r><ext> next to file_path.
    Calling it again with a new path closes the previous file."""
    _t()
    engine.timeline_start(str(file_path), mark_cycles)


def stop_timeline():
    """Stop tracing and close the file (it stays valid JSON)."""
    _t()
    engine.timeline_stop()


def is_initialized():
    return _topo is not None and not _forked


def _t():
    if _forked:
        raise RuntimeError("hvd.init() ran in the parent; call hvd.init() again in the "
                           "child, or use the spawn start method")
    if _topo is None:
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    return _topo


# A process forked after init() has a copy of the parent's state but no engine thread
# (the engine, in C, forgets the parent's engine in the child): its calls would wait
# forever. So the child's calls raise until it calls init() itself.
_forked = False


def _after_fork_in_child():
    global _forked, _lock
    _lock = threading.Lock()        # another thread may have held it at the fork
    _forked = _topo is not None


os.register_at_fork(after_in_child=_after_fork_in_child)


def rank():
    return _t().rank


def size():
    return _t().size


def local_rank():
    return _t().local_rank


def local_size():
    return _t().local_size


def cross_rank():
    return _t().cross_rank


def cross_size():
    return _t().cross_size


def is_homogeneous():
    """True when every host runs the same number of ranks (Horovod's definition)."""
    return _t().homogeneous


def mpi_built():
    """True when mpi4py is importable, i.e. horovodlike can start under mpirun."""
    try:
        import mpi4py  # noqa: F401
        return True
    except ImportError:
        return False


def mpi_enabled():
    return _topo is not None and _topo.launcher == "mpi"


def mpi_threads_supported():
    """Whether MPI runs with MPI_THREAD_MULTIPLE, so mpi4py may be used beside horovodlike
    (Horovod's meaning). Like Horovod, a ValueError when MPI is not in use."""
    if not mpi_enabled():
        raise ValueError("Horovod has not been initialized or MPI has not been enabled.")
    from mpi4py import MPI
    return MPI.Query_thread() == MPI.THREAD_MULTIPLE


def gloo_built():
    return False


def gloo_enabled():
    return False


def nccl_built():
    return False


def ddl_built():
    return False


def ccl_built():
    return False


def cuda_built():
    """Whether the engine was built with CUDA: never (it moves host memory only). The
    torch binding's experimental CUDA tensors are staged through host memory by the
    binding, so this stays False with them too."""
    return False


def rocm_built():
    return False
