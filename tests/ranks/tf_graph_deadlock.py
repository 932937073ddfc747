"""Rank program of tests/test_tf_graph_deadlock.py, run by test_tf_graphs_never_deadlock."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)
from _common import watchdog as common_watchdog


def main():
    THREADS = int(os.environ["TF_NUM_INTEROP_THREADS"])
    import tensorflow as tf
    tf.autograph.set_verbosity(0)
    tf.get_logger().setLevel("ERROR")
    import horovodlike.tensorflow as htf
    import horovodlike.tensorflow.keras as hk

    htf.init()
    R, P = htf.rank(), htf.size()
    assert P == 2, P
    ranks = np.arange(P)
    N = 24
    STAGE_S = float(os.environ.get("HVDTEST_STAGE_S", "40"))


    def watchdog(stage):
        return common_watchdog(stage, STAGE_S, f"{THREADS} inter-op threads")


    def staggered(n, make):
        """n inputs make(i), each ready only after a chain of plain ops that runs
        forwards on rank 0 and backwards on rank 1 (the collectives stay built in the
        same order on both)."""
        order = range(n) if R == 0 else range(n - 1, -1, -1)
        xs, prev = [None] * n, None
        for i in order:
            with tf.control_dependencies([prev] if prev is not None else []):
                xs[i] = make(i)
            prev = xs[i]
        return xs


    def many(xs):
        """Independent collectives: allgathers and allreduces, alternating."""
        return [htf.allgather(x) if i % 2 else htf.allreduce(x, op=htf.Sum)
                for i, x in enumerate(xs)]


    def expected_many():
        exp = []
        for i in range(N):
            if i % 2:
                exp.append(np.concatenate([np.full((r + 1, 3), 100.0 * r + i, np.float32)
                                           for r in ranks]))
            else:
                exp.append(np.full((i % 5 + 1,), sum(100.0 * r + i for r in ranks), np.float32))
        return exp


    def make_input(i):
        if i % 2:
            return tf.fill([R + 1, 3], tf.constant(100.0 * R + i))
        return tf.fill([i % 5 + 1], tf.constant(100.0 * R + i))


    def check_many(outs, what):
        for i, (o, e) in enumerate(zip(outs, expected_many())):
            check_equal(np.asarray(o), e, f"{what} op {i}")


    # ------------------------------------------------ 24 independent ops, Session
    cfg = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=THREADS,
                                   intra_op_parallelism_threads=1)
    g = tf.Graph()
    with g.as_default():
        outs = many(staggered(N, make_input))
        with tf.compat.v1.Session(graph=g, config=cfg) as sess, watchdog("Session, 24 ops"):
            for rep in range(20):
                got = sess.run(outs)
            check_many(got, "Session")
            # fetching a subset runs only those ops (nothing else is enqueued)
            got = sess.run([outs[3], outs[0]])
            check_equal(got[0], expected_many()[3], "Session subset op 3")
            check_equal(got[1], expected_many()[0], "Session subset op 0")

    # ------------------------------------------------ the same in a tf.function
    flag = tf.Variable(True)


    @tf.function
    def fn24():
        return many(staggered(N, make_input))


    @tf.function
    def fn_cond():
        # tf.cond branches that read a variable: their If ops take a resource input, so
        # TensorFlow's automatic control dependencies leave them unordered.
        xs = staggered(N // 2, lambda i: make_input(2 * i))
        return [tf.cond(flag, lambda x=x, i=i: htf.allreduce(x * tf.cast(flag, tf.float32),
                                                             op=htf.Sum, name=f"cond.{i}"),
                        lambda x=x: x) for i, x in enumerate(xs)]


    with watchdog("tf.function, 24 ops"):
        for rep in range(20):
            got = fn24()
        check_many(got, "tf.function")
    with watchdog("tf.function, ops in tf.cond"):
        for rep in range(5):
            got = fn_cond()
        for i, o in enumerate(got):
            check_equal(np.asarray(o), expected_many()[2 * i], f"tf.cond op {i}")


    # ------------------------------------------------ every kind, grouped and not
    def mixed():
        xs = staggered(10, lambda i: tf.fill([4, 2], tf.constant(10.0 * R + i)))
        out = [htf.allreduce(xs[0], op=htf.Sum),
               htf.allgather(xs[1]),
               htf.broadcast(xs[2], 1),
               htf.alltoall(xs[3]),
               htf.reducescatter(xs[4], op=htf.Sum)]
        out += htf.grouped_allreduce([xs[5], xs[6]], op=htf.Sum)
        out += htf.grouped_allgather([xs[7], xs[8]])
        out += htf.grouped_reducescatter([xs[9], xs[9] * 2], op=htf.Sum)
        out.append(htf.alltoall(xs[3], splits=tf.constant([1, 3]))[0])
        return out


    def expected_mixed():
        v = lambda r, i: np.full((4, 2), 10.0 * r + i, np.float32)
        s = lambda i: sum(v(r, i) for r in ranks)
        a2a = np.concatenate([v(r, 3)[R * 2:R * 2 + 2] for r in ranks])
        a2a_splits = np.concatenate([v(r, 3)[:1] if R == 0 else v(r, 3)[1:] for r in ranks])
        return [s(0), np.concatenate([v(r, 1) for r in ranks]), v(1, 2), a2a,
                s(4)[R * 2:R * 2 + 2], s(5), s(6), np.concatenate([v(r, 7) for r in ranks]),
                np.concatenate([v(r, 8) for r in ranks]), s(9)[R * 2:R * 2 + 2],
                2 * s(9)[R * 2:R * 2 + 2], a2a_splits]


    g = tf.Graph()
    with g.as_default():
        outs = mixed()
        with tf.compat.v1.Session(graph=g, config=cfg) as sess, watchdog("Session, mixed"):
            for rep in range(5):
                by_session = sess.run(outs)
    with watchdog("tf.function, mixed"):
        by_function = tf.function(mixed)()
    for mode, res in [("Session", by_session), ("tf.function", by_function)]:
        for k, (o, e) in enumerate(zip(res, expected_mixed())):
            check_equal(np.asarray(o), e, f"mixed {mode} output {k}")

    # ------------------------------------------------ a failed step, then the same graph
    g = tf.Graph()
    with g.as_default():
        x = tf.fill([3], tf.constant(1.0 + R))
        limit = tf.compat.v1.placeholder(tf.float32, [])
        total = htf.allreduce(x, op=htf.Sum, name="after.failure")
        # A node that fails after the collective, on every rank, when fed a low limit.
        checked = tf.debugging.assert_less(total, limit)
        with tf.compat.v1.Session(graph=g, config=cfg) as sess, watchdog("failed step"):
            check_raises(tf.errors.InvalidArgumentError,
                         lambda: sess.run(checked, feed_dict={limit: 0.0}),
                         what="a step that fails after its collective")
            for rep in range(3):
                got = sess.run([total, checked], feed_dict={limit: 10.0})[0]
                check_equal(got, np.full(3, 3.0, np.float32), "after a failed step")

    # ------------------------------------------------ Keras fit, jit_compile=False
    import keras
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8),
                              htf.SyncBatchNormalization(fused=False),
                              keras.layers.Dense(8), keras.layers.Dense(2)])
    model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.1)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=False)
    rng = np.random.default_rng(R)
    data = rng.normal(size=(64, 6)).astype(np.float32)
    labels = (data[:, 0] > 0).astype(np.int32)
    with watchdog("Keras fit"):
        model.fit(data, labels, batch_size=8, epochs=2, verbose=0,
                  callbacks=[hk.callbacks.BroadcastGlobalVariablesCallback(0)])
    w = np.concatenate([np.ravel(v) for v in model.trainable_weights])
    check_equal(np.asarray(htf.broadcast(w, 0, name="fit.weights")), w, "fit weights agree")
    finish()


if __name__ == "__main__":
    main()
