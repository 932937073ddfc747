"""Rank program of tests/test_tf_p2p.py: hvd.send / hvd.recv / hvd.recv_ inside
tf.function, at 2 ranks, with the inter-op threads TF_NUM_INTEROP_THREADS says (1 is
the hardest case: one thread runs every node of a step).

Every stage has a watchdog that names it and ends the rank if it hangs (the peer then
sees this rank gone and fails too), so a deadlock fails in seconds, naming the stage."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)

import tensorflow as tf
import horovodlike.tensorflow as htf

STAGE_S = float(os.environ.get("HVDTEST_STAGE_S", "60"))
BIG = 100_000                       # float32 elements: 400 KB, above the 64 KiB eager limit


def stage_watchdog(stage):
    return watchdog(stage, STAGE_S, f"{tf.config.threading.get_inter_op_parallelism_threads()} "
                                    f"inter-op threads")


def payload(dt, shape, seed):
    """The same values on both ranks for (dt, shape, seed)."""
    n = int(np.prod(shape))
    x = (np.arange(n) * 7 + seed) % 11 - 5
    if dt == tf.bool:
        return tf.constant((x > 0).reshape(shape))
    if dt.is_unsigned:
        x = np.abs(x)
    return tf.cast(tf.constant(x.reshape(shape).astype(np.float64)), dt)


def same(got, exp, what):
    got, exp = tf.convert_to_tensor(got), tf.convert_to_tensor(exp)
    if not check(got.dtype == exp.dtype and got.shape == exp.shape, what,
                 f"got {got.dtype.name} {got.shape}, expected {exp.dtype.name} {exp.shape}"):
        return
    if got.dtype == tf.bool:
        got, exp = tf.cast(got, tf.int8), tf.cast(exp, tf.int8)
    check_equal(np.asarray(tf.cast(got, tf.float64)), np.asarray(tf.cast(exp, tf.float64)), what)


DTYPES = [tf.uint8, tf.int8, tf.int16, tf.int32, tf.int64, tf.float16, tf.bfloat16,
          tf.float32, tf.float64, tf.bool]


def dtypes_and_shapes(R):
    """Every dtype, with the recv's shape fully known, partly known and unknown; 0-size
    tensors and a 0-d one. The sender's function and the receiver's differ."""
    cases = [(dt, (3, 4), i) for i, dt in enumerate(DTYPES)] + [
        (tf.float32, (0, 3), 99), (tf.bfloat16, (0,), 98), (tf.float64, (), 97)]
    if R == 0:
        @tf.function
        def sender():
            for dt, shape, seed in cases:
                for k in range(3):
                    htf.send(payload(dt, shape, seed + k), 1, name=f"dt.{dt.name}.{seed}.{k}")
        sender()
        return

    @tf.function
    def receiver():
        outs = []
        for dt, shape, seed in cases:
            outs.append(htf.recv(0, name=f"dt.{dt.name}.{seed}.0", dtype=dt, shape=shape))
            outs.append(htf.recv(0, name=f"dt.{dt.name}.{seed}.1", dtype=dt,
                                 shape=(None,) + shape[1:] if shape else None))
            outs.append(htf.recv(0, name=f"dt.{dt.name}.{seed}.2", dtype=dt))
        return outs
    outs = receiver()
    i = 0
    for dt, shape, seed in cases:
        for k, how in enumerate(["full shape", "partial shape", "no shape"]):
            same(outs[i], payload(dt, shape, seed + k), f"tf.function recv {dt.name} {shape} {how}")
            i += 1
    # the static shapes the graph was traced with
    cf = receiver.get_concrete_function()
    check(cf.structured_outputs[0].shape.as_list() == [3, 4], "full static shape",
          str(cf.structured_outputs[0].shape))
    check(cf.structured_outputs[1].shape.as_list() == [None, 4], "partial static shape",
          str(cf.structured_outputs[1].shape))
    check(cf.structured_outputs[2].shape.rank is None, "unknown static shape",
          str(cf.structured_outputs[2].shape))


def exchange(R):
    """Both ranks send to and then receive from each other in one graph, small and
    large, named and unnamed, run several times (the names repeat from run to run)."""
    O = 1 - R

    @tf.function
    def swap(small, big):
        htf.send(small, O, name="swap.small")
        htf.send(big, O, name="swap.big")
        htf.send(big * 2, O)                         # unnamed: graph.0 of this pair
        htf.send(small * 2, O)                       # graph.1
        got_big = htf.recv(O, name="swap.big", dtype=tf.float32, shape=(BIG,))
        got_small = htf.recv(O, name="swap.small", dtype=tf.float32, shape=(5,))
        u_big = htf.recv(O, dtype=tf.float32, shape=(BIG,))
        u_small = htf.recv(O, dtype=tf.float32)
        return got_small, got_big, u_big, u_small

    for step in range(4):
        def mine(r):
            return (tf.fill([5], float(10 * r + step)), tf.fill([BIG], float(100 * r + step)))
        s, b, ub, us = swap(*mine(R))
        es, eb = mine(O)
        same(s, es, f"exchange small, step {step}")
        same(b, eb, f"exchange big, step {step}")
        same(ub, eb * 2, f"exchange unnamed big, step {step}")
        same(us, es * 2, f"exchange unnamed small, step {step}")


def crossed(R):
    """Rank 0 sends then receives; rank 1 receives then sends, and each post waits on a
    chain of plain ops (opposite orders on the two ranks), large messages both ways."""
    O = 1 - R

    @tf.function
    def step(x):
        if R == 0:
            htf.send(x, O, name="crossed.0")
            return htf.recv(O, name="crossed.1", dtype=tf.float32, shape=(BIG,))
        y = htf.recv(O, name="crossed.0", dtype=tf.float32, shape=(BIG,))
        htf.send(x + 1.0, O, name="crossed.1")
        return y

    for i in range(3):
        got = step(tf.fill([BIG], float(R * 1000 + i)))
        same(got, tf.fill([BIG], float(O * 1000 + i + (1 if R == 0 else 0))), f"crossed {i}")


def loops_and_branches(R):
    """Large messages both ways in a tf.range loop (a while loop: one name, in order,
    every iteration) and in a tf.cond branch that reads a variable."""
    O = 1 - R
    v = tf.Variable(1.0)

    @tf.function
    def loop(x):
        acc = tf.zeros([BIG])
        for i in tf.range(3):
            htf.send(x + tf.cast(i, tf.float32), O, name="loop")
            acc += htf.recv(O, name="loop", dtype=tf.float32, shape=(BIG,))
        return acc

    @tf.function
    def branch(x):
        def taken():
            htf.send(x * v, O, name="branch")
            return htf.recv(O, name="branch", dtype=tf.float32, shape=(BIG,))
        return tf.cond(v > 0, taken, lambda: x)

    same(loop(tf.fill([BIG], float(R))), tf.fill([BIG], 3.0 * O + 3.0), "tf.range loop")
    same(branch(tf.fill([BIG], float(R + 1))), tf.fill([BIG], float(O + 1)), "tf.cond branch")


def send_then_assign(R):
    """A large send of a variable's value, then an assignment to the variable in the same
    function, before the peer has posted its recv: the peer gets the value as it was
    when sent (the engine reads TensorFlow's buffer after the enqueue returned)."""
    if R == 0:
        v = tf.Variable(tf.fill([BIG], 5.0))
        flag = os.path.join(os.environ["HVDTEST_DIR"], "assigned")

        @tf.function
        def step():
            htf.send(v, 1, name="assigned")
            done = v.assign(tf.zeros([BIG]))
            with tf.control_dependencies([done]):       # tell rank 1 only now
                tf.io.write_file(flag, "")
        step()
        same(v, tf.zeros([BIG]), "the variable after its assignment")
        return
    wait_for("assigned")
    same(tf.function(lambda: htf.recv(0, name="assigned", dtype=tf.float32, shape=(BIG,)))(),
         tf.fill([BIG], 5.0), "the value sent before the assignment")


def keras_and_session(R):
    """A Keras model whose layers send (stage 0) and receive (stage 1) in predict();
    send and recv in a TF1 graph run by a Session (send returns the op to run)."""
    import keras

    class Send(keras.layers.Layer):
        def call(self, x):
            htf.send(x, 1, name="keras.act")
            return x

    class Recv(keras.layers.Layer):
        def call(self, x):
            return htf.recv(0, name="keras.act", dtype=tf.float32, shape=(None, 4))

    x = np.arange(24, dtype=np.float32).reshape(8, 3)
    if R == 0:
        m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, kernel_initializer="ones"),
                              Send()])
    else:
        m = keras.Sequential([keras.Input((3,)), Recv(),
                              keras.layers.Dense(1, kernel_initializer="ones")])
    out = m.predict(x, batch_size=4, verbose=0)
    if R == 1:
        check_equal(out, (x.sum(1) * 4)[:, None], "Keras predict through send and recv")

    g = tf.Graph()
    with g.as_default():
        if R == 0:
            fetch = htf.send(tf.constant([1.0, 2.0]), 1, name="session")
        else:
            fetch = htf.recv(0, name="session", dtype=tf.float32, shape=(2,))
        with tf.compat.v1.Session(graph=g) as sess:
            for i in range(2):
                got = sess.run(fetch)
                if R == 1:
                    check_equal(got, np.array([1.0, 2.0], np.float32), f"Session recv {i}")


def into_variable(R):
    """recv_ into a tf.Variable inside a graph; a message of the wrong dtype leaves it."""
    if R == 0:
        @tf.function
        def sender():
            htf.send(tf.reshape(tf.range(12, dtype=tf.int64), (3, 4)), 1, name="var.ok")
            htf.send(tf.reshape(tf.range(12, dtype=tf.int64), (4, 3)), 1, name="var.reshape")
            htf.send(tf.zeros((3, 4), tf.float32), 1, name="var.bad")
        sender()
        return
    v = tf.Variable(tf.fill([3, 4], tf.constant(-1, tf.int64)))

    @tf.function
    def receive(name):
        htf.recv_(v, 0, name=name)
        return v.read_value() + 1               # reads the received value

    got = receive("var.ok")
    exp = tf.reshape(tf.range(12, dtype=tf.int64), (3, 4))
    same(got, exp + 1, "recv_ into a variable: the read after it")
    same(v, exp, "recv_ into a variable")
    same(receive("var.reshape"), exp + 1, "recv_ of another shape of the same size")
    v.assign(tf.fill([3, 4], tf.constant(7, tf.int64)))
    check_raises(tf.errors.FailedPreconditionError, lambda: receive("var.bad"),
                 "var.bad", "rank 0", "rank 1", "dtype", "float32", "int64",
                 what="recv_ of the wrong dtype in a graph")
    same(v, tf.fill([3, 4], tf.constant(7, tf.int64)), "a failed recv_ leaves the variable")


def errors(R):
    """A recv traced without dtype; bad arguments refused when traced; a message of
    another dtype or shape than declared (full shape: checked by the engine; partial: by
    the binding); XLA refused."""
    @tf.function
    def no_dtype():
        return htf.recv(1 - R, name="never")
    check_raises(ValueError, no_dtype, "dtype=", "tf.function", what="recv in a graph without dtype")
    check_raises(tf.errors.InvalidArgumentError, no_dtype, "dtype=",
                 what="recv in a graph without dtype (tf.errors type)")

    check_raises(tf.errors.InvalidArgumentError,
                 tf.function(lambda: htf.send(tf.ones(2), R, name="self")), "itself",
                 what="send to this rank, traced")
    check_raises(TypeError, tf.function(lambda: htf.recv_(tf.ones(2), 1 - R, name="x")),
                 "tf.Variable", what="recv_ into a tensor, traced")

    @tf.function(jit_compile=True)
    def under_xla(x):
        htf.send(x, 1 - R, name="never")
    check_raises(htf.XLANotSupportedError, lambda: under_xla(tf.ones(2)), "jit_compile=False",
                 what="send under XLA")

    if R == 0:
        @tf.function
        def sender():
            htf.send(tf.ones((2, 3), tf.float32), 1, name="mm.full")
            htf.send(tf.ones((2, 3), tf.float32), 1, name="mm.partial")
            htf.send(tf.ones((2, 3), tf.float32), 1, name="mm.shape")
            htf.send(tf.ones((2, 3), tf.float32), 1, name="mm.after")
        sender()
        return

    def recv_as(name, dtype, shape):
        return tf.function(lambda: htf.recv(0, name=name, dtype=dtype, shape=shape))
    check_raises(tf.errors.FailedPreconditionError, recv_as("mm.full", tf.int32, (2, 3)),
                 "p2p.mm.full", "rank 0", "rank 1", "dtype", "float32", "int32",
                 what="dtype mismatch, full shape declared")
    check_raises(tf.errors.FailedPreconditionError, recv_as("mm.partial", tf.int32, (None, 3)),
                 "p2p.mm.partial", "rank 0", "rank 1", "dtype", "float32", "int32",
                 what="dtype mismatch, partial shape declared")
    check_raises(tf.errors.FailedPreconditionError, recv_as("mm.shape", tf.float32, (3, 2)),
                 "p2p.mm.shape", "rank 0", "rank 1", "shape", "(2, 3)", "(3, 2)",
                 what="shape mismatch")
    # the channel goes on after a mismatch
    same(recv_as("mm.after", tf.float32, None)(), tf.ones((2, 3)), "a recv after the mismatches")
    # eagerly a declared dtype is checked too
    htf.send(tf.ones(2), 0, name="eager.back")


def pipeline(R):
    """A two-stage pipeline step without Keras: stage 0 computes h and sends it; stage 1
    receives it, computes the loss and sends dL/dh back; stage 0 finishes its gradient
    from it. The same Python runs eagerly and as a tf.function: same numbers."""
    rng = np.random.default_rng(5)
    W0 = tf.Variable(rng.standard_normal((6, 8)).astype(np.float32))
    W1 = tf.Variable(rng.standard_normal((8, 2)).astype(np.float32))
    xs = [tf.constant(rng.standard_normal((4, 6)).astype(np.float32)) for _ in range(3)]
    ts = [tf.constant(rng.standard_normal((4, 2)).astype(np.float32)) for _ in range(3)]

    def step():
        outs = []
        for m, (x, t) in enumerate(zip(xs, ts)):            # micro-batches, one after another
            if R == 0:
                with tf.GradientTape() as tape:
                    h = tf.tanh(x @ W0)
                htf.send(h, 1, name=f"act.{m}")
                dh = htf.recv(1, name=f"grad.{m}", dtype=tf.float32, shape=(4, 8))
                outs.append(tape.gradient(h, W0, output_gradients=dh))
            else:
                h = htf.recv(0, name=f"act.{m}", dtype=tf.float32, shape=(4, 8))
                with tf.GradientTape() as tape:
                    tape.watch(h)
                    loss = tf.reduce_mean(tf.square(h @ W1 - t))
                dh, dw1 = tape.gradient(loss, [h, W1])
                htf.send(dh, 0, name=f"grad.{m}")
                outs += [loss, dw1]
        return outs

    eager = step()
    graph = tf.function(step)()
    check(len(eager) == len(graph), "pipeline outputs")
    for i, (e, g) in enumerate(zip(eager, graph)):
        check_close(np.asarray(g), np.asarray(e), f"pipeline output {i}: tf.function against eager",
                    rtol=1e-6, atol=1e-6)
    # not differentiable: a recv's output is a constant to the tape
    if R == 1:
        htf.send(W0 * 2.0, 0, name="nograd")
    else:
        with tf.GradientTape() as tape:
            tape.watch(W0)
            loss = tf.reduce_sum(htf.recv(1, name="nograd", dtype=tf.float32))
        check(tape.gradient(loss, W0) is None, "no gradient through recv")


def main():
    threads = int(os.environ.get("TF_NUM_INTEROP_THREADS", "0"))
    if threads:
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    tf.get_logger().setLevel("ERROR")
    htf.init()
    R = htf.rank()
    assert htf.size() == 2, htf.size()
    for stage in (dtypes_and_shapes, exchange, crossed, loops_and_branches, send_then_assign,
                  into_variable, errors, pipeline, keras_and_session):
        with stage_watchdog(stage.__name__):
            stage(R)
    if R == 0:
        with stage_watchdog("eager dtype check"):
            check_raises(htf.TensorMismatchError,
                         lambda: htf.recv(1, name="eager.back", dtype=tf.int32),
                         "eager.back", "dtype", "float32", "int32",
                         what="eager recv with a declared dtype")
    finish()


if __name__ == "__main__":
    main()
