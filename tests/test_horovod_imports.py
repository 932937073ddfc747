"""The module paths a Horovod script imports from, after `horovod` becomes `horovodlike`:
what is not carried says so at import, and Topology is where a user looks for it."""
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("module,needle", [
    ("horovodlike.spark.torch", "horovod.spark.torch.TorchEstimator"),
    ("horovodlike.spark.keras", "horovod.spark.keras.KerasEstimator"),
    ("horovodlike.spark.lightning", "horovod.spark.lightning.TorchEstimator"),
    ("horovodlike.spark.common", "horovod.spark.common"),
])
def test_spark_estimator_modules_say_what_to_do_at_import(module, needle):
    pytest.importorskip("pyspark", reason="pyspark is not installed")
    # A fresh interpreter: `from M import X` exactly as a Horovod script writes it.
    src = (f"try:\n    from {module} import TorchEstimator\n"
           f"except ImportError as e:\n"
           f"    print(type(e).__name__, isinstance(e, NotImplementedError)); print(e)\n")
    out = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True,
                         timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    first, msg = out.stdout.split("\n", 1)
    assert first == "EstimatorsNotProvided True", out.stdout
    assert needle in msg and "train inside horovodlike.spark.run" in msg, msg
    assert "ModuleNotFoundError" not in out.stdout + out.stderr


def test_spark_estimator_attributes_still_raise_not_implemented():
    spark = pytest.importorskip("horovodlike.spark", reason="pyspark is not installed")
    for name in ("TorchEstimator", "KerasEstimator", "LightningEstimator"):
        with pytest.raises(NotImplementedError, match="train inside horovodlike.spark.run"):
            getattr(spark, name)


def test_topology_is_hvd_topology_with_the_old_names_kept():
    pytest.importorskip("torch")
    import horovodlike.torch as hvd
    from horovodlike.common.topology import Topology
    assert hvd.Topology is Topology
    assert hvd.pipeline.Topology is Topology
    assert hvd.parallel.Topology is Topology
    assert importlib.import_module("horovodlike.torch.pipeline").Topology is Topology
