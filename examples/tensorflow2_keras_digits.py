"""Keras 3 `model.fit` with horovodlike: DistributedOptimizer and Horovod's callbacks, on
the 8x8 digits that ship with scikit-learn (no download needed).

    horovodlikerun -np 2 python examples/tensorflow2_keras_digits.py
    mpirun -np 2 python examples/tensorflow2_keras_digits.py
    python examples/tensorflow2_keras_digits.py

A Horovod script needs only its import changed: `import horovod.tensorflow.keras as
hvd` (or `horovod.keras`) becomes `import horovodlike.tensorflow.keras as hvd`.
"""
import argparse
import os
import tempfile
import time

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import horovodlike.tensorflow.keras as hvd


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.001, help="learning rate for one rank")
    ap.add_argument("--warmup-epochs", type=int, default=3)
    ap.add_argument("--checkpoint-dir", default=os.path.join(tempfile.gettempdir(),
                                                             "tf2_keras_digits"))
    args = ap.parse_args()

    # Initialise horovodlike and pin one GPU per process (a no-op without GPUs).
    hvd.init()
    gpus = tf.config.experimental.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32).reshape(-1, 8, 8, 1)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0)
    # Every rank trains on its own shard.
    dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train))
    dataset = dataset.shard(hvd.size(), hvd.rank())
    dataset = dataset.repeat().shuffle(2000, seed=hvd.rank()).batch(args.batch_size)

    tf.keras.utils.set_random_seed(hvd.rank())     # the broadcast callback unifies this
    model = tf.keras.Sequential([
        tf.keras.Input((8, 8, 1)),
        tf.keras.layers.Conv2D(16, 3, activation="relu"),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dropout(0.25),
        tf.keras.layers.Dense(10)])

    # Scale the learning rate by the number of ranks, and average gradients over ranks.
    scaled_lr = args.lr * hvd.size()
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(scaled_lr))
    model.compile(optimizer=opt,
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])

    callbacks = [
        # Start every rank from rank 0's weights and optimizer state.
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        # Average the epoch's metrics over ranks (before any metric-based callback).
        hvd.callbacks.MetricAverageCallback(),
        # Warm the learning rate up from scaled_lr / size to scaled_lr.
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr,
                                                 warmup_epochs=args.warmup_epochs,
                                                 verbose=1),
    ]
    # Only rank 0 writes checkpoints.
    if hvd.rank() == 0:
        os.makedirs(args.checkpoint_dir, exist_ok=True)
        callbacks.append(tf.keras.callbacks.ModelCheckpoint(
            os.path.join(args.checkpoint_dir, "checkpoint-{epoch}.keras")))

    steps_per_epoch = len(x_train) // (args.batch_size * hvd.size())
    t0 = time.time()
    history = model.fit(dataset, steps_per_epoch=steps_per_epoch, epochs=args.epochs,
                        callbacks=callbacks, verbose=2 if hvd.rank() == 0 else 0)
    elapsed = time.time() - t0

    # Every rank evaluates its shard of the test set; average the results.
    loss, acc = model.evaluate(x_test[hvd.rank()::hvd.size()],
                               y_test[hvd.rank()::hvd.size()], verbose=0)
    acc = float(hvd.allreduce(acc, name="test_accuracy"))
    if hvd.rank() == 0:
        print(f"{hvd.size()} rank(s), {args.epochs} epochs of {steps_per_epoch} steps in "
              f"{elapsed:.1f} s; final training loss {history.history['loss'][-1]:.4f}")
        print(f"test accuracy {acc:.4f}")


if __name__ == "__main__":
    main()
