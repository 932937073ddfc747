"""Who am I and who are my peers: the launch environment and the address-blob exchange.

Three ways a process is started, checked in this order:
  horovodlikerun   HOROVOD_RANK/SIZE + HOROVODLIKE_STORE_ADDR: blobs go through the
                   launcher's rendezvous store.
  mpirun / srun    OpenMPI's OMPI_COMM_WORLD_*, MPICH's PMI_*, Slurm's SLURM_*: blobs go
                   through an mpi4py allgather.
  plain python     one rank, nothing to exchange.
The engine never rendezvouses itself; it only hands us an opaque blob and takes all of
them back (as NCCL's bootstrap does).
"""
import os
import pickle
import socket
from dataclasses import dataclass


@dataclass
class Topology:
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    hostname: str
    launcher: str          # "horovodlikerun", "mpi", "slurm" or "single"


def _env_int(*names):
    for n in names:
        v = os.environ.get(n)
        if v not in (None, ""):
            return int(v)
    return None


def hostname() -> str:
    return os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname()


def advertise_address() -> str:
    """The address peers on other hosts use to reach us (HOROVODLIKE_IFACE_ADDR wins)."""
    addr = os.environ.get("HOROVODLIKE_IFACE_ADDR")
    if addr:
        return addr
    store = os.environ.get("HOROVODLIKE_STORE_ADDR")
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
    if os.environ.get("HOROVODLIKE_STORE_ADDR") and _env_int("HOROVOD_SIZE") is not None:
        return "horovodlikerun", _env_int("HOROVOD_RANK"), _env_int("HOROVOD_SIZE")
    mpi_size = _env_int("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE")
    if mpi_size is not None or os.environ.get("PMIX_RANK") is not None:
        return "mpi", _env_int("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"), mpi_size
    if _env_int("SLURM_NTASKS") is not None and _env_int("SLURM_PROCID") is not None:
        return "slurm", _env_int("SLURM_PROCID"), _env_int("SLURM_NTASKS")
    return "single", 0, 1


_generation = 0   # init -> shutdown -> init uses fresh store keys


def _exchange_store(rank, size, payload):
    from horovodlike.runner.store import StoreClient
    timeout = float(os.environ.get("HOROVODLIKE_START_TIMEOUT", "60"))
    prefix = f"{os.environ.get('HOROVODLIKE_JOB_ID', 'job')}/init{_generation}/blob/"
    client = StoreClient(os.environ["HOROVODLIKE_STORE_ADDR"], timeout=timeout)
    try:
        client.set(prefix + str(rank), payload)
        return [client.get(prefix + str(r), timeout=timeout) for r in range(size)]
    except TimeoutError as e:
        raise RuntimeError(f"horovodlike init: not every rank reached init within "
                           f"{timeout:.0f} s (HOROVODLIKE_START_TIMEOUT): {e}") from None
    finally:
        client.close()


def _exchange_mpi(rank, size, payload, comm):
    try:
        from mpi4py import MPI
    except ImportError:
        raise RuntimeError("horovodlike was started by an MPI launcher but mpi4py is not "
                           "installed; pip install mpi4py, or use horovodlikerun") from None
    comm = comm or MPI.COMM_WORLD
    if comm.Get_size() != size or comm.Get_rank() != rank:
        raise RuntimeError(
            f"the launcher says this is rank {rank} of {size}, but MPI says rank "
            f"{comm.Get_rank()} of {comm.Get_size()}. mpi4py is probably built against a "
            f"different MPI than the mpirun that started this job (every process would "
            f"think it is alone); use the mpirun that belongs to mpi4py's MPI")
    return comm.allgather(payload)


def exchange(launcher, rank, size, blob, comm=None):
    """Every rank's (hostname, blob), in rank order."""
    global _generation
    payload = pickle.dumps((hostname(), blob))
    if launcher == "single" and comm is None:
        out = [payload]
    elif launcher == "horovodlikerun" and comm is None:
        out = _exchange_store(rank, size, payload)
    else:
        out = _exchange_mpi(rank, size, payload, comm)
    _generation += 1
    return [pickle.loads(p) for p in out]


def topology(launcher, rank, hosts):
    """Local and cross ranks from everyone's host name (Horovod's definitions)."""
    me = hosts[rank]
    same_host = [r for r, h in enumerate(hosts) if h == me]
    local_rank = same_host.index(rank)
    local_ranks = []
    for r, h in enumerate(hosts):
        local_ranks.append(sum(1 for q in range(r) if hosts[q] == h))
    peers = [r for r in range(len(hosts)) if local_ranks[r] == local_rank]
    return Topology(rank, len(hosts), local_rank, len(same_host), peers.index(rank),
                    len(peers), me, launcher)
