"""horovod.spark.common (the estimators' stores and params) is not provided: importing
it says so (docs/spark.md)."""
from . import estimators_not_provided

raise estimators_not_provided("horovodlike.spark.common (horovod.spark.common's stores, "
                              "used by the estimators)")
