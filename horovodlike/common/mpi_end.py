"""Under mpirun or srun, a rank that cannot go on ends the whole job.

mpirun and srun end a job when one of its processes exits non-zero, dies or calls
MPI_Abort, but not while the survivors wait. A rank that is stopped (SIGSTOP) or hung
keeps its peers waiting for ever: in MPI_Init_thread and the start-up collectives, which
wait for every rank, or at exit in MPI_Finalize, which waits for every rank too, even
after the engine has named the lost rank and raised. So, on an MPI launch only:

  start-up     From before MPI_Init until the engine has started, a watchdog ends this
               rank if start-up takes longer than HOROVODLIKE_START_TIMEOUT plus
               START_MARGIN seconds (the engine's own start-up limits fire first and
               name the rank; this bounds MPI's waits, which have no limit).
  lost peer    Once this rank has seen the job fail (a peer named lost, a stall
               shutdown, a failed start-up), it calls MPI_Abort at exit instead of
               MPI_Finalize, and a watchdog ends it if it is still running ABORT_GRACE
               seconds later (a program that caught the error and waits on something).

The watchdog is a small child process, not a thread: MPI_Init_thread runs inside
mpi4py's import with the interpreter lock held, and MPI_Finalize may hold it too, so no
Python thread of ours could run then. It waits on a pipe from this process; closing the
pipe (cancel, or this process ending any way at all) lets it go without a word. When
its time is up it says why on stderr and SIGKILLs this rank, which mpirun (and srun
with MPI) turn into the end of the job.
"""
import atexit
import logging
import os
import subprocess
import sys
import threading

from . import launch_contract as contract

_log = logging.getLogger(__name__)

START_MARGIN = 5.0     # seconds beyond HOROVODLIKE_START_TIMEOUT
ABORT_GRACE = 5.0      # seconds a rank that saw the job fail has to exit by itself

# Run with python -S: no site import, so it starts in ~10 ms.
_WATCHDOG = r"""
import os, select, signal, sys
pid, seconds, message = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
try:
    ready, _, _ = select.select([0], [], [], seconds)
except KeyboardInterrupt:
    sys.exit(0)
if not ready:
    os.write(2, message.encode("utf-8", "replace") + b"\n")
    os.kill(pid, signal.SIGKILL)
"""


class Watchdog:
    """SIGKILL this process after `seconds` unless cancel() comes first."""

    def __init__(self, seconds, message):
        self._proc = subprocess.Popen(
            [sys.executable, "-S", "-c", _WATCHDOG, str(os.getpid()), f"{seconds:.3f}",
             message], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)

    def cancel(self):
        if self._proc is None:
            return
        try:
            self._proc.stdin.close()       # EOF: the watchdog exits quietly
        except OSError:
            pass
        self._proc.wait()
        self._proc = None


def guard_start(rank):
    """The start-up watchdog (see the module comment); cancel() it once started."""
    limit = contract.start_timeout() + START_MARGIN
    return Watchdog(limit, f"[horovodlike rank {rank}] ERROR: start-up under MPI did not "
                           f"finish within {limit:.0f} s ({contract.START_TIMEOUT} + "
                           f"{START_MARGIN:.0f}): a rank is stopped, hung or never "
                           f"started; ending the job")


_lock = threading.Lock()
_failed = None         # (rank, why) once this rank has seen the job fail
_backstop = None       # its watchdog, kept for the life of the process (see job_failed)
_hooked = False


def watch(rank):
    """Once this rank has MPI up: end the job at exit if it failed (see at_exit)."""
    global _hooked
    with _lock:
        if _hooked:
            return
        _hooked = True
    # Registered after mpi4py's import, so it runs before MPI is finalized.
    atexit.register(at_exit)


def job_failed(rank, why):
    """This rank has seen the job fail: end the job at exit (MPI_Abort), and at the
    latest ABORT_GRACE seconds from now. Idempotent: the first cause is kept."""
    global _failed, _backstop
    with _lock:
        if _failed is not None:
            return
        _failed = (rank, why)
        # Never cancelled: it goes when this process does (its pipe closes then).
        _backstop = Watchdog(ABORT_GRACE, f"[horovodlike rank {rank}] ERROR: the job "
                                          f"failed ({why}) and this rank did not exit "
                                          f"within {ABORT_GRACE:.0f} s; ending the job")


def at_exit():
    """At exit: stop the engine (its shutdown may find a lost rank), then MPI_Abort if
    the job failed, since MPI_Finalize would wait for the lost rank for ever."""
    from . import engine
    engine.shutdown()
    mpi = sys.modules.get("mpi4py.MPI")
    if _failed is None or mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return
    rank, why = _failed
    sys.stdout.flush()
    _log.error("[horovodlike rank %s] ERROR: ending the MPI job (MPI_Abort): %s", rank, why)
    sys.stderr.flush()
    mpi.COMM_WORLD.Abort(1)
