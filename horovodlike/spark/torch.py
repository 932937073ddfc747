"""horovod.spark.torch (TorchEstimator) is not provided: importing it says so (docs/spark.md)."""
from . import estimators_not_provided

raise estimators_not_provided("horovodlike.spark.torch (horovod.spark.torch.TorchEstimator)")
