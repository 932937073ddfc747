"""``horovodlike.spark.run``: horovod.spark.run's contract on Spark's barrier execution mode.

How a job runs:

* The driver (the process that calls ``run``) makes a fresh random job key, serves
  horovodlike's rendezvous store (the one horovodlikerun and the Ray executor use) and
  pickles ``fn``, ``args`` and ``kwargs`` with Spark's own cloudpickle.
* One barrier stage of ``num_proc`` tasks runs them. Barrier mode starts all tasks
  together or none, and fails the whole stage when one task fails, which is the
  all-or-nothing a collective job needs.
* Each task learns every task's host through ``BarrierTaskContext.allGather`` and takes
  the rank that groups ranks by host (the host of partition 0 first), so local ranks
  are consecutive as under horovodrun. It starts the rank as a child process
  (``python -m horovodlike.runner.run_task``, the entry point of ``horovodlike.run``)
  with the store's address, the job key and its rank in the environment; ``hvd.init()``
  there rendezvouses as usual. A child process keeps the Spark Python worker (which
  Spark reuses for later tasks) free of the engine thread and of the rank's state, and
  a rank that crashes does not take the worker down.
* The task returns the child's pickled result; ``run`` returns the results in rank order.

The job key reaches the tasks only inside the task closure, through Spark's own channel
(enable ``spark.authenticate`` and ``spark.network.crypto.enabled`` where the cluster's
network is not trusted, as Horovod's Spark runner also asks). The rank's own connections
(store, engine) authenticate with it as under horovodlikerun.

A failing rank: the task reports its error (JSON: summary, traceback, whether it is only
the echo of another rank's failure) to the store and fails. ``run`` then raises
RuntimeError naming the rank whose own error ended the job, not a rank that merely lost
its peer.
"""
import json
import logging
import os
import pickle
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

try:
    import pyspark
    from pyspark import BarrierTaskContext
    from pyspark import cloudpickle
except ImportError as exc:          # pragma: no cover - depends on the environment
    raise ImportError("horovodlike.spark needs PySpark: pip install pyspark "
                      "(or the horovodlike[spark] extra)") from exc

from horovodlike.common import jobkey
from horovodlike.common import launch_contract as contract
from horovodlike.common.store import StoreClient, StoreServer
from horovodlike.runner.exits import exit_text
from horovodlike.runner.run_fn import PAYLOAD, rank_failure, user_path

log = logging.getLogger("horovodlike.spark")

# How long a rank whose error only echoes another rank's failure (HorovodInternalError:
# its peer went away) waits for that rank's own report before failing its task: Spark
# ends the stage at the first failed task, and the report that names the cause must be
# in the store by then.
CAUSE_WAIT_SECONDS = 10.0
_PREFIX = "spark/"


def run(fn, args=(), kwargs={}, num_proc=None, start_timeout=None, use_mpi=None,
        use_gloo=None, extra_mpi_args=None, env=None, stdout=None, stderr=None, verbose=1,
        nics=None, prefix_output_with_timestamp=False, executable=None):
    """Run ``fn(*args, **kwargs)`` on ``num_proc`` ranks, each a Spark barrier task.

    The signature is horovod.spark.run's (Horovod 0.28.1). Returns the list of ``fn``'s
    results in rank order. ``num_proc`` defaults to ``spark.default.parallelism``;
    ``start_timeout`` (default ``HOROVOD_SPARK_START_TIMEOUT``, else 600 s) bounds the
    rendezvous in ``hvd.init()``; ``env`` adds variables to each rank's environment
    (the executor's own environment is the base); ``nics`` names the interface the
    engine listens on; ``executable`` is the Python the ranks run (default: the Spark
    worker's). If a rank fails, RuntimeError names it with its error and traceback.

    ``verbose`` and ``prefix_output_with_timestamp`` are accepted and change nothing
    (the driver logs through ``logging.getLogger("horovodlike.spark")``).

    Not supported, each raising ValueError: ``use_mpi`` / ``extra_mpi_args`` (ranks are
    Spark tasks, no mpirun is started), ``stdout`` / ``stderr`` (rank output stays in
    the executors' logs, as any Spark task's output does).
    """
    if use_mpi or extra_mpi_args:
        raise ValueError("horovodlike.spark.run: use_mpi/extra_mpi_args: ranks run as "
                         "Spark barrier tasks and rendezvous through horovodlike's store; "
                         "no mpirun is started")
    if stdout is not None or stderr is not None:
        raise ValueError("horovodlike.spark.run: stdout/stderr redirection is not "
                         "supported; each rank's output goes to its Spark executor's log")
    if not callable(fn):
        raise TypeError(f"horovodlike.spark.run: fn must be callable, got {fn!r}")
    sc = pyspark.SparkContext._active_spark_context
    if sc is None:
        raise RuntimeError("horovodlike.spark.run: no active SparkContext; create a "
                           "SparkSession (or SparkContext) first")
    if num_proc is None:
        num_proc = sc.defaultParallelism
        log.info("running %d processes (spark.default.parallelism)", num_proc)
    if not isinstance(num_proc, int) or isinstance(num_proc, bool) or num_proc < 1:
        raise ValueError(f"horovodlike.spark.run: num_proc must be a positive integer, "
                         f"got {num_proc!r}")
    slots = _local_slots(sc.master)
    if slots is not None and num_proc > slots:
        # Barrier mode would retry for minutes before giving up on missing slots.
        raise ValueError(f"horovodlike.spark.run: num_proc={num_proc} but master "
                         f"{sc.master!r} has {slots} task slots; barrier mode starts "
                         f"all ranks at once")
    if start_timeout is None:
        start_timeout = int(os.environ.get("HOROVOD_SPARK_START_TIMEOUT", "600"))
    if nics and isinstance(nics, str):
        nics = [nics]

    key = jobkey.generate()
    job_id = contract.new_job_id()
    host = _store_host(sc)
    store = StoreServer(host, 0, key=key).start()
    rank_env = {k: str(v) for k, v in (env or {}).items()}
    rank_env.update({contract.STORE_ADDR: f"{host}:{store.port}",
                     contract.JOB_ID: job_id,
                     contract.START_TIMEOUT: str(start_timeout),
                     contract.SIZE: str(num_proc)})
    if nics:
        rank_env[contract.IFACE] = sorted(nics)[0]
    payload = {"main_path": None, "sys_path": user_path(),
               "body": cloudpickle.dumps((fn, tuple(args), dict(kwargs or {})))}
    # Everything the tasks need, key included, travels in this closure.
    task = _make_task(jobkey.to_hex(key), rank_env, payload, executable)
    group = f"horovodlike.spark.run.{job_id}"
    sc.setJobGroup(group, "horovodlike.spark.run", interruptOnCancel=True)
    try:
        out = sc.parallelize(range(num_proc), num_proc).barrier() \
            .mapPartitions(task).collect()
    except KeyboardInterrupt:
        sc.cancelJobGroup(group)          # interruptOnCancel: the tasks end too
        raise
    except Exception as exc:
        raise _job_error(store, key, num_proc, exc) from None
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        store.close()
    results = dict(out)
    return [cloudpickle.loads(results[r]) for r in range(num_proc)]


def run_elastic(fn, args=(), kwargs={}, num_proc=None, min_num_proc=None,
                max_num_proc=None, start_timeout=None, elastic_timeout=None,
                reset_limit=None, env=None, stdout=None, stderr=None, verbose=1,
                nics=None, prefix_output_with_timestamp=False, min_np=None, max_np=None):
    """Not provided: raises NotImplementedError (see docs/spark.md)."""
    raise NotImplementedError(
        "horovodlike.spark.run_elastic is not provided: a barrier stage starts and ends "
        "all its tasks together, so Spark cannot add or replace one rank of it; use "
        "horovodlike.spark.run, or horovodlikerun with --min-np/--max-np for elastic "
        "training")


# ------------------------------------------------------------------ driver side

def _local_slots(master):
    """Task slots of a local master (local, local[N], local[*], local[N,F]); None for a
    cluster master, whose slots only Spark knows."""
    if master == "local":
        return 1
    m = re.fullmatch(r"local\[(\d+|\*)(?:,\d+)?\]", master or "")
    if not m:
        return None
    return os.cpu_count() or 1 if m.group(1) == "*" else int(m.group(1))


def _store_host(sc):
    """Where the store listens: loopback for a local master, else the driver's address
    as Spark advertises it to executors."""
    if (sc.master or "").startswith("local"):
        return "127.0.0.1"
    host = sc.getConf().get("spark.driver.host") or socket.gethostname()
    return socket.gethostbyname(host)


def _job_error(store, key, num_proc, exc):
    """The RuntimeError naming the rank that caused the failure, from the reports the
    tasks left in the store; Spark's own error when no rank reported one."""
    reports = {}
    try:
        with StoreClient(store.address, timeout=5.0, key=key) as client:
            for rank in range(num_proc):
                try:
                    reports[rank] = json.loads(client.get(f"{_PREFIX}error/{rank}", 0))
                except TimeoutError:
                    pass
    except (OSError, ValueError) as why:      # the store is ours; this is unexpected
        log.warning("could not read the ranks' error reports: %s", why)
    if not reports:
        first = str(exc).strip().splitlines()
        return RuntimeError(f"horovodlike.spark.run: the Spark job failed before any rank "
                            f"reported an error: {first[0] if first else type(exc).__name__}")
    return rank_failure("horovodlike.spark.run", reports)


# ------------------------------------------------------------------ task side

def _make_task(key_hex, rank_env, payload, executable):
    def task(_partition):
        yield _run_rank(key_hex, rank_env, payload, executable)
    return task


def _ranks_by_host(hosts):
    """Partition index -> rank, ranks grouped by host, the host of partition 0 first
    (Horovod's order, so local ranks are consecutive)."""
    order = list(dict.fromkeys(hosts))
    indices = sorted(range(len(hosts)), key=lambda i: (order.index(hosts[i]), i))
    return {index: rank for rank, index in enumerate(indices)}


def _die_with_parent():
    """In the rank's child process: die when the Spark worker that started it dies (Spark
    kills a cancelled task's worker with SIGKILL, which the child would outlive)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _run_rank(key_hex, rank_env, payload, executable):
    ctx = BarrierTaskContext.get()
    hosts = ctx.allGather(socket.gethostname())
    rank = _ranks_by_host(hosts)[ctx.partitionId()]
    run_dir = tempfile.mkdtemp(prefix="horovodlike-spark-")      # mode 0700
    try:
        with open(os.path.join(run_dir, PAYLOAD), "wb") as f:
            f.write(pickle.dumps(payload))
        env = dict(os.environ)
        env.update(rank_env)
        env.update({jobkey.ENV: key_hex, contract.RANK: str(rank),
                    contract.HOSTNAME: socket.gethostname()})
        cmd = [executable or sys.executable, "-m", "horovodlike.runner.run_task", run_dir]
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL,
                                preexec_fn=_die_with_parent)
        try:
            code = proc.wait()
        finally:
            if proc.poll() is None:           # the task was interrupted
                proc.kill()
                proc.wait()
        result = os.path.join(run_dir, f"result.{rank}")
        if os.path.exists(result):
            with open(result, "rb") as f:
                return rank, f.read()         # unpickled by the driver
        error = os.path.join(run_dir, f"error.{rank}")
        if os.path.exists(error):
            with open(error, "rb") as f:      # written by our own child process
                report = pickle.load(f)
            report = {"summary": f"raised {report['summary']}",
                      "traceback": report["traceback"], "secondary": report["secondary"],
                      "time": report["time"]}
        else:
            report = {"summary": f"{exit_text(code)} without a result",
                      "traceback": "(none: the process ended without raising)\n",
                      "secondary": False, "time": time.time()}
        _report(rank_env[contract.STORE_ADDR], key_hex, rank, report)
        raise RuntimeError(f"horovodlike.spark: rank {rank} {report['summary']}")
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def _report(store_addr, key_hex, rank, report):
    """Leave this rank's error in the driver's store; a rank that only lost its peer
    first waits (bounded) for the cause's own report."""
    try:
        with StoreClient(store_addr, timeout=10.0, key=jobkey.from_hex(key_hex)) as c:
            c.set(f"{_PREFIX}error/{rank}", json.dumps(report).encode())
            if not report["secondary"]:
                c.set(f"{_PREFIX}cause", str(rank).encode())
            else:
                try:
                    c.get(f"{_PREFIX}cause", timeout=CAUSE_WAIT_SECONDS)
                except TimeoutError:
                    pass
    except OSError:
        pass          # the driver is gone; Spark's own error is all that is left
