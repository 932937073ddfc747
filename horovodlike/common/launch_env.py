"""Start-up from the variables other launchers and schedulers set.

torchrun (``python -m torch.distributed.run``) sets ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``GROUP_WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT`` in every process it starts; Kubeflow's PyTorchJob,
Ray Train's TorchTrainer and Spark's TorchDistributor set the same names (through
torchrun or directly). Horovod's own Gloo workers carry ``HOROVOD_RANK``/``HOROVOD_SIZE``
(and the local/cross pairs) with the rendezvous in ``HOROVOD_GLOO_RENDEZVOUS_ADDR`` /
``HOROVOD_GLOO_RENDEZVOUS_PORT``. A task of ``srun`` started without an MPI plugin
(``SLURM_STEP_ID``, ``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS``, common/slurm.py) has no
MPI to exchange addresses through: it is adopted the same way.

:func:`detect` reads these into a :class:`LaunchEnv` (who this process is, and where the
rendezvous is). :func:`adopt` then makes the process look as if horovodlikerun had
started it: rank 0 serves horovodlike's rendezvous store, every rank gets
``HOROVODLIKE_STORE_ADDR``, ``HOROVODLIKE_JOB_ID`` and ``HOROVOD_RANK``/``HOROVOD_SIZE``
(and the local/cross variables where known), and the usual store exchange in
``hvd.init()`` does the rest.

Where the store listens:
  * with ``MASTER_ADDR``/``MASTER_PORT``: on ``MASTER_ADDR`` at ``MASTER_PORT + 1``.
    ``MASTER_PORT`` itself belongs to torch (torchrun's agent, or rank 0's
    ``init_process_group``, serves its TCPStore there), and a script may use both.
    ``HOROVODLIKE_RENDEZVOUS_PORT`` overrides the port when +1 is taken.
  * with ``HOROVOD_GLOO_RENDEZVOUS_ADDR``/``_PORT``: exactly there (nothing else
    listens there when horovodlike is used).
  * under srun: on the step's first host (where task 0 runs), at a port made from the
    job and step ids (12000-27999, below Linux's ephemeral ports), or
    ``HOROVODLIKE_RENDEZVOUS_PORT``. A step on one node shares its key through a file
    (below: the tasks' common parent is the node's slurmstepd); a step on several
    nodes needs ``HOROVODLIKE_JOB_KEY`` exported before srun, which passes it on.
Rank 0 runs the store in a background thread for the rest of the process's life, so an
init after a shutdown rendezvouses again.

The store and the engine authenticate every connection with the job's key
(``HOROVODLIKE_JOB_KEY``). Where it comes from:
  * ``HOROVODLIKE_JOB_KEY`` already set (the same secret on every rank, e.g. from a
    Kubernetes secret): used as is.
  * ``HOROVODLIKE_JOB_KEY_FILE``: a key file on storage every host shares, owned by
    this user and readable by nobody else.
  * every rank on this host under one parent (torchrun's ranks are children of its
    agent, srun's of the node's slurmstepd): rank 0 makes a key and leaves it in a
    file only this user can read, in a directory only this user can write to whose
    name the ranks learn from what started them (``key_dir``); the others read it
    there; rank 0 removes it once every rank has joined, and at exit.
  * otherwise (ranks on several hosts with no shared secret): the job refuses to start
    and says how to give it a key. ``HOROVODLIKE_INSECURE_UNAUTHENTICATED_RENDEZVOUS=1``
    runs it anyway with a key derived from the job's public description, which anyone
    who can reach the master's address can compute; rank 0 warns.
"""
import atexit
import hashlib
import logging
import os
import socket
import stat
import time
from dataclasses import dataclass
from typing import Optional

from . import jobkey, slurm
from . import launch_contract as contract

# mpirun / srun-with-PMI started us: their variables describe the job, not these.
_MPI_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")


@dataclass(frozen=True)
class LaunchEnv:
    launcher: str              # "torchrun", "horovod-env" or "slurm"
    rank: int
    size: int
    local_rank: Optional[int]
    local_size: Optional[int]
    cross_rank: Optional[int]   # the node's index (torchrun's GROUP_RANK)
    cross_size: Optional[int]   # number of nodes (GROUP_WORLD_SIZE)
    rendezvous_host: str
    rendezvous_port: int
    job_id: str

    @property
    def rendezvous(self):
        return f"{self.rendezvous_host}:{self.rendezvous_port}"


def _int(environ, name, required=False):
    value = environ.get(name)
    if value in (None, ""):
        if required:
            raise ValueError(f"{name} is not set")
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer") from None


def detect(environ=None):
    """The launch environment this process was started in, or None if it is not one of
    these (horovodlikerun's and MPI's own variables are left to the bootstrap).

    Raises ValueError for a half-set or inconsistent environment (a rank outside the
    world, a port that is not a number) rather than running as the wrong rank.
    """
    env = os.environ if environ is None else environ
    if env.get(contract.STORE_ADDR):
        return None
    # mpirun's variables win, except in torchrun's children: torchrun started by srun or
    # mpirun (one per node) passes the node task's PMI variables down to its ranks.
    if any(env.get(v) for v in _MPI_VARS) and not env.get("TORCHELASTIC_RUN_ID"):
        return None
    if env.get(contract.RANK) and env.get(contract.SIZE):
        host = env.get("HOROVOD_GLOO_RENDEZVOUS_ADDR")
        if host:
            port = _int(env, "HOROVOD_GLOO_RENDEZVOUS_PORT", required=True)
        elif env.get("MASTER_ADDR"):
            host, port = env["MASTER_ADDR"], _store_port(env)
        else:
            return None     # a lone rank id with nowhere to meet: not ours to guess
        return _checked(LaunchEnv(
            "horovod-env", _int(env, contract.RANK), _int(env, contract.SIZE),
            _int(env, contract.LOCAL_RANK), _int(env, contract.LOCAL_SIZE),
            _int(env, contract.CROSS_RANK), _int(env, contract.CROSS_SIZE),
            host, port, f"horovod-env-{host}-{port}"))
    if env.get("RANK") is not None and env.get("WORLD_SIZE") is not None:
        if _int(env, "WORLD_SIZE") == 1 and _int(env, "RANK") == 0:
            return None     # a job of one needs no rendezvous
        if not env.get("MASTER_ADDR") or not env.get("MASTER_PORT"):
            raise ValueError("RANK and WORLD_SIZE are set but MASTER_ADDR/MASTER_PORT are "
                             "not: horovodlike needs the master's address to rendezvous")
        host, port = env["MASTER_ADDR"], _store_port(env)
        run_id = env.get("TORCHELASTIC_RUN_ID") or "none"
        restart = env.get("TORCHELASTIC_RESTART_COUNT") or "0"
        local_rank, local_size = _int(env, "LOCAL_RANK"), _int(env, "LOCAL_WORLD_SIZE")
        if local_size is None and _is_loopback(host):
            # A Kubeflow-style environment (RANK, WORLD_SIZE, MASTER_*) says nothing of
            # hosts; a master on loopback can only be reached from this one.
            local_rank, local_size = _int(env, "RANK"), _int(env, "WORLD_SIZE")
        return _checked(LaunchEnv(
            "torchrun", _int(env, "RANK"), _int(env, "WORLD_SIZE"),
            local_rank, local_size,
            _int(env, "GROUP_RANK") if env.get("GROUP_RANK") is not None
            else _int(env, "NODE_RANK"),
            _int(env, "GROUP_WORLD_SIZE"),
            host, port, f"torchrun-{run_id}-{restart}-{host}-{env['MASTER_PORT']}"))
    return _slurm_step(env)


# srun without an MPI plugin: the ports rank 0's store may take, one per job step, away
# from the ephemeral ports Linux hands out (32768 and up).
SLURM_PORT_BASE, SLURM_PORT_SPAN = 12000, 16000


def _slurm_step(env):
    """A task of srun (started without PMI, so MPI cannot do the exchange): rank 0 of the
    step serves the store on the step's first host, at a port taken from the job and
    step ids (HOROVODLIKE_RENDEZVOUS_PORT overrides it)."""
    task = slurm.step_task(env)
    if task is None:
        return None
    rank, size, local_rank, local_size, node, nodes, first = task
    if size == 1:
        return None
    job, step = _int(env, "SLURM_JOB_ID") or 0, _int(env, "SLURM_STEP_ID") or 0
    port = _int(env, contract.RENDEZVOUS_PORT)
    if port is None:
        port = SLURM_PORT_BASE + (job * 64 + step) % SLURM_PORT_SPAN
    if nodes == 1:
        local_rank, local_size = rank, size
    return _checked(LaunchEnv("slurm", rank, size, local_rank, local_size, node, nodes,
                              first, port, f"slurm-{job}.{step}"))


def _store_port(env):
    override = _int(env, contract.RENDEZVOUS_PORT)
    if override is not None:
        return override
    return _int(env, "MASTER_PORT", required=True) + 1


def _checked(le):
    if le.size < 1 or not 0 <= le.rank < le.size:
        raise ValueError(f"{le.launcher}: rank {le.rank} of world size {le.size}")
    if le.local_size is not None and le.local_rank is not None and \
            not 0 <= le.local_rank < le.local_size:
        raise ValueError(f"{le.launcher}: local rank {le.local_rank} of {le.local_size}")
    if not 0 < le.rendezvous_port < 65536:
        raise ValueError(f"{le.launcher}: rendezvous port {le.rendezvous_port} is not a "
                         f"TCP port")
    return le


# ------------------------------------------------------------------ rendezvous store

_server = None       # rank 0's store, kept for the life of the process


def _is_loopback(host):
    try:
        return all(info[4][0].startswith("127.") or info[4][0] == "::1"
                   for info in socket.getaddrinfo(host, None, socket.AF_INET))
    except OSError:
        return False


def bind_address(host):
    """Where rank 0's store listens: loopback when the master address is loopback
    (one machine), else the master address itself when it is one of this host's, else
    every interface (e.g. a service name that routes to this pod)."""
    if _is_loopback(host):
        return "127.0.0.1"
    try:
        ip = socket.gethostbyname(host)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((ip, 0))
        return ip
    except OSError:
        return "0.0.0.0"


def serve_rendezvous(le, key):
    """On rank 0: start (once) horovodlike's store where le says. Returns the server."""
    global _server
    if _server is not None:
        return _server
    from .store import StoreServer
    bind = bind_address(le.rendezvous_host)
    try:
        _server = StoreServer(bind, le.rendezvous_port, key=key).start()
    except OSError as exc:
        raise RuntimeError(
            f"horovodlike ({le.launcher}): rank 0 cannot serve the rendezvous on "
            f"{bind}:{le.rendezvous_port}: {exc.strerror or exc}. Set "
            f"{contract.RENDEZVOUS_PORT} to a free port (the same on every rank)") from None
    return _server


def adopt(environ=None):
    """Make a torchrun/Kubeflow/Ray/Spark (or bare HOROVOD_*) process look like a
    horovodlikerun rank; rank 0 starts the store. Returns the LaunchEnv, or None when
    the environment is none of these (nothing is changed then)."""
    global adopted
    env = os.environ if environ is None else environ
    le = detect(env)
    if le is None:
        return None
    key = job_key(le, env)
    if le.rank == 0:
        serve_rendezvous(le, key)
    env[jobkey.ENV] = jobkey.to_hex(key)
    env.update(contract.rank_vars(le.rank, le.size, le.local_rank, le.local_size,
                                  le.cross_rank, le.cross_size))
    env[contract.STORE_ADDR] = le.rendezvous
    env[contract.JOB_ID] = le.job_id
    if le.launcher == "slurm" and le.local_size == le.size:
        # A step on one node: the engines listen on loopback only, as horovodlikerun's
        # ranks on one host do (the store listens where the step's host name points).
        env.setdefault(contract.BIND_ADDR, "127.0.0.1")
    if environ is None:
        adopted = le
    return le


adopted = None     # the LaunchEnv this process adopted, kept after its variables are set


# ------------------------------------------------------------------ the job's key

def _parent_identity():
    """(pid, start time) of the parent process: the same for every rank one torchrun
    agent started, different for the next run even if the pid comes back."""
    ppid = os.getppid()
    try:
        with open(f"/proc/{ppid}/stat") as f:
            start = f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        start = "0"
    return ppid, start


def _walk_up(path, owners, stop_at_private):
    """Whether every directory from `path` up is a real directory (not a symlink) owned by
    one of `owners` and writable by neither group nor other, up to / or, with
    stop_at_private, up to the first one of mode 0700 (nobody else can reach below it)."""
    path = os.path.abspath(path)
    while True:
        try:
            st = os.lstat(path)
        except OSError:
            return False
        if not stat.S_ISDIR(st.st_mode) or st.st_uid not in owners or st.st_mode & 0o022:
            return False
        if stop_at_private and not st.st_mode & 0o077:
            return True
        parent = os.path.dirname(path)
        if parent == path:
            return not stop_at_private
        path = parent


def _is_private_tree(path):
    """Whether only this user can create or rename entries in `path`: it and every
    directory up to the nearest one that is ours with mode 0700 are ours, not symlinks,
    and writable by nobody else. (Above a 0700 directory nobody else can reach in.)"""
    return _walk_up(path, (os.getuid(),), stop_at_private=True)


def key_dir(environ=None):
    """(directory, why-not) where the ranks of one host leave the job's key for each
    other: a directory no other user can write to, whose name every rank learns from
    what started it, never a fixed name in a shared directory (which another user
    could create first). directory is None when there is none; why-not then says what
    was looked for.

      * $XDG_RUNTIME_DIR/horovodlike: the user's own runtime directory (systemd makes
        it, mode 0700, on a tmpfs emptied at logout).
      * torchrun's own run directory: torchrun makes a fresh mkdtemp directory for
        every run and tells each rank its error file in it (TORCHELASTIC_ERROR_FILE,
        <run dir>/attempt_<n>/<local rank>/error.json); the ranks of one attempt share
        its attempt directory.
      * $XDG_CACHE_HOME/horovodlike or ~/.cache/horovodlike: inside the user's home,
        which only they (and root) can write to, checked up to / as ssh checks ~/.ssh.
    """
    env = os.environ if environ is None else environ
    tried = []
    xdg = env.get("XDG_RUNTIME_DIR")
    if xdg:
        if _is_private_tree(xdg):
            return _own_subdir(xdg), None
        tried.append(f"XDG_RUNTIME_DIR={xdg} is not a directory private to uid {os.getuid()}")
    else:
        tried.append("XDG_RUNTIME_DIR is not set")
    error_file = env.get("TORCHELASTIC_ERROR_FILE")
    if error_file:
        attempt = os.path.dirname(os.path.dirname(error_file))
        if _is_private_tree(attempt):
            return attempt, None
        tried.append(f"torchrun's run directory {attempt} is not private to uid {os.getuid()}")
    else:
        tried.append("no torchrun run directory (TORCHELASTIC_ERROR_FILE)")
    cache = _cache_dir(env)
    if cache:
        if _is_safe_chain(cache):
            return _own_subdir(cache), None
        tried.append(f"{cache} is not reachable through directories only uid "
                     f"{os.getuid()} or root can write to")
    else:
        tried.append("neither XDG_CACHE_HOME nor HOME is set")
    return None, "; ".join(tried)


def _cache_dir(env):
    """The user's cache directory ($XDG_CACHE_HOME, else $HOME/.cache), made if missing:
    inside the home directory, which no other user can write to, so its name may be
    fixed. None without either variable."""
    base = env.get("XDG_CACHE_HOME") or (
        os.path.join(env["HOME"], ".cache") if env.get("HOME") else None)
    if base and not os.path.isdir(base):
        try:
            os.makedirs(base, 0o700, exist_ok=True)
        except OSError:
            return None
    return base


def _is_safe_chain(path):
    """Whether nobody but this user (and root) can create, rename or remove entries
    anywhere on the way to `path`: every directory from it up to / is a real directory
    (not a symlink) owned by this user or root and writable by neither group nor other.
    This is the check ssh makes of ~/.ssh, and what a home directory passes."""
    return _walk_up(path, (os.getuid(), 0), stop_at_private=False)


def _own_subdir(base):
    """base/horovodlike, ours and mode 0700 (made if missing), never through a symlink."""
    path = os.path.join(base, "horovodlike")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise RuntimeError(f"horovodlike: cannot make {path}: {exc}") from None
    if not _is_private_tree(path):
        raise RuntimeError(
            f"horovodlike: {path} must be a directory (not a symlink) owned by uid "
            f"{os.getuid()} that no other user can write to; remove it and start again")
    return path


def key_path(le, environ=None):
    """The key file of this job on this host, or raise saying why there is none. Its
    name carries the parent process's identity: a file left behind by an earlier run
    (rank 0 SIGKILLed) is never read by the next one, and holds a dead job's key."""
    directory, why_not = key_dir(environ)
    if directory is None:
        raise RuntimeError(
            f"horovodlike ({le.launcher}): the ranks of this host have no private place "
            f"to share the job's key ({why_not}). Give every rank the same "
            f"{jobkey.ENV} (64 hex digits), or {contract.JOB_KEY_FILE}=<a key file only you "
            f"can read>, or set XDG_RUNTIME_DIR to a directory only you can write to")
    ppid, start = _parent_identity()
    return os.path.join(directory, f"{_safe(le.job_id)}-{ppid}-{start}.key")


def _safe(job_id):
    return "".join(c if c.isalnum() or c in "-._" else "_" for c in job_id)[:150]


def _open_private(path, what):
    """A file of ours that nobody else can read, opened without following a symlink."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    f = os.fdopen(fd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        f.close()
        raise RuntimeError(f"horovodlike: {what} {path} is not private to this user: it must "
                           f"be a regular file owned by uid {os.getuid()} with mode 0600 "
                           f"(or 0400)")
    return f


def _read_key_file(path, timeout):
    deadline = time.monotonic() + timeout
    while True:
        try:
            f = _open_private(path, "the job's key file")
        except FileNotFoundError:
            if time.monotonic() > deadline:
                raise RuntimeError(_no_key_message(path, timeout)) from None
            time.sleep(0.05)
            continue
        except OSError as exc:     # ELOOP: a symlink where the key file should be
            raise RuntimeError(f"horovodlike: cannot open the job's key file {path}: "
                               f"{exc.strerror or exc}") from None
        with f:
            text = f.read()
        if text.endswith("\n"):
            return jobkey.from_hex(text, where=path)
        time.sleep(0.05)      # not completely written yet (rank 0 renames it in place)


def _no_key_message(path, timeout):
    """Why a rank found no key: most often, ranks of one host under different parents."""
    ppid, _ = _parent_identity()
    name = os.path.basename(path)
    job = name[:name.rindex("-", 0, name.rindex("-"))]
    try:
        others = sorted(f for f in os.listdir(os.path.dirname(path))
                        if f.startswith(job + "-") and f.endswith(".key") and f != name)
    except OSError:
        others = []
    seen = (f" ({len(others)} key file(s) of this job id left by other parent processes "
            f"are there: {', '.join(others[:3])})") if others else ""
    return (f"horovodlike: rank 0 did not leave the job's key in {path} within "
            f"{timeout:.0f} s ({contract.START_TIMEOUT}){seen}. The ranks of one host find "
            f"it through their common parent process (this rank's is pid {ppid}); ranks "
            f"started by different parents (not by one torchrun agent) cannot meet this "
            f"way: give every rank the same {jobkey.ENV}, or {contract.JOB_KEY_FILE}")


def _write_key_file(path, key):
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(jobkey.to_hex(key) + "\n")
    os.replace(tmp, path)
    global _key_file
    _key_file = path
    atexit.register(key_delivered)


_key_file = None      # rank 0's key file while the other local ranks may still read it


def key_delivered():
    """Rank 0: every rank has the key (the store exchange is done, or the process
    exits): the key file goes. One left behind by a SIGKILL is harmless (key_path)."""
    global _key_file
    path, _key_file = _key_file, None
    if path is not None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def read_key_file(path):
    """HOROVODLIKE_JOB_KEY_FILE: a key the user put on storage every host shares."""
    try:
        with _open_private(path, contract.JOB_KEY_FILE) as f:
            return jobkey.from_hex(f.read(), where=f"{contract.JOB_KEY_FILE}={path}")
    except OSError as exc:
        raise RuntimeError(f"horovodlike: cannot read {contract.JOB_KEY_FILE}={path}: "
                           f"{exc.strerror or exc}") from None


def job_key(le, environ=None):
    """The key this job's store and engine connections use (see the module's doc)."""
    env = os.environ if environ is None else environ
    given = env.get(jobkey.ENV)
    if given:
        return jobkey.from_hex(given)
    if env.get(contract.JOB_KEY_FILE):
        return read_key_file(env[contract.JOB_KEY_FILE])
    if le.local_size is not None and le.local_size == le.size:
        path = key_path(le, env)
        if le.rank == 0:
            key = jobkey.generate()
            _write_key_file(path, key)
            return key
        return _read_key_file(path, contract.start_timeout(env))
    if env.get(contract.INSECURE_RENDEZVOUS) != "1":
        raise RuntimeError(
            f"horovodlike ({le.launcher}): "
            + (f"this job's ranks span hosts (world size {le.size}, {le.local_size} on "
               f"this host)" if le.local_size is not None else
               f"this job's ranks may span hosts (world size {le.size}; the environment "
               f"does not say how many run on this host: LOCAL_WORLD_SIZE is unset)")
            + f" and no job key was given, so anyone who can reach {le.rendezvous} could "
            f"join it. Give every rank "
            f"the same secret: {jobkey.ENV}=<64 hex digits> from a secret store (a "
            f"Kubernetes Secret, Ray's or Spark's own channel; make one with python -c "
            f"'import secrets; print(secrets.token_hex(32))'), or "
            f"{contract.JOB_KEY_FILE}=<path> to a "
            f"key file on shared storage readable only by you (mode 0600). To run "
            f"unauthenticated anyway, set {contract.INSECURE_RENDEZVOUS}=1")
    if le.rank == 0:
        logging.getLogger(__name__).warning(
            "horovodlike: WARNING: %s=1: the rendezvous at %s is NOT authenticated; anyone "
            "who can reach it can join this job as a rank and read or change its data",
            contract.INSECURE_RENDEZVOUS, le.rendezvous)
    return hashlib.sha256(f"horovodlike-unauthenticated/{le.job_id}".encode()).digest()
