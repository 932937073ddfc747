"""Rank program of tests/test_api_fixes.py, run by
test_keras_adasum_and_positional_arguments_as_in_horovod."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)
import inspect
import tensorflow as tf
import horovodlike.keras as hk
import horovodlike.tensorflow as hvd_tf


def main():
    hk.init()
    check(hk.Adasum is not None, "horovodlike.keras.Adasum exists")
    # as Horovod's Keras optimizer, which takes Average and Sum only; Adasum is refused as
    # everywhere (horovodlike/common/arguments.py)
    check_raises(ValueError, lambda: hk.DistributedOptimizer(tf.keras.optimizers.SGD(0.1),
                                                             op=hvd_tf.Min),
                 "op currently only supports Average and Sum", what="Keras op=Min")
    check_raises(NotImplementedError, lambda: hk.DistributedOptimizer(
        tf.keras.optimizers.SGD(0.1), op=hk.Adasum), "op=hvd.Adasum is not implemented",
        what="Keras op=Adasum")
    check_raises(NotImplementedError, lambda: hk.allreduce(np.ones(2, dtype=np.float32), op=hk.Adasum),
                 "Adasum", what="allreduce(op=Adasum)")
    # positional arguments in Horovod's order (horovod/keras, v0.28.1)
    params = list(inspect.signature(hk.DistributedOptimizer).parameters)
    check(params[:13] == ["optimizer", "name", "device_dense", "device_sparse", "compression",
                          "sparse_as_dense", "gradient_predivide_factor", "op",
                          "backward_passes_per_step", "average_aggregated_gradients",
                          "num_groups", "groups", "process_set"], "DistributedOptimizer order",
          str(params))
    params = list(inspect.signature(hk.callbacks.BestModelCheckpoint).parameters)
    check(params[:5] == ["monitor", "verbose", "save_weights_only", "mode", "save_freq"],
          "BestModelCheckpoint order", str(params))
    finish()


if __name__ == "__main__":
    main()
