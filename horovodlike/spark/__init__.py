"""Spark integration with ``horovod.spark``'s ``run``: ranks as barrier tasks.

    from pyspark.sql import SparkSession
    import horovodlike.spark
    spark = SparkSession.builder.master("local[2]").getOrCreate()
    results = horovodlike.spark.run(train_fn, args=(0.1,), num_proc=2)

``train_fn`` calls ``hvd.init()`` itself, as under horovodlikerun. ``run_elastic`` and
``horovod.spark``'s estimators (``TorchEstimator``, ``KerasEstimator``,
``LightningEstimator``) are not provided; see docs/spark.md.

Needs ``pyspark`` (the ``[spark]`` extra: ``pip install ".[spark]"``); importing this
module without it raises ImportError saying so.
"""
from .runner import run, run_elastic

__all__ = ["run", "run_elastic"]


_ESTIMATORS = ("TorchEstimator", "KerasEstimator", "LightningEstimator")


class EstimatorsNotProvided(ImportError, NotImplementedError):
    """horovod.spark's estimators are not carried. An ImportError, so that
    ``from horovodlike.spark.torch import TorchEstimator`` fails as a missing module does,
    and a NotImplementedError, as the attribute access has always raised."""


def estimators_not_provided(what):
    """The error for a use of horovod.spark's estimators (`what` names it)."""
    return EstimatorsNotProvided(
        f"{what} is not provided: horovod.spark's estimators stand on Petastorm and "
        f"horovod.spark.common.store, which horovodlike does not carry; train inside "
        f"horovodlike.spark.run instead (see docs/spark.md)")


def __getattr__(name):
    if name in _ESTIMATORS:
        raise estimators_not_provided(f"horovodlike.spark.{name}")
    raise AttributeError(f"module 'horovodlike.spark' has no attribute {name!r}")
