"""TensorFlow 2 synthetic benchmark (Horovod's tensorflow2_synthetic_benchmark.py, same
flags): images per second for a model trained on random data with
DistributedGradientTape.

    horovodlikerun -np 2 python examples/tensorflow2_synthetic_benchmark.py
    horovodlikerun -np 2 python examples/tensorflow2_synthetic_benchmark.py \
        --model ResNet50 --image-size 224      # Horovod's default model (slow on CPU)

The default model is a small CNN on 64x64 images, so that a 2-rank run on a laptop
finishes in about half a minute; --model takes any keras.applications name too.
"""
import argparse
import os
import timeit

import numpy as np
import tensorflow as tf

import horovodlike.tensorflow as hvd

parser = argparse.ArgumentParser(description="TensorFlow Synthetic Benchmark",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--fp16-allreduce", action="store_true", default=False,
                    help="use fp16 compression during allreduce")
parser.add_argument("--model", type=str, default="SmallCNN",
                    help="model to benchmark: SmallCNN or a keras.applications name")
parser.add_argument("--image-size", type=int, default=None,
                    help="image side in pixels (default: 64 for SmallCNN, else 224)")
parser.add_argument("--num-classes", type=int, default=1000)
parser.add_argument("--batch-size", type=int, default=32, help="input batch size")
parser.add_argument("--num-warmup-batches", type=int, default=10,
                    help="number of warm-up batches that don't count towards benchmark")
parser.add_argument("--num-batches-per-iter", type=int, default=10,
                    help="number of batches per benchmark iteration")
parser.add_argument("--num-iters", type=int, default=10, help="number of benchmark iterations")
parser.add_argument("--no-cuda", action="store_true", default=False,
                    help="disables CUDA training")
args = parser.parse_args()
args.cuda = not args.no_cuda

# Horovod: initialize.
hvd.init()

# Pin one GPU per process (local rank).
if args.cuda:
    gpus = tf.config.experimental.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")
else:
    os.environ["CUDA_VISIBLE_DEVICES"] = "-1"


def small_cnn(size, classes):
    return tf.keras.Sequential([
        tf.keras.Input((size, size, 3)),
        tf.keras.layers.Conv2D(32, 3, strides=2, activation="relu"),
        tf.keras.layers.Conv2D(64, 3, strides=2, activation="relu"),
        tf.keras.layers.Conv2D(64, 3, strides=2, activation="relu"),
        tf.keras.layers.GlobalAveragePooling2D(),
        tf.keras.layers.Dense(256, activation="relu"),
        tf.keras.layers.Dense(classes, activation="softmax")])


size = args.image_size or (64 if args.model == "SmallCNN" else 224)
if args.model == "SmallCNN":
    model = small_cnn(size, args.num_classes)
else:
    model = getattr(tf.keras.applications, args.model)(
        weights=None, input_shape=(size, size, 3), classes=args.num_classes)
opt = tf.keras.optimizers.SGD(0.01)

data = tf.random.uniform([args.batch_size, size, size, 3])
target = tf.random.uniform([args.batch_size, 1], minval=0, maxval=args.num_classes - 1,
                           dtype=tf.int64)


@tf.function
def benchmark_step(first_batch):
    # Optional compression of the allreduced gradients.
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

    with tf.GradientTape() as tape:
        probs = model(data, training=True)
        loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(target, probs))

    # All gradients of the step go to horovodlike's engine in one call.
    tape = hvd.DistributedGradientTape(tape, compression=compression)
    gradients = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(gradients, model.trainable_variables))

    # Broadcast the initial state from rank 0 after the first step (which creates the
    # optimizer's variables), so that every rank trains the same model.
    if first_batch:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables, root_rank=0)


def log(s, nl=True):
    if hvd.rank() != 0:
        return
    print(s, end="\n" if nl else "", flush=True)


log(f"Model: {args.model} ({size}x{size} images, "
    f"{sum(int(np.prod(v.shape)) for v in model.trainable_variables):,} parameters)")
log(f"Batch size: {args.batch_size}")
device = "GPU" if args.cuda and tf.config.list_physical_devices("GPU") else "CPU"
log(f"Number of {device}s: {hvd.size()}")

with tf.device(device):
    log("Running warmup...")
    benchmark_step(first_batch=True)
    timeit.timeit(lambda: benchmark_step(first_batch=False), number=args.num_warmup_batches)

    log("Running benchmark...")
    img_secs = []
    for x in range(args.num_iters):
        time = timeit.timeit(lambda: benchmark_step(first_batch=False),
                             number=args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / time
        log(f"Iter #{x}: {img_sec:.1f} img/sec per {device}")
        img_secs.append(img_sec)

    img_sec_mean = np.mean(img_secs)
    img_sec_conf = 1.96 * np.std(img_secs)
    log(f"Img/sec per {device}: {img_sec_mean:.1f} +-{img_sec_conf:.1f}")
    log(f"Total img/sec on {hvd.size()} {device}(s): {hvd.size() * img_sec_mean:.1f} "
        f"+-{hvd.size() * img_sec_conf:.1f}")
