"""What the rank programs of tests/test_tf_keras.py share: init() starts the job and
sets R, P; the helpers and constants below."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)
import hashlib
import tensorflow as tf
tf.get_logger().setLevel("ERROR")
import keras
import horovodlike.tensorflow as htf
import horovodlike.tensorflow.keras as hvd_k
import horovodlike.keras as hvd_alias
import horovodlike.keras.callbacks

R = P = None          # set by init()


def init():
    global R, P
    hvd_k.init()
    R, P = hvd_k.rank(), hvd_k.size()
    return R, P


TMP = os.environ["HVDTEST_TMP"]

rng = np.random.default_rng(0)
TOKENS = rng.integers(0, 20, size=(192, 5)).astype("int32")
LABELS = (TOKENS.sum(axis=1) % 3).astype("int32")


def make_model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((5,), dtype="int32"),
        keras.layers.Embedding(20, 4),             # sparse (IndexedSlices) gradients
        keras.layers.Flatten(),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dropout(0.3),
        keras.layers.BatchNormalization(),
        keras.layers.Dense(3)])


def digest(values):
    h = hashlib.sha256()
    for v in values:
        h.update(np.asarray(v).tobytes())
    return h.hexdigest()


def state(model):
    """Parameters and optimizer state (BatchNormalization's moving statistics are
    per-rank, as in Horovod without SyncBatchNormalization)."""
    return digest([v.numpy() for v in model.trainable_weights] +
                  [v.numpy() for v in model.optimizer.variables])


def same_on_all_ranks(value):
    return all(v == value for v in hvd_k.allgather_object(value))

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
