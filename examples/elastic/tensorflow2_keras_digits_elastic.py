"""Elastic Keras 3 `model.fit` on scikit-learn's digits (Horovod's
tensorflow2_keras_mnist_elastic.py, offline). Ranks may be killed, hosts added or
removed while it trains; fit() goes on from the last commit.

    printf 'node1:1\nnode2:1\nnode3:1\n' > hosts.txt       # what discovery prints
    horovodlikerun -np 3 --min-np 2 --max-np 4 \\
        --host-discovery-script examples/elastic/discover_hosts.sh \\
        --ssh-command "sh -c {command}" python examples/elastic/tensorflow2_keras_digits_elastic.py

Every worker prints its pid: `kill -9` one, or add `node4:1` to hosts.txt. Every rank
prints the same digest of the weights and optimizer state at the end.
"""
import argparse
import hashlib
import os
import time

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import horovodlike.tensorflow.keras as hvd


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--steps-per-epoch", type=int, default=40)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.01, help="learning rate for one rank")
    ap.add_argument("--batches-per-commit", type=int, default=5)
    ap.add_argument("--batch-sleep", type=float, default=0.0,
                    help="seconds to pause after each batch (slow it down to watch)")
    args = ap.parse_args()

    hvd.init()
    print(f"worker on {os.environ.get('HOROVOD_HOSTNAME')}: pid {os.getpid()}, "
          f"rank {hvd.rank()} of {hvd.size()}", flush=True)

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0,
                                                        stratify=y)
    # Random sampling (no sharding by rank): nothing to re-partition after a reset.
    dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train)).repeat() \
        .shuffle(2000, seed=os.getpid()).batch(args.batch_size)

    model = tf.keras.Sequential([
        tf.keras.Input((64,)),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10)])
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(args.lr * hvd.size()))
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=opt, metrics=["accuracy"], jit_compile=False)

    def on_state_reset():
        opt.learning_rate.assign(args.lr * hvd.size())

    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    state.register_reset_callbacks([on_state_reset])

    class Pause(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if args.batch_sleep:
                time.sleep(args.batch_sleep)

    class Report(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if hvd.rank() == 0:
                print(f"epoch {state.epoch}: loss {logs['loss']:.4f}, "
                      f"accuracy {logs['accuracy']:.4f}, {hvd.size()} ranks", flush=True)

    callbacks = [
        # Commit the state every few batches and at the end of every epoch ...
        hvd.elastic.CommitStateCallback(state, batches_per_commit=args.batches_per_commit),
        # ... tracking where training is, across the fit() calls of every reset.
        hvd.elastic.UpdateBatchStateCallback(state),
        hvd.elastic.UpdateEpochStateCallback(state),
        Report(), Pause(),
    ]

    @hvd.elastic.run
    def train(state):
        model.fit(dataset, steps_per_epoch=args.steps_per_epoch,
                  epochs=args.epochs - state.epoch, callbacks=callbacks, verbose=0)

    train(state)

    acc = float(np.mean(np.argmax(model.predict(x_test, verbose=0), 1) == y_test))
    h = hashlib.sha256()
    for v in list(model.trainable_weights) + list(opt.variables):
        h.update(np.asarray(v).tobytes())
    print(f"done: rank {hvd.rank()} of {hvd.size()}, test accuracy {acc:.4f}, weights and "
          f"optimizer sha256 {h.hexdigest()[:16]}", flush=True)


if __name__ == "__main__":
    main()
