"""Horovod's API where a migrating user meets it: the exception types Horovod's own
tests expect, keyword names, and features that need no special init()."""
import importlib.util

import pytest

from harness import RANK_PRELUDE, run_ranks

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(120)

ALLTOALL_SPLITS = RANK_PRELUDE + r'''
import torch
import horovodlike.torch as hvdt
hvdt.init()
check_raises(ValueError, lambda: hvdt.alltoall(torch.ones(2), splits=torch.tensor([2.0])),
             "splits must hold integers", what="alltoall with float32 splits")
ps = hvdt.ProcessSet(ranks_or_comm=[0])            # Horovod's keyword
check(ps.ranks == [0], "ProcessSet(ranks_or_comm=)", repr(ps.ranks))
finish()
'''


def test_alltoall_float_splits_raise_value_error_and_process_set_keyword():
    run_ranks(ALLTOALL_SPLITS, 1, "python", timeout=60).assert_ok()


SYNC_BN_KERAS = RANK_PRELUDE + r'''
import tensorflow as tf
import horovodlike.tensorflow as hvdtf
hvdtf.init()
layer = hvdtf.SyncBatchNormalization(fused=False)      # Horovod's own signature
model = tf.keras.Sequential([tf.keras.Input((3,)), layer, tf.keras.layers.Dense(1)])
model.compile("sgd", "mse")
model.fit(np.ones((4, 3)), np.ones((4, 1)), epochs=1, verbose=0)
check(layer.get_config().get("fused") is False, "fused=False is kept", str(layer.get_config()))
finish()
'''


def test_sync_batch_normalization_fused_false_in_keras():
    run_ranks(SYNC_BN_KERAS, 1, "python", timeout=90).assert_ok()


KERAS_API = RANK_PRELUDE + r'''
import inspect
import tensorflow as tf
import horovodlike.keras as hk
import horovodlike.tensorflow as hvd_tf
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
'''


def test_keras_adasum_and_positional_arguments_as_in_horovod():
    run_ranks(KERAS_API, 1, "python", timeout=90).assert_ok()
