"""horovod.spark.keras (KerasEstimator) is not provided: importing it says so (docs/spark.md)."""
from . import estimators_not_provided

raise estimators_not_provided("horovodlike.spark.keras (horovod.spark.keras.KerasEstimator)")
