"""RayExecutor: horovod.ray's static executor on horovodlike.

The driver (the process that makes the RayExecutor) serves horovodlike's rendezvous
store; each rank is a Ray actor placed through a placement group, told its rank, the
store's address and its job id through environment variables, exactly what
horovodlikerun gives a rank. ``hvd.init()`` in the actor then rendezvouses through the
store as usual.
"""
import os
import socket
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

try:
    import ray
    from ray.util.placement_group import (get_current_placement_group, placement_group,
                                          remove_placement_group)
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
except ImportError as exc:          # pragma: no cover - depends on the environment
    raise ImportError("horovodlike.ray needs Ray: pip install ray") from exc

from horovodlike.common import jobkey
from horovodlike.common import launch_contract as contract
from horovodlike.common.store import StoreServer


@dataclass
class MiniSettings:
    """The settings RayExecutor uses (horovod.ray's MiniSettings)."""
    nics: Optional[set] = None
    verbose: int = 1
    key: Optional[str] = None
    ssh_port: Optional[int] = None
    ssh_identity_file: Optional[str] = None
    timeout_s: int = 300
    placement_group_timeout_s: int = 100
    elastic: bool = False


class BaseHorovodWorker:
    """What runs in each actor (horovod.ray's BaseHorovodWorker)."""
    executable = None

    def __init__(self, world_rank=0, world_size=1):
        os.environ.update(contract.rank_vars(world_rank, world_size,
                                             hostname=self.hostname()))

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def hostname(self) -> str:
        return socket.gethostname()

    def get_gpu_ids(self) -> List[int]:
        return ray.get_gpu_ids()

    def update_env_vars(self, env_vars: Dict[str, str]):
        os.environ.update({k: str(v) for k, v in env_vars.items()})

    def env_vars(self):
        return dict(os.environ)

    def start_executable(self, executable_cls: type = None, executable_args: list = None,
                         executable_kwargs: dict = None):
        if executable_cls:
            self.executable = executable_cls(*(executable_args or []),
                                             **(executable_kwargs or {}))

    def execute(self, func):
        """Call func(executable) in this actor."""
        return func(self.executable)


class RayExecutor:
    """Runs a horovodlike job on Ray actors, with horovod.ray.RayExecutor's API.

    Args:
        settings: from :meth:`create_settings`.
        num_workers: number of ranks (or use num_hosts and num_workers_per_host).
        num_hosts, num_workers_per_host: that many ranks on each of that many nodes.
        cpus_per_worker, use_gpu, gpus_per_worker: resources per rank.
        use_current_placement_group: place ranks in the placement group this code runs
            in, when there is one (e.g. inside Ray Tune).
        min_workers, max_workers, reset_limit, cooldown_range, elastic_timeout,
        override_discovery: elastic training, not yet supported (NotImplementedError).
    """

    @classmethod
    def create_settings(cls, timeout_s=30, ssh_identity_file=None, ssh_str=None,
                        placement_group_timeout_s=100, nics=None):
        """Settings for the executor. timeout_s bounds the rendezvous in hvd.init()."""
        if ssh_str and ssh_identity_file and not os.path.exists(ssh_identity_file):
            with open(os.open(ssh_identity_file, os.O_WRONLY | os.O_CREAT, 0o600),
                      "w") as f:
                f.write(ssh_str)
        return MiniSettings(ssh_identity_file=ssh_identity_file, timeout_s=timeout_s,
                            placement_group_timeout_s=placement_group_timeout_s, nics=nics)

    def __init__(self, settings, num_workers: Optional[int] = None,
                 num_hosts: Optional[int] = None, num_workers_per_host: int = 1,
                 cpus_per_worker: int = 1, use_gpu: bool = False,
                 gpus_per_worker: Optional[int] = None,
                 use_current_placement_group: bool = True, min_workers: int = None,
                 max_workers: int = None, reset_limit: int = None,
                 cooldown_range: List[int] = None, elastic_timeout: int = 600,
                 override_discovery: bool = True):
        if max_workers and (not min_workers or min_workers <= 0):
            raise ValueError("`max_workers` provided without any positive `min_workers`. "
                             "Elastic workloads require a positive `min_workers`")
        if min_workers and num_workers:
            raise ValueError("Both `min_workers` and `num_workers` provided. Only one of "
                             "the above is allowed as workloads cannot be elastic and "
                             "non-elastic.")
        if min_workers is not None:
            raise NotImplementedError("horovodlike.ray: elastic training (min_workers) is "
                                      "not yet supported")
        if num_workers is None and num_hosts is None:
            raise ValueError("give num_workers, or num_hosts and num_workers_per_host")
        if num_workers is not None and num_hosts is not None:
            raise ValueError("give num_workers or num_hosts, not both")
        self.settings = settings
        self.num_workers = num_workers
        self.num_hosts = num_hosts
        self.num_workers_per_host = num_workers_per_host
        self.cpus_per_worker = cpus_per_worker
        self.use_gpu = use_gpu
        self.gpus_per_worker = (gpus_per_worker or 1) if use_gpu else 0
        self.use_current_placement_group = use_current_placement_group
        self.workers = []
        self._pg = None
        self._own_pg = False
        self._store = None

    # ------------------------------------------------------------------ start

    def _bundles(self):
        if self.num_workers is not None:
            per = {"CPU": self.cpus_per_worker}
            if self.gpus_per_worker:
                per["GPU"] = self.gpus_per_worker
            return [per] * self.num_workers, "PACK", lambda i: i
        per = {"CPU": self.cpus_per_worker * self.num_workers_per_host}
        if self.gpus_per_worker:
            per["GPU"] = self.gpus_per_worker * self.num_workers_per_host
        return ([per] * self.num_hosts, "STRICT_SPREAD",
                lambda i: i // self.num_workers_per_host)

    def _placement(self):
        bundles, strategy, bundle_of = self._bundles()
        current = get_current_placement_group() if self.use_current_placement_group \
            else None
        if current is not None:
            self._pg, self._own_pg = current, False
            return bundle_of
        self._pg = placement_group(bundles, strategy=strategy)
        self._own_pg = True
        try:
            ray.get(self._pg.ready(), timeout=self.settings.placement_group_timeout_s)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(self._pg)
            self._pg = None
            raise TimeoutError(
                f"horovodlike.ray: Ray could not place {len(bundles)} bundle(s) of "
                f"{bundles[0]} ({strategy}) within {self.settings.placement_group_timeout_s}"
                f" s; the cluster lacks the resources") from None
        return bundle_of

    def start(self, executable_cls: type = None, executable_args: Optional[List] = None,
              executable_kwargs: Optional[Dict] = None,
              extra_env_vars: Optional[Dict] = None):
        """Start the ranks as actors and give each its rank and the rendezvous."""
        size = self.num_workers if self.num_workers is not None else \
            self.num_hosts * self.num_workers_per_host
        bundle_of = self._placement()
        Worker = ray.remote(BaseHorovodWorker)
        actors = [Worker.options(
            num_cpus=self.cpus_per_worker, num_gpus=self.gpus_per_worker,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=self._pg, placement_group_bundle_index=bundle_of(i))
        ).remote(i, size) for i in range(size)]
        nodes = ray.get([a.node_id.remote() for a in actors])
        # Ranks on one node get consecutive numbers (Horovod's local ranks).
        order = sorted(range(size), key=lambda i: (nodes.index(nodes[i]), i))
        self.workers = [actors[i] for i in order]
        driver_node = ray.get_runtime_context().get_node_id()
        local_only = all(n == driver_node for n in nodes)
        address = "127.0.0.1" if local_only else ray.util.get_node_ip_address()
        # A fresh random key per job (or the one the caller passes to every rank), never
        # derived from anything public; it reaches the actors through Ray's own control
        # channel, and the store refuses every connection that cannot prove it.
        given = (extra_env_vars or {}).get(jobkey.ENV)
        key = jobkey.from_hex(given) if given else jobkey.generate()
        self._store = StoreServer(address, 0, key=key).start()
        common = {jobkey.ENV: jobkey.to_hex(key),
                  contract.STORE_ADDR: f"{address}:{self._store.port}",
                  contract.JOB_ID: contract.new_job_id(),
                  contract.START_TIMEOUT: str(self.settings.timeout_s),
                  contract.SIZE: str(size)}
        if self.settings.nics:
            common[contract.IFACE] = sorted(self.settings.nics)[0]
        common.update(extra_env_vars or {})
        ray.get([w.update_env_vars.remote({**common, contract.RANK: str(rank)})
                 for rank, w in enumerate(self.workers)])
        ray.get([w.start_executable.remote(executable_cls, executable_args,
                                           executable_kwargs) for w in self.workers])

    # ------------------------------------------------------------------ running

    def _require_started(self):
        if not self.workers:
            raise RuntimeError("RayExecutor: call start() first")

    def execute(self, fn: Callable[[Any], Any],
                callbacks: Optional[List[Callable]] = None) -> List[Any]:
        """fn(executable) on every rank; the results in rank order."""
        self._require_started()
        return ray.get([w.execute.remote(fn) for w in self.workers])

    def run(self, fn: Callable[..., Any], args: Optional[List] = None,
            kwargs: Optional[Dict] = None,
            callbacks: Optional[List[Callable]] = None) -> List[Any]:
        """fn(*args, **kwargs) on every rank; the results in rank order."""
        return ray.get(self.run_remote(fn, args, kwargs))

    def run_remote(self, fn: Callable[..., Any], args: Optional[List] = None,
                   kwargs: Optional[Dict] = None) -> List[Any]:
        """Like run, but returns the ObjectRefs (ray.get them)."""
        self._require_started()
        args, kwargs = list(args or []), dict(kwargs or {})
        return [w.execute.remote(lambda _executable: fn(*args, **kwargs))
                for w in self.workers]

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """fn(executable) on rank 0 only."""
        self._require_started()
        return ray.get(self.workers[0].execute.remote(fn))

    def shutdown(self):
        """Kill the actors, free their placement group, stop the store."""
        for w in self.workers:
            ray.kill(w)
        self.workers = []
        if self._pg is not None and self._own_pg:
            remove_placement_group(self._pg)
        self._pg = None
        if self._store is not None:
            self._store.close()
            self._store = None
