"""Under mpirun or srun, a rank that cannot go on ends the whole job.

Under srun without MPI (the store rendezvous, launch_env) the same holds, with the job
step ended by ``scancel --signal=KILL JOB.STEP`` where MPI_Abort would be called: srun,
like mpirun, waits for a stopped task for ever (unless --kill-on-bad-exit was given).

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
  finishing    From the engine's shutdown until this process exits, a watchdog ends
               this rank once it has been stopped (SIGSTOP, state T) for the peer timeout
               (HOROVODLIKE_PEER_TIMEOUT_SECONDS). With the engine gone nobody else can
               notice it, and the others would wait for it in MPI_Finalize for ever; a
               rank that works on after shutdown (saving a checkpoint) is never stopped,
               so it is left alone, as MPI_Finalize would wait for it too.

The watchdog is a small child process, not a thread: MPI_Init_thread runs inside
mpi4py's import with the interpreter lock held, and MPI_Finalize may hold it too, so no
Python thread of ours could run then (and a stopped rank runs no thread at all). It
waits on a pipe from this process; closing the pipe (cancel, or this process ending any
way at all) lets it go without a word. When its time is up it says why on stderr and
SIGKILLs this rank, which mpirun (and srun with MPI) turn into the end of the job.

Why the stopped rank's own watchdog, and not a rendezvous of the survivors before
MPI_Finalize: a survivor waiting with a deadline cannot tell a stopped rank from one
that is busy after its shutdown, and would end a correct job. The stopped rank's state
is plain to a process on its own host, at the cost of one look at /proc/<pid>/stat
every STOP_POLL seconds, from the engine's shutdown to the exit only.
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
STOP_POLL = 0.25       # seconds between looks at a finishing rank's state (at most)

# Run with python -S: no site import, so it starts in ~10 ms.
# Any further arguments are a command that ends the job (scancel of a Slurm step), run
# before the kill.
_WATCHDOG = r"""
import os, select, signal, subprocess, sys
pid, seconds, message = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
try:
    ready, _, _ = select.select([0], [], [], seconds)
except KeyboardInterrupt:
    sys.exit(0)
if not ready:
    os.write(2, message.encode("utf-8", "replace") + b"\n")
    if sys.argv[4:]:
        try:
            subprocess.run(sys.argv[4:], timeout=30)
        except (OSError, subprocess.SubprocessError):
            pass
    os.kill(pid, signal.SIGKILL)
"""


# The same, counting only the time this process stays stopped (state T in /proc; a
# debugger's stop is "t" and is left alone). A process that is gone ends it quietly.
_STOPWATCH = r"""
import os, select, signal, sys, time
pid, seconds, message, poll = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], float(sys.argv[4])
since = None
while True:
    try:
        if select.select([0], [], [], poll)[0]:
            sys.exit(0)
        with open("/proc/%d/stat" % pid) as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (KeyboardInterrupt, OSError):
        sys.exit(0)
    now = time.monotonic()
    if state != "T":
        since = None
    elif since is None:
        since = now
    elif now - since >= seconds:
        os.write(2, message.encode("utf-8", "replace") + b"\n")
        os.kill(pid, signal.SIGKILL)
        sys.exit(0)
"""


class Watchdog:
    """SIGKILL this process after `seconds` unless cancel() comes first; with
    stopped=True, once it has been stopped for `seconds` on end."""

    def __init__(self, seconds, message, stopped=False, end_job=()):
        script, extra = _WATCHDOG, list(end_job)
        if stopped:
            script, extra = _STOPWATCH, [f"{min(STOP_POLL, max(seconds / 8, 0.02)):.3f}"]
        # A stop watch has a session of its own, so that a stop of this process's group
        # does not stop it too; it goes when the pipe closes all the same.
        self._proc = subprocess.Popen(
            [sys.executable, "-S", "-c", script, str(os.getpid()), f"{seconds:.3f}",
             message, *extra], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
            start_new_session=stopped)

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
_stopwatch = None      # the finishing watchdog, from the engine's shutdown (engine_stopped)
_hooked = False
_slurm = False         # launched by srun without MPI: scancel ends the step (watch)


def slurm_step_end():
    """The command that ends this task's Slurm job step, or () outside one."""
    job, step = os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURM_STEP_ID")
    if not job or not step:
        return ()
    return ("scancel", "--quiet", "--signal=KILL", f"{job}.{step}")


def _end_job():
    return slurm_step_end() if _slurm else ()


def watch(rank, launcher="mpi"):
    """Once this rank has MPI up (or is a task of srun without MPI, launcher "slurm"):
    end the job at exit if it failed (see at_exit)."""
    global _hooked, _slurm
    with _lock:
        if _hooked:
            return
        _hooked, _slurm = True, launcher == "slurm"
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
                                          f"within {ABORT_GRACE:.0f} s; ending the job",
                             end_job=_end_job())


def engine_stopped(rank, host):
    """The engine has shut down: from now until this process exits (or the engine starts
    again), end the job if this rank stays stopped for the peer timeout."""
    global _stopwatch
    with _lock:
        if _stopwatch is not None:
            return
        limit = contract.peer_timeout()
        try:
            _stopwatch = Watchdog(limit, f"[horovodlike rank {rank}] ERROR: rank {rank} "
                                         f"(host {host}) was stopped for {limit:g} s "
                                         f"({contract.PEER_TIMEOUT}) after its engine shut "
                                         f"down: the other ranks would wait for it in "
                                         f"MPI_Finalize for ever; ending the job",
                                  stopped=True)
        except OSError as exc:     # out of processes or memory: shutdown itself went well
            _log.warning("[horovodlike rank %s] cannot watch this rank after its shutdown "
                         "(%s): if it is stopped now, the job waits for it", rank, exc)


def engine_starting():
    """The engine starts (again): its own liveness names a stopped rank from now on."""
    global _stopwatch
    with _lock:
        watchdog, _stopwatch = _stopwatch, None
    if watchdog is not None:
        watchdog.cancel()


def at_exit():
    """At exit: stop the engine (its shutdown may find a lost rank), then MPI_Abort if
    the job failed, since MPI_Finalize would wait for the lost rank for ever."""
    from . import engine
    engine.shutdown()
    if _failed is not None and _slurm:
        _scancel_step()
        return
    mpi = sys.modules.get("mpi4py.MPI")
    if _failed is None or mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return
    rank, why = _failed
    sys.stdout.flush()
    _log.error("[horovodlike rank %s] ERROR: ending the MPI job (MPI_Abort): %s", rank, why)
    sys.stderr.flush()
    mpi.COMM_WORLD.Abort(1)


def _scancel_step():
    """srun's MPI_Abort: end the step, the stopped or hung rank that failed it too."""
    rank, why = _failed
    argv = slurm_step_end()
    if not argv:
        return
    sys.stdout.flush()
    _log.error("[horovodlike rank %s] ERROR: ending the Slurm job step (%s): %s", rank,
               " ".join(argv), why)
    sys.stderr.flush()
    try:
        subprocess.run(argv, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        _log.error("[horovodlike rank %s] cannot end the Slurm job step (%s): %s; a rank "
                   "that is stopped or hung keeps it waiting (srun --kill-on-bad-exit=1 "
                   "ends a step when a task fails)", rank, argv[0], exc)
