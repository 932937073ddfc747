"""(f) An elastic Keras model.fit with hvd.elastic's callbacks survives a SIGKILLed rank:
the job re-forms on the two hosts left, restores the last commit, and every rank ends
with bit-identical weights and optimizer state."""
import textwrap

import pytest

from elastic_support import records, run_elastic
from tf_support import TF_ENV  # noqa: E402  (skips the module without TensorFlow)

SCRIPT = textwrap.dedent("""
    import hashlib, os, signal
    import numpy as np
    import tensorflow as tf
    tf.get_logger().setLevel("ERROR")
    import keras
    import horovodlike.tensorflow.keras as hvd
    from sklearn.datasets import load_digits

    hvd.init()
    host, wid = os.environ["HOROVOD_HOSTNAME"], int(os.environ["HOROVODLIKE_ELASTIC_WORKER"])
    print(f"hello worker={wid} host={host}", flush=True)
    EPOCHS, STEPS, LR = 4, 12, 0.02

    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = digits.target.astype("int32")
    data = tf.data.Dataset.from_tensor_slices((x[:1400], y[:1400])).repeat() \\
        .shuffle(1400, seed=wid).batch(32)

    keras.utils.set_random_seed(100 + wid)          # different weights until the sync
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(10)])
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(LR * hvd.size(), momentum=0.9))
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=opt, metrics=["accuracy"], jit_compile=False)

    def digest():
        h = hashlib.sha256()
        for v in list(model.trainable_weights) + list(opt.variables):
            h.update(np.asarray(v).tobytes())
        return h.hexdigest()[:16]

    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    state.register_reset_callbacks([lambda: opt.learning_rate.assign(LR * hvd.size())])

    class Kill(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if host == "c" and state.epoch == 1 and batch == 6:
                print(f"fault kill worker={wid}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

    class Report(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            print(f"start worker={wid} size={hvd.size()} epoch={state.epoch} "
                  f"hash={digest()}", flush=True)

        def on_epoch_end(self, epoch, logs=None):
            print(f"epoch-done worker={wid} epoch={state.epoch} size={hvd.size()}", flush=True)

    callbacks = [hvd.elastic.CommitStateCallback(state, batches_per_commit=4),
                 hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.UpdateEpochStateCallback(state), Report(), Kill()]

    @hvd.elastic.run
    def train(state):
        model.fit(data, steps_per_epoch=STEPS, epochs=EPOCHS - state.epoch,
                  callbacks=callbacks, verbose=0)

    train(state)
    acc = float(np.mean(np.argmax(model.predict(x[1400:], verbose=0), 1) == y[1400:]))
    print(f"final worker={wid} rank={hvd.rank()} size={hvd.size()} epoch={state.epoch} "
          f"hash={digest()} acc={acc:.4f}", flush=True)
""")


@pytest.mark.timeout(105)        # 36 s on a loaded 2-core machine
def test_keras_fit_survives_a_killed_rank(tmp_path):
    res = run_elastic(SCRIPT, tmp_path, "a:1\nb:1\nc:1\n", 3, 2, 3, env=TF_ENV, timeout=90)
    assert res.returncode == 0, res.describe()
    assert "fault kill worker=2" in res.stdout, res.describe()
    finals = [r for _, r in records(res, "final")]
    assert len(finals) == 2 and {f["size"] for f in finals} == {"2"}, res.describe()
    assert {f["epoch"] for f in finals} == {"4"}, finals
    assert len({f["hash"] for f in finals}) == 1, finals
    assert float(finals[0]["acc"]) > 0.8, finals
    starts = records(res, "start")
    # the fit after the kill resumes epoch 1 on both survivors from the same state
    after = [r for _, r in starts if r["size"] == "2"]
    assert len(after) == 2 and {r["epoch"] for r in after} == {"1"}, starts
    assert len({r["hash"] for r in after}) == 1, after
