"""Rank program of tests/test_tf_keras.py, run by test_keras_one_rank_is_plain_keras."""
from tf_keras_common import *  # noqa: F401,F403 (init, the shared helpers, hvd, np)


def main():
    R, P = init()
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


if __name__ == "__main__":
    main()
