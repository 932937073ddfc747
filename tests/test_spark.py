"""horovodlike.spark.run on a local[2] Spark session: ranks are barrier tasks.

One SparkSession serves the module (starting the JVM is most of the cost).
"""
import glob
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed")
pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(shutil.which("java") is None,
                                 reason="no java on PATH (PySpark needs Java 17 or newer)")]

import horovodlike.spark  # noqa: E402


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession
    old = os.environ.get("PYTHONPATH")
    # The executors' Python workers (and the ranks they start) import this tree.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), old]))
    session = (SparkSession.builder.master("local[2]").appName("horovodlike-test")
               .config("spark.ui.enabled", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.python.worker.reuse", "true")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
    if old is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = old


def _leftovers():
    """Rank processes and run directories of horovodlike.spark still around."""
    procs = []
    for d in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(d, "rb") as f:
                if b"horovodlike-spark-" in f.read():
                    procs.append(d.split("/")[2])
        except OSError:
            pass
    return procs, glob.glob(os.path.join(tempfile.gettempdir(), "horovodlike-spark-*"))


def allreduce_ranks(scale):
    import numpy as np
    import horovodlike as hvd
    hvd.init()
    total = hvd.allreduce(np.array([float(hvd.rank() + 1) * scale]), op=hvd.Sum)
    out = {"rank": hvd.rank(), "size": hvd.size(), "local": hvd.local_rank(),
           "sum": float(total[0])}
    hvd.shutdown()
    return out


def fail_on_rank_one():
    import numpy as np
    import horovodlike as hvd
    hvd.init()
    if hvd.rank() == 1:
        raise ValueError("rank one's own failure")
    hvd.allreduce(np.ones(4), name="never.matched")   # rank 1 never gets here
    return "unreachable"


def test_two_ranks_allreduce_in_rank_order(spark):
    out = horovodlike.spark.run(allreduce_ranks, args=(2.0,), num_proc=2,
                                start_timeout=60)
    assert [r["rank"] for r in out] == [0, 1]
    assert [r["local"] for r in out] == [0, 1]
    assert all(r["size"] == 2 and r["sum"] == 6.0 for r in out), out
    # A second job on the same (reused) Spark workers: a fresh key and store.
    out = horovodlike.spark.run(allreduce_ranks, kwargs={"scale": 1.0}, num_proc=2,
                                start_timeout=60)
    assert [r["sum"] for r in out] == [3.0, 3.0]


def test_a_failing_rank_is_named(spark):
    with pytest.raises(RuntimeError) as err:
        horovodlike.spark.run(fail_on_rank_one, num_proc=2, start_timeout=60)
    text = str(err.value)
    assert "rank 1 raised ValueError: rank one's own failure" in text, text
    assert "Traceback from rank 1" in text, text
    procs, dirs = _leftovers()
    assert not procs and not dirs, (procs, dirs)


def test_misuse_is_refused(spark):
    with pytest.raises(ValueError, match="num_proc=3 but master 'local\\[2\\]' has 2"):
        horovodlike.spark.run(allreduce_ranks, args=(1.0,), num_proc=3)
    with pytest.raises(ValueError, match="no mpirun"):
        horovodlike.spark.run(allreduce_ranks, args=(1.0,), use_mpi=True)
    with pytest.raises(NotImplementedError, match="run_elastic is not provided"):
        horovodlike.spark.run_elastic(allreduce_ranks, num_proc=2)
    with pytest.raises(NotImplementedError, match="Petastorm"):
        horovodlike.spark.TorchEstimator
