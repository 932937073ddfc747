"""horovodlike.tensorflow.keras with Keras 3: DistributedOptimizer in model.fit (weights
and optimizer state bit-identical across ranks), the callbacks, save/load with and
without horovodlike, backward_passes_per_step, the XLA refusal, DistributedGradientTape
in a tf.function training loop against a one-process reference, and, at one rank,
bit-identity with plain Keras.
"""
import importlib.util

import pytest

from harness import RANK_PRELUDE, launcher_matrix, run_ranks

from tf_support import TF_ENV  # noqa: E402  (skips the module without TensorFlow)

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(300)

COMMON = r'''
import hashlib
import tensorflow as tf
tf.get_logger().setLevel("ERROR")
import keras
import horovodlike.tensorflow as htf
import horovodlike.tensorflow.keras as hvd_k
import horovodlike.keras as hvd_alias
import horovodlike.keras.callbacks

hvd_k.init()
R, P = hvd_k.rank(), hvd_k.size()
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
'''

MULTI = r'''
# ------------------------------------------------ fit: identical state on every rank
model = make_model(100 + R)                        # a different start on every rank
check(P == 1 or not same_on_all_ranks(digest(model.get_weights())),
      "weights differ before the broadcast")
lr = 0.01 * P
opt = hvd_k.DistributedOptimizer(keras.optimizers.Adam(lr))
check(type(opt).__name__ == "Adam" and type(opt).__module__ == keras.optimizers.Adam.__module__,
      "wrapped optimizer keeps its class name and module", type(opt))
with warnings.catch_warnings():        # Keras 2 argument in Horovod's scripts: accepted
    warnings.simplefilter("ignore")
    model.compile(opt, LOSS, metrics=["accuracy"], experimental_run_tf_function=False)
callbacks = [hvd_k.callbacks.BroadcastGlobalVariablesCallback(0),
             hvd_k.callbacks.MetricAverageCallback(),
             hvd_alias.callbacks.LearningRateWarmupCallback(initial_lr=lr, warmup_epochs=2)]
hist = model.fit(TOKENS[R::P], LABELS[R::P], batch_size=16, epochs=3, verbose=0,
                 callbacks=callbacks).history
check(same_on_all_ranks(state(model)), "model and optimizer state bit-identical after fit")
check(opt.variables() == opt.variables, "Keras 2's opt.variables() still works")
check(same_on_all_ranks(repr(hist["loss"])), "averaged metrics identical", hist["loss"])
check(abs(hist["lr"][-1] - lr) < 1e-7, "warm-up reaches initial_lr", hist["lr"])
check(P == 1 or hist["lr"][0] < lr, "warm-up starts below initial_lr", hist["lr"])
check(hist["loss"][-1] < hist["loss"][0], "loss goes down", hist["loss"])

# ------------------------------------------------------------ save and load
path = os.path.join(TMP, "model.keras")
if R == 0:
    model.save(path)
hvd_k.allreduce(0.0, name="saved")                 # barrier
plain = keras.models.load_model(path)
check(type(plain.optimizer) is keras.optimizers.Adam, "saved model loads as plain Adam",
      type(plain.optimizer))
if R == 0:
    check(digest(plain.get_weights()) == digest(model.get_weights()), "plain load: weights")
loaded = hvd_k.load_model(path)
check(hasattr(loaded.optimizer, "register_local_var"), "hvd.load_model re-wraps")
with warnings.catch_warnings(record=True) as caught:     # Horovod's argument, accepted
    warnings.simplefilter("always")
    legacy = hvd_k.load_model(path, legacy_opts=True)
check(hasattr(legacy.optimizer, "register_local_var") and
      any("legacy" in str(w.message) for w in caught), "load_model(legacy_opts=True)")
best = hvd_k.callbacks.BestModelCheckpoint(monitor="loss", filepath=os.path.join(TMP, "b.keras"))
check(best.monitor == "loss" and best.save_best_only, "BestModelCheckpoint, Horovod's signature")
# local_variables stay as each rank has them; everything else comes from rank 0.
model3 = make_model(300 + R)
model3.compile(hvd_k.DistributedOptimizer(keras.optimizers.SGD(0.01)), LOSS)
mine = model3.layers[-1].kernel      # initialised differently on every rank
model3.fit(TOKENS[R::P][:16], LABELS[R::P][:16], batch_size=16, epochs=1, verbose=0,
           callbacks=[hvd_k.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=mine)])
check(P == 1 or not same_on_all_ranks(digest([mine.numpy()])), "local_variables not broadcast")
check(same_on_all_ranks(digest([model3.layers[0].get_weights()[0]])), "the rest is broadcast")
check_raises(ValueError, lambda: hvd_k.callbacks.BroadcastGlobalVariablesCallback(
                 0, local_variables=[1.0]),
             "tf.Variable", what="local_variables of the wrong type")
check(int(loaded.optimizer.iterations) == int(model.optimizer.iterations),
      "hvd.load_model keeps optimizer state", int(loaded.optimizer.iterations))
loaded.fit(TOKENS[R::P], LABELS[R::P], batch_size=16, epochs=1, verbose=0)
check(same_on_all_ranks(state(loaded)), "training a loaded model stays identical")

# ---------------------- backward_passes_per_step, lr schedule, htf.DistributedOptimizer
model2 = make_model(200 + R)
opt2 = htf.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=2,
                                average_aggregated_gradients=True)
model2.compile(opt2, LOSS)
sched = hvd_k.callbacks.LearningRateScheduleCallback(initial_lr=0.1,
                                                      multiplier=lambda e: 0.5 ** e)
hist2 = model2.fit(TOKENS[R::P], LABELS[R::P], batch_size=16, epochs=2, verbose=0,
                   callbacks=[hvd_k.callbacks.BroadcastGlobalVariablesCallback(0), sched]).history
check(same_on_all_ranks(state(model2)), "backward_passes_per_step=2: identical state")
steps = -(-len(TOKENS[R::P]) // 16)
check(int(opt2.iterations) == 2 * steps, "iterations count every step", int(opt2.iterations))
check(np.allclose(hist2["lr"], [0.1, 0.05]), "LearningRateScheduleCallback", hist2["lr"])

# --------------------------------------------------------------------- XLA
model3 = make_model(1)
model3.compile(hvd_k.DistributedOptimizer(keras.optimizers.SGD(0.1)), LOSS, jit_compile=True)
check_raises(Exception, lambda: model3.fit(TOKENS[:16], LABELS[:16], verbose=0),
             "jit_compile=False", what="fit with jit_compile=True")

# ------------------------- custom loop: tape in tf.function vs one-process reference
x_all = rng.normal(size=(8 * P, 6)).astype("float32")
y_all = rng.normal(size=(8 * P, 1)).astype("float32")
keras.utils.set_random_seed(7)
lin = keras.Sequential([keras.Input((6,)), keras.layers.Dense(1)])
ref = keras.Sequential([keras.Input((6,)), keras.layers.Dense(1)])
ref.set_weights(lin.get_weights())
sgd, ref_sgd = keras.optimizers.SGD(0.05), keras.optimizers.SGD(0.05)


@tf.function
def dist_step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((lin(x) - y) ** 2)
    tape = htf.DistributedGradientTape(tape)
    grads = tape.gradient(loss, lin.trainable_variables)
    sgd.apply_gradients(zip(grads, lin.trainable_variables))
    return loss


@tf.function
def ref_step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((ref(x) - y) ** 2)
    grads = tape.gradient(loss, ref.trainable_variables)
    ref_sgd.apply_gradients(zip(grads, ref.trainable_variables))


for _ in range(3):
    dist_step(x_all[R * 8:(R + 1) * 8], y_all[R * 8:(R + 1) * 8])
    ref_step(x_all, y_all)
for got, exp in zip(lin.get_weights(), ref.get_weights()):
    check_close(got, exp, "tape training matches the one-process reference", 1e-5, 1e-6)
check(same_on_all_ranks(digest(lin.get_weights())), "tape training identical on all ranks")

# ------------------------------------------------------ keras-level collectives
out = hvd_k.allreduce(float(R))
check(abs(float(out) - np.mean(np.arange(P))) < 1e-6, "keras allreduce of a Python float", out)
out = hvd_k.allgather([R])
check(list(np.asarray(out)) == list(range(P)), "keras allgather of a list", out)
out = hvd_k.broadcast(np.array([R, R]), root_rank=0)
check(list(np.asarray(out)) == [0, 0], "keras broadcast", out)
check(hvd_alias.DistributedOptimizer is hvd_k.DistributedOptimizer, "horovodlike.keras alias")
check_raises(TypeError, lambda: hvd_k.DistributedOptimizer(object()), "Keras optimizer",
             what="DistributedOptimizer(non-optimizer)")
check_raises(ValueError, lambda: hvd_k.DistributedOptimizer(keras.optimizers.SGD(),
                                                            op=htf.Max),
             "Average and Sum", what="DistributedOptimizer op")
finish()
'''

ONE_RANK = r'''
# At one rank the wrapped optimizer and the callbacks change nothing, bit for bit.
def train(distributed):
    model = make_model(5)
    opt = keras.optimizers.Adam(0.01)
    callbacks = []
    if distributed:
        opt = hvd_k.DistributedOptimizer(opt)
        callbacks = [hvd_k.callbacks.BroadcastGlobalVariablesCallback(0),
                     hvd_k.callbacks.MetricAverageCallback(),
                     hvd_k.callbacks.LearningRateWarmupCallback(initial_lr=0.01,
                                                                warmup_epochs=1)]
    model.compile(opt, LOSS, metrics=["accuracy"])
    keras.utils.set_random_seed(11)
    hist = model.fit(TOKENS, LABELS, batch_size=32, epochs=2, verbose=0,
                     callbacks=callbacks).history
    return model, hist

plain, h_plain = train(False)
dist, h_dist = train(True)
check(state(plain) == state(dist), "one rank: DistributedOptimizer fit == plain fit")
check(h_plain["loss"] == h_dist["loss"], "one rank: same losses", (h_plain, h_dist))

a = tf.Variable([1.0, 2.0])
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(a * a)
g = htf.DistributedGradientTape(tape).gradient(loss, a)
check(np.array_equal(g.numpy(), [2.0, 4.0]), "one rank: tape gradient unchanged", g)
out = htf.allreduce(tf.constant([1.0, 3.0]), op=htf.Sum, name="one")
check(np.array_equal(out.numpy(), [1.0, 3.0]), "one rank: allreduce", out)
finish()
'''


@pytest.mark.parametrize("launcher,np_", launcher_matrix([("horovodlikerun", 2)]))
def test_keras_fit_identical_state_callbacks_save_load(launcher, np_, tmp_path):
    env = dict(TF_ENV, HVDTEST_TMP=str(tmp_path))
    run_ranks(RANK_PRELUDE + COMMON + MULTI, np_, launcher, env=env, timeout=240).assert_ok()


def test_keras_one_rank_is_plain_keras(tmp_path):
    env = dict(TF_ENV, HVDTEST_TMP=str(tmp_path))
    run_ranks(RANK_PRELUDE + COMMON + ONE_RANK, 1, "python", env=env,
              timeout=240).assert_ok()


SYNC_BN = RANK_PRELUDE + r'''
import keras
import tensorflow as tf
import horovodlike.tensorflow as htf
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
'''


@pytest.mark.timeout(240)
def test_sync_batch_normalization_uses_the_global_batch():
    run_ranks(SYNC_BN, 2, "horovodlikerun", env=dict(TF_ENV), timeout=200).assert_ok()
