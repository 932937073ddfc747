"""Rank program of tests/test_elastic_keras.py, run by
test_keras_fit_survives_a_killed_rank."""
import hashlib
import os
import signal
import numpy as np
import tensorflow as tf


def main():
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
    data = tf.data.Dataset.from_tensor_slices((x[:1400], y[:1400])).repeat() \
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


if __name__ == "__main__":
    main()
