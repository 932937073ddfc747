"""Rank program of tests/test_tf_keras.py, run by
test_sync_batch_normalization_uses_the_global_batch."""
import keras
import tensorflow as tf
import horovodlike.tensorflow as htf
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)


def main():
    htf.init()
    R, P = htf.rank(), htf.size()
    rng = np.random.default_rng(3)
    full = rng.normal(2.0, 3.0, size=(8 * P, 4)).astype("float32")
    mine = full[R * 8:(R + 1) * 8]
    layer = htf.SyncBatchNormalization(momentum=0.0, epsilon=1e-3)
    x = tf.constant(mine)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x, training=True)
        loss = tf.reduce_sum(y * tf.constant(rng.normal(size=(8, 4)).astype("float32")))
    grad = tape.gradient(loss, x)
    check(np.allclose(layer.moving_mean.numpy(), full.mean(0), atol=1e-4),
          "moving mean is the global batch's", layer.moving_mean.numpy())
    check(np.allclose(layer.moving_variance.numpy(), full.var(0), rtol=1e-3),
          "moving variance is the global batch's", layer.moving_variance.numpy())
    expect = (mine - full.mean(0)) / np.sqrt(full.var(0) + 1e-3)
    check(np.allclose(y.numpy(), expect, atol=1e-4), "normalised with the global statistics")
    check(grad is not None and np.all(np.isfinite(grad.numpy())), "gradient flows through")
    finish()


if __name__ == "__main__":
    main()
