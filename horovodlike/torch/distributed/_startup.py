"""Start-up and teardown of the torch backend: the engine, the default group, sub-groups.

How the engine is found or started when torch creates the default group:
- already running (hvd.init() was called first): used as is; torch's rank and world
  size must be the engine's, or the start fails saying so;
- a launcher's environment (horovodlikerun, mpirun, srun, torchrun): hvd.init();
- neither, with the store torch was given (init_process_group(store=..., rank=...,
  world_size=...) in processes no launcher started): rank 0 serves horovodlike's
  rendezvous store, and its address and the job's key travel through torch's store,
  which torch's other backends trust in the same way (anyone who can write to it can
  join the job).

Under horovodlikerun, mpirun and srun torch's env:// rendezvous finds no MASTER_ADDR:
`fill_torch_env()` (run when this package is imported) sets MASTER_ADDR, MASTER_PORT,
RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE from the launcher's, rank 0 choosing a
free port that it hands the others through the launcher's store or MPI. Variables
already set are never changed.

Teardown is per rank (the engine's ending is, see basics.shutdown): destroying the
default group shuts the engine down if this backend started it; destroying a sub-group
only refuses its further ops on this rank.
"""
import os
import socket

import torch.distributed as dist

from horovodlike.common import basics, bootstrap, dynamic_sets, jobkey
from horovodlike.common import launch_contract as contract
from horovodlike.common import process_sets

from ._group import ProcessGroupHorovodlike

_TORCH_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")


# ------------------------------------------------------------------ torch's variables

def _free_port(host):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def fill_torch_env(environ=None):
    """Set torch's env:// variables from a horovodlike/MPI launch, if they are missing.
    Returns True when it set them."""
    env = os.environ if environ is None else environ
    if all(env.get(k) for k in _TORCH_VARS):
        return False
    if env.get(contract.STORE_ADDR) and env.get(contract.SIZE):
        rank, size = int(env[contract.RANK]), int(env[contract.SIZE])
        master = _master_via_store(env, rank)
        local = (env.get(contract.LOCAL_RANK), env.get(contract.LOCAL_SIZE))
    else:
        launcher, rank, size = _mpi_identity(env)
        if launcher is None:
            return False
        master = _master_via_mpi(rank)
        local = (env.get("OMPI_COMM_WORLD_LOCAL_RANK") or env.get("SLURM_LOCALID"),
                 env.get("OMPI_COMM_WORLD_LOCAL_SIZE"))
    host, port = master.rsplit(":", 1)
    env.setdefault("MASTER_ADDR", host)
    env.setdefault("MASTER_PORT", port)
    env.setdefault("RANK", str(rank))
    env.setdefault("WORLD_SIZE", str(size))
    if local[0] is not None:
        env.setdefault("LOCAL_RANK", str(local[0]))
    if local[1] is not None:
        env.setdefault("LOCAL_WORLD_SIZE", str(local[1]))
    return True


def _mpi_identity(env):
    size = next((env[n] for n in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE") if env.get(n)), None)
    if size is None:
        return None, None, None
    rank = next(env[n] for n in ("OMPI_COMM_WORLD_RANK", "PMI_RANK") if env.get(n))
    return "mpi", int(rank), int(size)


def _master_via_store(env, rank):
    from horovodlike.common.store import StoreClient
    key = jobkey.from_env()
    client = StoreClient(env[contract.STORE_ADDR], timeout=contract.start_timeout(env),
                         key=key)
    name = f"{contract.job_id(env)}/torch-master"
    try:
        if rank == 0:
            host = "127.0.0.1" if env.get(contract.BIND_ADDR, "").startswith("127.") \
                else bootstrap.advertise_address()
            value = f"{host}:{_free_port(host)}"
            client.set(name, value.encode())
            return value
        return client.get(name, timeout=contract.start_timeout(env)).decode()
    finally:
        client.close()


def _master_via_mpi(rank):
    from mpi4py import MPI
    value = None
    if rank == 0:
        host = bootstrap.advertise_address()
        value = f"{host}:{_free_port(host)}"
    return MPI.COMM_WORLD.bcast(value, root=0)


# ------------------------------------------------------------------ the default group

def _start_with_torch_store(store, rank, size):
    """Start the engine of processes no launcher started, through torch's store."""
    from horovodlike.common.store import StoreServer
    if rank == 0:
        key = jobkey.generate()
        host = bootstrap.advertise_address()
        server = StoreServer("0.0.0.0", 0, key=key).start()
        _servers.append(server)
        store.set("horovodlike/rendezvous", f"{host}:{server.port}")
        store.set("horovodlike/key", jobkey.to_hex(key))
    addr = store.get("horovodlike/rendezvous").decode()
    key_hex = store.get("horovodlike/key").decode()
    os.environ[contract.JOB_KEY] = key_hex
    os.environ.update(contract.rank_vars(rank, size))
    os.environ[contract.STORE_ADDR] = addr
    os.environ.setdefault(contract.JOB_ID, "torch")
    process_sets.start()


_servers = []


def create_default(store, rank, size, timeout):
    """torch's creator for backend="horovodlike" (the default group)."""
    started = False
    if not basics.is_initialized():
        launcher, _, _ = bootstrap.detect()
        if launcher == "single" and size > 1:
            _start_with_torch_store(store, rank, size)
        else:
            process_sets.start()
        started = True
    if basics.rank() != rank or basics.size() != size:
        raise RuntimeError(
            f"horovodlike: torch says this is rank {rank} of {size}, but horovodlike's "
            f"engine runs as rank {basics.rank()} of {basics.size()}. Start both from "
            f"one launcher (or leave rank= and world_size= to it)")
    pg = ProcessGroupHorovodlike(rank, size, range(size), process_sets.global_process_set,
                                 timeout)
    pg._owns_engine = started
    _attach_fallback(pg, store, rank, size, timeout)
    return pg


# ------------------------------------------------------------------ sub-groups

def new_group(default, ranks, timeout, group_name):
    """A torch sub-group as an engine process set. Every rank of the default group calls
    this for every new group, in one order (torch's rule), so the sets' ids agree."""
    if ranks != sorted(ranks):
        raise ValueError(f"horovodlike: new_group(ranks={ranks}, sort_ranks=False): the "
                         f"engine orders a group's ranks by global rank; pass them sorted")
    (ps,) = dynamic_sets.ensure_process_sets([ranks], "torch.new_group")
    me = basics.rank()
    if me not in ranks:
        return None
    pg = ProcessGroupHorovodlike(ranks.index(me), len(ranks), ranks, ps,
                                 timeout if timeout is not None else default._timeout,
                                 group_name)
    store = getattr(default, "_store", None)
    if store is not None:
        _attach_fallback(pg, dist.PrefixStore(f"{group_name}/", store), ranks.index(me),
                         len(ranks), timeout)
    return pg


def _new_group_method(self, ranks, timeout=None, pg_options=None, group_name=None,
                      group_desc=None):
    """dist.new_group delegates here on every rank of the default group: the group's
    ranks become an engine process set (registered by every rank, same order)."""
    return new_group(self, list(ranks), timeout, group_name)


ProcessGroupHorovodlike.new_group = _new_group_method


# ------------------------------------------------------------------ the gloo fallback

def _attach_fallback(pg, store, rank, size, timeout):
    """Register a gloo backend under the group for the calls torch 2.13 makes from C++
    without reaching a Python group (all_gather_single / _allgather_base,
    reduce_scatter_single / _reduce_scatter_base, gather, scatter, reduce from C++).
    Python call sites still reach the methods of ProcessGroupHorovodlike, so every
    torch.distributed function call runs on the engine.
    Opt-in (HOROVODLIKE_TORCH_GLOO_FALLBACK=1): DDP, FSDP2, DTensor, TP and pipelining
    need none of those C++ calls (their calls are forwarded or made from Python), and a
    gloo group left to the end of the interpreter with DDP alive has been seen to hang
    the process's exit unless destroy_process_group() runs first."""
    pg._store = store
    if os.environ.get("HOROVODLIKE_TORCH_GLOO_FALLBACK", "0").strip() in ("0", "false", "no", ""):
        return
    import datetime
    import torch
    t = timeout if isinstance(timeout, datetime.timedelta) else datetime.timedelta(minutes=30)
    gloo = dist.ProcessGroupGloo(store, rank, size, t)
    pg._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, gloo)
    pg._gloo = gloo
