"""Rank program of tests/test_tf_keras.py, run by
test_keras_fit_identical_state_callbacks_save_load."""
from tf_keras_common import *  # noqa: F401,F403 (init, the shared helpers, hvd, np)


def main():
    R, P = init()
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


if __name__ == "__main__":
    main()
