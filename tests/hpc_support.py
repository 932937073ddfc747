"""What tests/test_slurm.py and tests/test_mpich.py share: running a launcher (srun,
sbatch, salloc, mpiexec) with its output read line by line and each line's arrival time
kept, so a test can say how long after a rank stopped the job ended; a timeout that kills
the launcher's whole process group; and the environment its ranks need.
"""
import glob
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass

from harness import PYTHON, REPO

# Where a rank is told to stop or die, the others must name it within the peer timeout.
PEER_TIMEOUT = 5


def _mpich_pin():
    for line in (REPO / "requirements.txt").read_text().splitlines():
        if "# [mpich]" in line:
            return line.split("#")[0].strip()
    return "mpich"


def _mpich_prefix():
    """Where scripts/setup.sh --test installs MPICH (HOROVODLIKE_MPICH_PREFIX, or the
    user's cache folder)."""
    if os.environ.get("HOROVODLIKE_MPICH_PREFIX"):
        return os.environ["HOROVODLIKE_MPICH_PREFIX"]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"),
                                                             ".cache")
    return os.path.join(cache, "horovodlike-tests", MPICH_PIN.replace("==", "-"))


MPICH_PIN = _mpich_pin()
MPICH_PREFIX = _mpich_prefix()
MPICH_LIBMPI = os.path.join(MPICH_PREFIX, "lib", "libmpi.so.12")
MPICH_MPIEXEC = os.path.join(MPICH_PREFIX, "bin", "mpiexec")
HAVE_MPICH = os.access(MPICH_MPIEXEC, os.X_OK) and os.path.exists(MPICH_LIBMPI)


@dataclass
class Watched:
    argv: list
    returncode: int
    lines: list            # [(seconds since the start, line)], stdout and stderr merged
    elapsed: float

    @property
    def output(self):
        return "\n".join(line for _, line in self.lines)

    def first(self, needle):
        """Seconds from the start to the first line containing `needle`, or None."""
        return next((t for t, line in self.lines if needle in line), None)

    def describe(self):
        return (f"$ {' '.join(self.argv)}\nexit {self.returncode} after "
                f"{self.elapsed:.1f} s\n" + "\n".join(self.output.splitlines()[-80:]))


def rank_env(base, **extra):
    """base (a dict) with this checkout importable, the venv's bin first on PATH,
    unbuffered output and a short peer timeout."""
    env = dict(base)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"]
                                     if env.get("PYTHONPATH") else "")
    env["PATH"] = os.path.dirname(PYTHON) + os.pathsep + env.get("PATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    env["HOROVODLIKE_PEER_TIMEOUT_SECONDS"] = str(PEER_TIMEOUT)
    for k in list(env):
        if k.startswith(("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVODLIKE_STORE_ADDR",
                         "HOROVODLIKE_JOB_", "OMPI_COMM_WORLD", "PMI_", "PMIX_")):
            del env[k]
    env.update(extra)
    return env


def run_watched(argv, env, timeout, cwd=None, on_timeout=None):
    """Run argv in a session of its own, its output lines timed; on timeout kill the
    session (and call on_timeout, e.g. to cancel Slurm jobs) and raise AssertionError
    with the output so far."""
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            text=True, errors="replace", start_new_session=True)
    lines = []

    def pump():
        for line in proc.stdout:
            lines.append((time.monotonic() - t0, line.rstrip("\n")))

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        if on_timeout is not None:
            on_timeout()
        reader.join(5)
        res = Watched(list(argv), -9, lines, time.monotonic() - t0)
        raise AssertionError(f"did not end within {timeout} s:\n{res.describe()}") from None
    reader.join(10)
    return Watched(list(argv), rc, lines, time.monotonic() - t0)


MPICH_SHM = "/dev/shm/mpich_shm_*"


def _mapped(paths):
    mapped = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps") as f:
                mapped.update(p for p in paths if p in f.read())
        except OSError:
            continue
    return mapped


def remove_mpich_shm(before):
    """Remove the MPICH shared-memory files made since `before` (a set of names) that no
    live process maps: a job that MPI_Abort ended, or whose rank was killed, leaves its
    file behind (MPICH unlinks it only in MPI_Finalize). Returns the names removed."""
    new = set(glob.glob(MPICH_SHM)) - set(before)
    gone = new - _mapped(new)
    for path in gone:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    return gone
