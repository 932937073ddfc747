"""Rank program of tests/test_api_fixes.py, run by
test_sync_batch_normalization_fused_false_in_keras."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)
import tensorflow as tf
import horovodlike.tensorflow as hvdtf


def main():
    hvdtf.init()
    layer = hvdtf.SyncBatchNormalization(fused=False)      # Horovod's own signature
    model = tf.keras.Sequential([tf.keras.Input((3,)), layer, tf.keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    model.fit(np.ones((4, 3)), np.ones((4, 1)), epochs=1, verbose=0)
    check(layer.get_config().get("fused") is False, "fused=False is kept", str(layer.get_config()))
    finish()


if __name__ == "__main__":
    main()
