"""Rank program of tests/test_tf_sets.py, run by test_tf_sets_names_errors."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)
import threading
import tensorflow as tf


def main():
    tf.autograph.set_verbosity(0)
    tf.get_logger().setLevel("ERROR")
    import horovodlike.tensorflow as htf
    from horovodlike.tensorflow.util import (_cache, _executing_eagerly, _make_subgraph,
                                             refs_to_vars, vars_to_refs)

    S12 = htf.ProcessSet([1, 2])
    S01 = htf.ProcessSet([0, 1])
    htf.init(process_sets=[S12, S01])
    R, P = htf.rank(), htf.size()
    assert P == 3, P
    errors = tf.errors


    def npy(t):
        return np.asarray(t.numpy() if hasattr(t, "numpy") else t)


    def modes(fn):
        """fn eagerly, then as a tf.function (traced once, run twice)."""
        g = tf.function(fn)
        return [("eager", fn), ("graph", g), ("graph again", g)]


    # ------------------------------------------------ broadcast on [1, 2] from root 2
    if S12.included():
        for mode, fn in modes(lambda: htf.broadcast(tf.constant([10.0 * R, R]), 2,
                                                    process_set=S12)):
            check_equal(npy(fn()), np.array([20.0, 2.0], np.float32),
                        f"broadcast on [1,2] from root 2 ({mode})")
        for mode, fn in modes(lambda: htf.broadcast(tf.constant([R], tf.int64), 1,
                                                    process_set=S12, name="from1")):
            check_equal(npy(fn()), np.array([1]), f"broadcast on [1,2] from root 1 ({mode})")
        v = [tf.Variable([float(R)] * 3), tf.Variable(R, dtype=tf.int32)]
        htf.broadcast_variables(v, root_rank=2, process_set=S12)
        check_equal(npy(v[0]), np.full(3, 2.0, np.float32), "broadcast_variables from root 2")
        check_equal(npy(v[1]), np.int32(2), "broadcast_variables from root 2 (int)")
        obj = htf.broadcast_object({"from": R, "f": lambda z: z * R} if R == 2 else None,
                                   root_rank=2, process_set=S12)
        check(obj is not None and obj["from"] == 2 and obj["f"](3) == 6,
              "broadcast_object on [1,2] from root 2", obj)
        check(htf.allgather_object((R, "x" * R), process_set=S12) == [(1, "x"), (2, "xx")],
              "allgather_object on [1,2]")
        x = tf.constant([1.0, 2.0])
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(htf.broadcast(x, 2, process_set=S12)) * (R + 1)
        check_close(npy(tape.gradient(loss, x)), np.full(2, 2.5 if R == 2 else 0.0, np.float32),
                    "broadcast gradient on [1,2]: the root (a global rank) gets it", 1e-6, 1e-6)
        e = check_raises(errors.InvalidArgumentError,
                         lambda: htf.broadcast(tf.ones(1), 0, process_set=S12), "not a member",
                         what="root_rank 0 is not in [1,2]")
        check(isinstance(e, ValueError), "a bad root is also a ValueError", type(e).__mro__)
        check_raises(errors.InvalidArgumentError,
                     lambda: tf.function(lambda: htf.broadcast(tf.ones(1), 0, process_set=S12))(),
                     "not a member", what="root_rank 0 is not in [1,2] (graph)")
        check_raises(errors.InvalidArgumentError,
                     lambda: htf.broadcast_object(1, root_rank=0, process_set=S12),
                     "not a member", what="broadcast_object root not in the set")
    else:
        check_raises(errors.InvalidArgumentError,
                     lambda: htf.allreduce(tf.ones(1), process_set=S12), "not a member",
                     what="an op on a set this rank is not in")

    # ------------------------------------------ unnamed ops inside and outside sets
    # Ranks run different numbers of unnamed ops in their own sets; the unnamed global
    # ops that follow must still pair up (each set numbers its own).
    if S12.included():
        for i in range(3):
            out = htf.allreduce(tf.fill([i + 1], float(R)), op=htf.Sum, process_set=S12)
            check_equal(npy(out), np.full(i + 1, 3.0, np.float32), f"unnamed set op {i}")
    if S01.included():
        out = htf.allgather(tf.fill([R + 1], R), process_set=S01)
        check_equal(npy(out), np.array([0, 1, 1], np.int32), "unnamed allgather on [0,1]")


    def mixed():
        """Each rank traces a different body: the set ops it belongs to, then global ones."""
        outs = {}
        if S12.included():
            outs["s12"] = htf.allreduce(tf.constant([R * 1.0]), op=htf.Sum, process_set=S12)
        if S01.included():
            outs["s01"] = htf.allgather(tf.constant([R]), process_set=S01)
            outs["s01b"] = htf.barrier(process_set=S01)
        outs["g1"] = htf.allreduce(tf.fill([4], float(R)), op=htf.Sum)
        outs["g2"] = htf.allgather(tf.fill([R + 1, 2], R))
        return outs


    exp_g2 = np.concatenate([np.full([r + 1, 2], r, np.int32) for r in range(P)])
    for mode, fn in modes(mixed):
        outs = fn()
        if S12.included():
            check_equal(npy(outs["s12"]), np.array([3.0], np.float32), f"mixed s12 ({mode})")
        if S01.included():
            check_equal(npy(outs["s01"]), np.array([0, 1], np.int32), f"mixed s01 ({mode})")
        check_equal(npy(outs["g1"]), np.full(4, 3.0, np.float32), f"mixed global 1 ({mode})")
        check_equal(npy(outs["g2"]), exp_g2, f"mixed global 2 ({mode})")
    out = htf.allreduce(tf.constant([R + 1.0]), op=htf.Sum)
    check_equal(npy(out), np.array([6.0], np.float32), "unnamed global op after it all")

    # ------------------------------- a dozen unnamed ops of mixed shapes and dtypes
    DTYPES = [tf.float32, tf.int32, tf.float64, tf.int64, tf.float16, tf.bfloat16]


    @tf.function
    def dozen(step):
        outs = []
        for k in range(12):
            dt = DTYPES[k % len(DTYPES)]
            base = tf.cast(step, tf.float32) + float(k)
            if k % 2 == 0:
                x = tf.cast(tf.fill([k + 1, 2], base + R), dt)
                outs.append(htf.allreduce(x, op=htf.Sum))
            else:
                outs.append(htf.allgather(tf.cast(tf.fill([R + 1, k], base), dt)))
        return outs


    for step in range(4):
        outs = dozen(tf.constant(step))
        for k, out in enumerate(outs):
            dt = DTYPES[k % len(DTYPES)]
            base = step + k
            if k % 2 == 0:
                exp = np.full([k + 1, 2], sum(base + r for r in range(P)), np.float64)
            else:
                exp = np.full([sum(r + 1 for r in range(P)), k], base, np.float64)
            check(out.dtype == dt, f"dozen step {step} op {k}: dtype", out.dtype)
            check_equal(npy(tf.cast(out, tf.float64)), exp, f"dozen step {step} op {k}")


    # Two functions run from two threads, started in a different order on each rank:
    # numbered when they run, their ops would pair up wrongly; named when traced, they
    # cannot.
    def first_fn():
        return htf.allreduce(tf.fill([3], 1.0), op=htf.Sum)


    def second_fn():
        return htf.allreduce(tf.fill([2, 5], 2.0, ), op=htf.Sum)


    fa, fb = tf.function(first_fn), tf.function(second_fn)
    fa.get_concrete_function(), fb.get_concrete_function()       # traced in the same order
    results = {}
    order = [("a", fa), ("b", fb)] if R % 2 == 0 else [("b", fb), ("a", fa)]
    threads = [threading.Thread(target=lambda k=k, f=f: results.__setitem__(k, f()))
               for k, f in order]
    for t in threads:
        t.start()
        time.sleep(0.5)
    for t in threads:
        t.join(120)
    check("a" in results and "b" in results, "both threaded functions finished", results)
    if "a" in results and "b" in results:
        check_equal(npy(results["a"]), np.full(3, 3.0, np.float32), "threaded function a")
        check_equal(npy(results["b"]), np.full([2, 5], 6.0, np.float32), "threaded function b")


    # A rank that retraces a function alone (a new input shape) still matches the others.
    @tf.function
    def gather(x):
        return htf.allgather(x)


    for step, rows0 in enumerate([1, 2, 3]):
        out = gather(tf.fill([rows0 if R == 0 else 1], step))
        exp_rows = rows0 + (P - 1)
        check_equal(npy(out), np.full(exp_rows, step, np.int32), f"retrace on rank 0 only, {step}")

    # -------------------------------------------------------------------- errors
    e = check_raises(errors.FailedPreconditionError,
                     lambda: htf.allreduce(tf.ones([R + 1]), name="mm.eager"), "mm.eager",
                     what="shape mismatch (eager)")
    check(isinstance(e, htf.TensorMismatchError), "eager mismatch is also TensorMismatchError",
          type(e).__mro__)
    check_raises(errors.FailedPreconditionError,
                 lambda: tf.function(lambda: htf.allreduce(tf.ones([R + 1]), name="mm.graph"))(),
                 "mm.graph", what="shape mismatch (graph)")
    check_raises(errors.FailedPreconditionError,
                 lambda: tf.function(lambda: htf.allgather(tf.ones([1, R + 1])))(),
                 what="unnamed allgather mismatch (graph)")
    check_raises(errors.FailedPreconditionError,
                 lambda: htf.broadcast(tf.ones(1), R % 2, name="mm.root"), "mm.root",
                 what="root mismatch")
    if S12.included():
        dt = tf.float32 if R == 1 else tf.float64
        check_raises(errors.FailedPreconditionError,
                     lambda: htf.allreduce(tf.ones([2], dt), process_set=S12),
                     what="dtype mismatch in a set (unnamed)")
        check_raises(errors.FailedPreconditionError, lambda: tf.function(
            lambda: htf.grouped_allreduce([tf.ones([2]), tf.ones([R])], process_set=S12))(),
            what="grouped mismatch in a set (graph)")
    out = htf.allreduce(tf.ones([2]), op=htf.Sum)
    check_equal(npy(out), np.full(2, 3.0, np.float32), "the engine goes on after mismatches")

    split_fn = tf.function(lambda s: htf.alltoall(tf.ones([3]), splits=s))
    check_raises(errors.InvalidArgumentError, lambda: split_fn(tf.constant([1, 1, 2])), "add up",
                 what="splits known only at run time (graph)")
    check_raises(errors.InvalidArgumentError, lambda: htf.alltoall(tf.ones([3]), splits=[1, 1]),
                 "splits", what="splits (eager)")
    e = check_raises(errors.UnimplementedError,
                     lambda: htf.allreduce(tf.ones(1), op=htf.Adasum), "Adasum", what="Adasum")
    check(isinstance(e, NotImplementedError), "Adasum: also NotImplementedError", type(e))
    check_raises(errors.InvalidArgumentError, lambda: htf.reducescatter(tf.ones([3]), op=htf.Max),
                 "Sum", what="reducescatter Max")
    out, rs = split_fn(tf.constant([1, 1, 1]))
    check_equal(npy(rs), np.ones(3, np.int32), "alltoall after refused splits")

    # ------------------------------------------------------------- util helpers
    check(_executing_eagerly() and not tf.function(lambda: tf.constant(_executing_eagerly()))(),
          "util._executing_eagerly")
    calls = []
    cached = _cache(lambda a: calls.append(a) or a * 2)
    check(cached(2) == 4 and cached(2) == 4 and calls == [2], "util._cache", calls)
    check(int(_make_subgraph(lambda: tf.constant(3))()) == 3, "util._make_subgraph")
    vs = [tf.Variable(1.0), [tf.Variable(2.0)]]
    back = refs_to_vars(vars_to_refs(vs))
    check(back[0] is vs[0] and back[1][0] is vs[1][0], "util vars_to_refs / refs_to_vars")
    finish()


if __name__ == "__main__":
    main()
