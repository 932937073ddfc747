"""hvd.SyncBatchNormalization: Keras batch normalization whose batch statistics cover
every rank's batch, as Horovod's does.

In training, each rank sums its inputs and their squares per channel and counts its
elements; one allreduce (Sum) of [sums, sums of squares, count] gives the global mean
and variance, so a model sees the statistics of the whole global batch, as on one
process. Cost: one allreduce of 2*C+1 numbers per layer per step, and its gradient (an
allreduce of the same size) in the backward pass. Inference uses the moving averages,
which are then the same on every rank.
"""
import keras
import tensorflow as tf

from horovodlike.common.process_sets import global_process_set

from .mpi_ops import Sum, allreduce


class SyncBatchNormalization(keras.layers.BatchNormalization):
    """keras.layers.BatchNormalization with statistics over all ranks of `process_set`."""

    def __init__(self, fused=False, process_set=global_process_set, **kwargs):
        # Horovod's signature and refusal: the fused kernel computes the moments itself,
        # where they cannot be synchronized. Keras 3 has no fused kernel (nor argument).
        if fused in (True, None):
            raise ValueError('SyncBatchNormalization does not support fused=True.')
        if not kwargs.get("name"):
            kwargs["name"] = "sync_batch_normalization"
        super().__init__(**kwargs)
        self.process_set = process_set

    def get_config(self):
        return dict(super().get_config(), fused=False)

    def _moments(self, inputs, mask):
        if mask is not None:
            raise NotImplementedError("SyncBatchNormalization does not support masks; use "
                                      "keras.layers.BatchNormalization for masked inputs")
        x = tf.convert_to_tensor(inputs)
        work = tf.float32 if x.dtype in (tf.float16, tf.bfloat16) else x.dtype
        x = tf.cast(x, work)
        axes = list(self._reduction_axes)
        sums = tf.reduce_sum(x, axes)
        squares = tf.reduce_sum(tf.square(x), axes)
        count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)), work)
        packed = tf.concat([sums, squares, tf.reshape(count, [1])], 0)
        total = allreduce(packed, op=Sum, name=f"{self.name}.sync_batch_norm",
                          process_set=self.process_set)
        c = tf.shape(sums)[0]
        n = total[-1]
        mean = total[:c] / n
        variance = tf.maximum(total[c:2 * c] / n - tf.square(mean), 0.0)
        return tf.cast(mean, inputs.dtype), tf.cast(variance, inputs.dtype)
