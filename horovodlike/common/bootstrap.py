"""Who am I and who are my peers: the launch environment and the address-blob exchange.

Three ways a process is started, checked in this order:
  horovodlikerun   HOROVOD_RANK/SIZE + HOROVODLIKE_STORE_ADDR: blobs go through the
                   launcher's rendezvous store.
  mpirun           OpenMPI's OMPI_COMM_WORLD_*, MPICH's (and srun --mpi=pmi2's) PMI_*:
                   blobs go through an mpi4py allgather.
  srun             a task of a job step (SLURM_STEP_ID, SLURM_PROCID): rank 0 serves the
                   store and blobs go through it, as under horovodlikerun (launch_env).
                   A batch script or an salloc shell is no task: it runs as one rank.
  plain python     one rank, nothing to exchange.
The engine never rendezvouses itself; it only hands us an opaque blob and takes all of
them back (as NCCL's bootstrap does). What crosses the wire is plain bytes with a fixed
layout (`pack_peer`), never a pickle, and every store connection is authenticated with
the job's key (`jobkey`).
"""
import fcntl
import os
import socket
import struct
import time
from dataclasses import dataclass

from . import jobkey, launch_env, mpi_init
from . import launch_contract as contract


@dataclass
class Topology:
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    hostname: str
    launcher: str          # "horovodlikerun", "mpi", "slurm" (srun) or "single"
    homogeneous: bool = True   # every host runs the same number of ranks


def _env_int(*names):
    for n in names:
        v = os.environ.get(n)
        if v not in (None, ""):
            return int(v)
    return None


def hostname() -> str:
    return os.environ.get(contract.HOSTNAME) or socket.gethostname()


def advertise_address() -> str:
    """The address peers on other hosts use to reach us (HOROVODLIKE_IFACE_ADDR wins)."""
    addr = os.environ.get(contract.IFACE_ADDR)
    if addr:
        return addr
    store = os.environ.get(contract.STORE_ADDR)
    if store:
        # The interface this host uses to reach the launcher's store is one the other
        # hosts can reach too (a UDP "connect" sends nothing; it only picks the route).
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((store.rsplit(":", 1)[0], 1))
                return s.getsockname()[0]
        except OSError:
            pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def detect():
    """(launcher, rank, size) from the environment, before any exchange."""
    # torchrun / Kubeflow / Ray Train / Spark (or bare HOROVOD_*) variables become
    # horovodlikerun's, with rank 0 serving the store (see launch_env).
    # A task of srun becomes one too (no MPI there to exchange through).
    launch_env.adopt()
    if os.environ.get(contract.STORE_ADDR) and _env_int(contract.SIZE) is not None:
        adopted = launch_env.adopted
        launcher = "slurm" if adopted is not None and adopted.launcher == "slurm" \
            else "horovodlikerun"
        return launcher, _env_int(contract.RANK), _env_int(contract.SIZE)
    mpi_size = _env_int("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE")
    if mpi_size is not None or os.environ.get("PMIX_RANK") is not None:
        return "mpi", _env_int("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"), mpi_size
    return "single", 0, 1


# Launches whose blobs go through the rendezvous store (not MPI) when no comm is given.
STORE_LAUNCHERS = ("horovodlikerun", "slurm")


_generation = 0   # init -> shutdown -> init uses fresh store keys
_key = None       # this job's key, once known (kept across shutdown/init)

# One rank's entry in the exchange: hostname length, hostname (UTF-8), engine blob.
HOST_MAX = 255


def pack_peer(host: str, blob: bytes) -> bytes:
    raw = host.encode("utf-8")
    if not raw or len(raw) > HOST_MAX or b"\0" in raw:
        raise ValueError(f"host name {host!r} must be 1..{HOST_MAX} bytes without NUL")
    return bytes([len(raw)]) + raw.ljust(HOST_MAX, b"\0") + blob


def unpack_peer(raw: bytes, blob_bytes: int, who: str):
    """(hostname, blob) from pack_peer's bytes; anything malformed names `who`."""
    if len(raw) != 1 + HOST_MAX + blob_bytes:
        raise RuntimeError(f"horovodlike init: {who} sent a {len(raw)}-byte address entry; "
                           f"expected {1 + HOST_MAX + blob_bytes}")
    n = raw[0]
    try:
        host = raw[1:1 + n].decode("utf-8")
    except UnicodeDecodeError:
        host = ""
    if not host or "\0" in host:
        raise RuntimeError(f"horovodlike init: {who} sent a malformed host name")
    return host, raw[1 + HOST_MAX:]


def job_key(launcher, rank, comm=None):
    """The job's key: from horovodlikerun's environment, or made by rank 0 and broadcast
    by MPI. A single process makes its own."""
    global _key
    if _key is not None and launcher != "mpi":
        return _key
    if launcher in STORE_LAUNCHERS and comm is None:
        _key = jobkey.from_env()
        if _key is None:
            raise RuntimeError(f"horovodlike init: {jobkey.ENV} is not set; the launcher "
                               f"gives every rank the job's key (was {contract.STORE_ADDR} "
                               f"copied into this environment by hand?)")
    elif launcher == "single" and comm is None:
        _key = jobkey.generate()
    else:
        import numpy as np
        buf = np.frombuffer(bytearray(jobkey.generate()), np.uint8) if rank == 0 else \
            np.zeros(jobkey.KEY_BYTES, np.uint8)
        _mpi_comm(comm).Bcast(buf, root=0)
        _key = buf.tobytes()
    return _key


def iface_address(spec):
    """IPv4 address of the first network interface of a comma list (SIOCGIFADDR)."""
    name = spec.split(",")[0].strip()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            req = struct.pack("256s", name.encode()[:15])
            return socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, req)[20:24])
        except OSError as e:
            raise RuntimeError(f"horovodlike init: network interface {name!r} "
                               f"({contract.IFACE}) has no IPv4 address: {e}") from None


def _all_local(launcher, size, comm=None):
    if launcher == "single" and comm is None:
        return True
    if launcher in STORE_LAUNCHERS and comm is None:
        return False   # the launcher says so itself, in HOROVODLIKE_BIND_ADDR
    # MPI knows which ranks share this node (a collective call: every rank makes it).
    comm = _mpi_comm(comm)
    from mpi4py import MPI
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_size() == size
    finally:
        node.Free()


def listen_addresses(launcher, size, comm=None):
    """(bind, advertise): where the engine listens and what peers are told.

    As narrow as the job allows: loopback when every rank is on this host (the launcher
    says so in HOROVODLIKE_BIND_ADDR, or MPI's local size equals the world size);
    otherwise the interface HOROVOD_GLOO_IFACE names, or else the one address that
    reaches the launcher -- never every interface."""
    forced = os.environ.get(contract.BIND_ADDR)
    if forced:
        return forced, forced if forced not in ("0.0.0.0", "") else advertise_address()
    iface = contract.iface()
    if iface:
        addr = iface_address(iface)
        return addr, addr
    if _all_local(launcher, size, comm):
        return "127.0.0.1", "127.0.0.1"
    addr = advertise_address()
    return addr, addr


# How a user changes the start-up limit, named wherever it runs out.
START_TIMEOUT_KNOB = (f"horovodlikerun --start-timeout SECONDS "
                      f"({contract.HOROVOD_START_TIMEOUT}, or {contract.START_TIMEOUT} under "
                      f"another launcher)")


def _exchange_store(rank, size, payload):
    from .store import StoreClient
    timeout = contract.start_timeout()
    # Elastic mode: every member of a round uses the round the driver assigned (the
    # driver writes into these keys too, see runner/elastic_driver.py).
    round_ = os.environ.get(contract.ELASTIC_ROUND) or None
    job = contract.job_id()

    def key_of(r):
        return contract.blob_key(job, r, elastic_round=round_, generation=_generation)

    try:
        client = StoreClient(os.environ[contract.STORE_ADDR], timeout=timeout, key=_key)
    except TimeoutError as e:
        raise RuntimeError(f"horovodlike init: {e} ({START_TIMEOUT_KNOB})") from None
    deadline = time.monotonic() + timeout
    try:
        client.set(key_of(rank), payload)
        out = []
        for r in range(size):
            try:
                out.append(client.get(key_of(r),
                                      timeout=max(0.0, deadline - time.monotonic())))
            except TimeoutError:
                # "rank <r> is late": the launcher reads it to say which rank the job
                # waited for (runner/launch.py). Late, not lost: it may still be starting.
                raise RuntimeError(
                    f"horovodlike init: rank {r} is late: it did not reach hvd.init() "
                    f"within {timeout:.0f} s of this rank. If it is only slow to start, "
                    f"allow it longer: {START_TIMEOUT_KNOB}") from None
        # Every rank has proved the key to the store: a key file left for this host's
        # ranks has done its job.
        launch_env.key_delivered()
        return out
    finally:
        client.close()


def _mpi_comm(comm):
    try:
        MPI = mpi_init.mpi()      # initialised here if the script left it to us
    except ImportError:
        raise RuntimeError("horovodlike was started by an MPI launcher but mpi4py is not "
                           "installed; pip install mpi4py, or use horovodlikerun") from None
    return comm or MPI.COMM_WORLD


def _exchange_mpi(rank, size, payload, comm):
    import numpy as np
    comm = _mpi_comm(comm)
    if comm.Get_size() != size or comm.Get_rank() != rank:
        if os.environ.get("SLURM_STEP_ID") and comm.Get_size() == 1:
            raise RuntimeError(
                f"srun gave this task PMI variables (rank {rank} of {size}: srun --mpi=... "
                f"or MpiDefault in slurm.conf), but mpi4py's MPI does not speak that PMI "
                f"and runs alone (Open MPI's wheel needs srun --mpi=pmix with the PMIx it "
                f"was built with; MPICH speaks --mpi=pmi2). Run srun --mpi=none: "
                f"horovodlike then meets its peers without MPI")
        raise RuntimeError(
            f"the launcher says this is rank {rank} of {size}, but MPI says rank "
            f"{comm.Get_rank()} of {comm.Get_size()}. mpi4py is probably built against a "
            f"different MPI than the mpirun that started this job (every process would "
            f"think it is alone); use the mpirun that belongs to mpi4py's MPI")
    # Fixed-size buffers (no pickles): every entry has the same length.
    out = np.zeros((size, len(payload)), np.uint8)
    comm.Allgather(np.frombuffer(payload, np.uint8), out)
    return [row.tobytes() for row in out]


def exchange(launcher, rank, size, blob, comm=None):
    """Every rank's (hostname, blob), in rank order."""
    global _generation
    payload = pack_peer(hostname(), blob)
    if launcher == "single" and comm is None:
        out = [payload]
    elif launcher in STORE_LAUNCHERS and comm is None:
        out = _exchange_store(rank, size, payload)
    else:
        out = _exchange_mpi(rank, size, payload, comm)
    _generation += 1
    return [unpack_peer(p, len(blob), f"rank {r}") for r, p in enumerate(out)]


def topology(launcher, rank, hosts):
    """Local and cross ranks from everyone's host name (Horovod's definitions)."""
    me = hosts[rank]
    same_host = [r for r, h in enumerate(hosts) if h == me]
    local_rank = same_host.index(rank)
    local_ranks = []
    for r, h in enumerate(hosts):
        local_ranks.append(sum(1 for q in range(r) if hosts[q] == h))
    peers = [r for r in range(len(hosts)) if local_ranks[r] == local_rank]
    per_host = {h: hosts.count(h) for h in hosts}
    return Topology(rank, len(hosts), local_rank, len(same_host), peers.index(rank),
                    len(peers), me, launcher, len(set(per_host.values())) == 1)
