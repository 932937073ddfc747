"""Spark integration with ``horovod.spark``'s ``run``: ranks as barrier tasks.

    from pyspark.sql import SparkSession
    import horovodlike.spark
    spark = SparkSession.builder.master("local[2]").getOrCreate()
    results = horovodlike.spark.run(train_fn, args=(0.1,), num_proc=2)

``train_fn`` calls ``hvd.init()`` itself, as under horovodlikerun. ``run_elastic`` and
``horovod.spark``'s estimators (``TorchEstimator``, ``KerasEstimator``,
``LightningEstimator``) are not provided; see docs/spark.md.

Needs ``pyspark`` (``pip install horovodlike[spark]``); importing this module without it
raises ImportError saying so.
"""
from .runner import run, run_elastic

__all__ = ["run", "run_elastic"]


def __getattr__(name):
    if name in ("TorchEstimator", "KerasEstimator", "LightningEstimator"):
        raise NotImplementedError(
            f"horovodlike.spark.{name} is not provided: horovod.spark's estimators stand on "
            f"Petastorm and horovod.spark.common.store, which horovodlike does not carry; "
            f"train inside horovodlike.spark.run instead (see docs/spark.md)")
    raise AttributeError(f"module 'horovodlike.spark' has no attribute {name!r}")
