"""TensorFlow 2 data-parallel training with horovodlike, following the steps of
Horovod's TensorFlow 2 tutorial, on the 8x8 digits that ship with scikit-learn (no
download needed).

    horovodlikerun -np 2 python examples/tensorflow2_digits.py
    mpirun -np 2 python examples/tensorflow2_digits.py
    python examples/tensorflow2_digits.py

A Horovod script needs only its import changed: `import horovod.tensorflow as hvd`
becomes `import horovodlike.tensorflow as hvd`.
"""
import argparse
import os
import tempfile
import time

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import horovodlike.tensorflow as hvd


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1200,
                    help="total training steps, divided among the ranks")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.001, help="learning rate for one rank")
    ap.add_argument("--checkpoint-dir", default=os.path.join(tempfile.gettempdir(),
                                                             "tf2_digits_checkpoints"))
    args = ap.parse_args()

    # Step 1 - initialise horovodlike.
    hvd.init()

    # Step 2 - pin one GPU per process (local rank); on a CPU-only machine a no-op.
    gpus = tf.config.experimental.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

    # Step 3 - every rank reads its own shard of the data.
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0)
    dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train))
    dataset = dataset.shard(hvd.size(), hvd.rank())
    dataset = dataset.repeat().shuffle(2000, seed=hvd.rank()).batch(args.batch_size)

    tf.random.set_seed(hvd.rank())               # different on purpose: step 6 fixes it
    model = tf.keras.Sequential([
        tf.keras.Input((64,)),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10)])
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    # Step 4 - scale the learning rate by the number of ranks (the effective batch is
    # size() times larger).
    opt = tf.keras.optimizers.Adam(args.lr * hvd.size())

    checkpoint = tf.train.Checkpoint(model=model, optimizer=opt)

    @tf.function
    def training_step(images, labels, first_batch):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        # Step 5 - the tape averages gradients over ranks (one engine call per step).
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        # Step 6 - after the first step (which creates the optimizer's slots) every
        # rank takes rank 0's model and optimizer state.
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)
        return loss

    steps = args.steps // hvd.size()
    t0 = time.time()
    for batch, (images, labels) in enumerate(dataset.take(steps)):
        loss = training_step(images, labels, batch == 0)
        if batch % 100 == 0 and hvd.rank() == 0:
            print(f"step {batch:4d}  loss {float(loss):.4f}")
    elapsed = time.time() - t0

    # Step 7 - only rank 0 writes checkpoints, so that ranks do not overwrite each other.
    if hvd.rank() == 0:
        path = checkpoint.save(os.path.join(args.checkpoint_dir, "ckpt"))
        print(f"checkpoint written to {path}")

    # Step 8 - every rank evaluates its shard of the test set; allreduce the counts.
    xs, ys = x_test[hvd.rank()::hvd.size()], y_test[hvd.rank()::hvd.size()]
    correct = np.sum(np.argmax(model(xs).numpy(), axis=1) == ys)
    totals = hvd.allreduce(tf.constant([correct, len(ys)], tf.float64), op=hvd.Sum)
    accuracy = float(totals[0] / totals[1])
    weights = [v.numpy() for v in model.trainable_variables]
    mine = all(np.array_equal(w, hvd.broadcast(tf.constant(w), 0).numpy()) for w in weights)
    same = bool(hvd.allreduce(tf.constant([int(mine)]), op=hvd.Min)[0])
    if hvd.rank() == 0:
        print(f"trained on {len(x_train)} digits with {hvd.size()} rank(s): {steps} steps of "
              f"{args.batch_size} per rank in {elapsed:.1f} s")
        print(f"test accuracy {accuracy:.4f}; weights identical on every rank: {same}")


if __name__ == "__main__":
    main()
