"""Rank program of tests/test_tf_ops.py, run by
test_tf_collectives_eager_graph_gradients_errors."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)
import tensorflow as tf


def main():
    tf.autograph.set_verbosity(0)
    tf.get_logger().setLevel("ERROR")
    import horovodlike.tensorflow as htf
    from horovodlike.tensorflow import _kernels

    EVEN = htf.ProcessSet(range(0, int(os.environ["HVDTEST_NP"]), 2))
    htf.init(process_sets=[EVEN])
    R, P = htf.rank(), htf.size()
    ranks = np.arange(P)


    def npy(t):
        return np.asarray(t.numpy() if hasattr(t, "numpy") else t)


    def close(got, exp, what, rtol=1e-6, atol=1e-6):
        got = npy(got)
        return check_close(got, np.asarray(exp).astype(got.dtype), what, rtol, atol)


    def both(fn, *args):
        """fn's results eagerly and inside tf.function (the same collectives, in order)."""
        return [("eager", fn(*args)), ("graph", tf.function(fn)(*args))]


    # ---------------------------------------------------------- allreduce, every dtype
    SUM_DTYPES = [tf.uint8, tf.int8, tf.int16, tf.int32, tf.int64, tf.float16, tf.bfloat16,
                  tf.float32, tf.float64]
    base = np.arange(6, dtype=np.float64).reshape(2, 3)
    def sums():                                   # one function: one trace for every dtype
        return [htf.allreduce(tf.cast(tf.constant(base * (R + 1)), dt), op=htf.Sum,
                              name=f"sum.{dt.name}") for dt in SUM_DTYPES]
    for mode, outs in both(sums):
        for dt, out in zip(SUM_DTYPES, outs):
            exp = (base * ranks.sum() + base * P).astype(dt.as_numpy_dtype)
            check(out.dtype == dt, f"allreduce {dt.name} {mode} dtype", out.dtype)
            check_equal(npy(out), exp, f"allreduce Sum {dt.name} {mode}")
    xb = lambda: tf.constant([R % 2 == 0, R == 0, False])
    for mode, (out, scalar) in both(lambda: (htf.allreduce(xb(), op=htf.Max),
                                             htf.allreduce(tf.constant(float(R + 1))))):
        check_equal(npy(out), np.array([True, True, False]), f"allreduce bool Max {mode}")
        check_equal(npy(scalar), np.float32((ranks + 1).mean()), f"allreduce scalar Average {mode}")

    vals = lambda: tf.constant([R + 1.0, -(R + 1.0), 2.0], tf.float64)
    OPS = [(htf.Min, [1.0, -P, 2.0]), (htf.Max, [P, -1.0, 2.0]),
           (htf.Product, [np.prod(ranks + 1.0), np.prod(-(ranks + 1.0)), 2.0 ** P]),
           ("scaled", [(ranks + 1).sum(), -(ranks + 1).sum(), 2.0 * P])]
    def reduce_ops():
        return [htf.allreduce(vals(), op=op) if op != "scaled" else
                htf.allreduce(vals(), op=htf.Sum, prescale_factor=2.0, postscale_factor=0.5)
                for op, _ in OPS]
    for mode, outs in both(reduce_ops):
        for (op, exp), out in zip(OPS, outs):
            check_equal(npy(out), np.array(exp), f"allreduce op {op} {mode}")
    out = htf.allreduce(tf.Variable([R + 1.0]), op=htf.Sum)          # a variable is accepted
    check_equal(npy(out), np.array([(ranks + 1.0).sum()], np.float32), "allreduce tf.Variable")
    out = htf.allreduce(tf.constant([1.0, 2.0]), op=htf.Sum, compression=htf.Compression.fp16)
    check(out.dtype == tf.float32, "fp16 compression keeps dtype", out.dtype)
    check_equal(npy(out), np.array([P, 2.0 * P], np.float32), "fp16 compression values")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = htf.allreduce(tf.constant([R * 1.0]), average=False)
    check_equal(npy(out), np.array([ranks.sum()], np.float32), "allreduce average=False")

    # ------------------------------------------------------- grouped_allreduce
    def grouped():
        return htf.grouped_allreduce([tf.constant([R + 1.0]), tf.constant([[R]], tf.int64),
                                      tf.constant(2.0, tf.float16)], op=htf.Sum)
    for mode, outs in both(grouped):
        check_equal(npy(outs[0]), np.array([(ranks + 1.0).sum()], np.float32), f"grouped f32 {mode}")
        check_equal(npy(outs[1]), np.array([[ranks.sum()]]), f"grouped i64 {mode}")
        check_equal(npy(outs[2]), np.float16(2 * P), f"grouped f16 {mode}")
    calls = []
    _orig_execute = _kernels.execute
    _kernels.execute = lambda reqs, arrays: calls.append(len(reqs)) or _orig_execute(reqs, arrays)
    htf.grouped_allreduce([tf.ones([3]) for _ in range(5)])
    check(calls == [5], "grouped_allreduce is one engine batch", calls)
    _kernels.execute = _orig_execute

    # --------------------------------------------------------------- IndexedSlices
    def sparse():
        s = tf.IndexedSlices(tf.fill([1, 2], R + 1.0), tf.constant([R]), tf.constant([P, 2]))
        return htf.allreduce(s)
    for mode, s in both(sparse):
        check(isinstance(s, tf.IndexedSlices), f"IndexedSlices stays sparse {mode}", type(s))
        check_equal(npy(s.indices), ranks.astype(np.int32), f"IndexedSlices indices {mode}")
        close(s.values, np.repeat((ranks + 1.0)[:, None], 2, 1) / P,
              f"IndexedSlices values averaged {mode}")
    check_raises(NotImplementedError, lambda: htf.allreduce(
        tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0])), op=htf.Max), "Sum and Average",
        what="IndexedSlices with Max")

    # ------------------------------------------------------------------- allgather
    def gathered():
        return htf.allgather(tf.fill([R + 1, 2], R))                 # rows differ per rank
    exp_g = np.concatenate([np.full([r + 1, 2], r, np.int32) for r in ranks])
    for mode, out in both(gathered):
        check_equal(npy(out), exp_g, f"allgather ragged {mode}")
    GATHER_DTYPES = [tf.bool, tf.bfloat16, tf.float16, tf.uint32, tf.uint64, tf.complex64]
    for mode, outs in both(lambda: [htf.allgather(tf.cast(tf.fill([2], R + 1), dt))
                                    for dt in GATHER_DTYPES]):
        for dt, out in zip(GATHER_DTYPES, outs):
            exp = np.concatenate([np.full([2], r + 1) for r in ranks]).astype(dt.as_numpy_dtype)
            check(out.dtype == dt, f"allgather {dt.name} dtype {mode}", out.dtype)
            check_equal(npy(out).astype(np.complex128) if dt.is_complex else npy(out),
                        exp.astype(np.complex128) if dt.is_complex else exp,
                        f"allgather {dt.name} {mode}")
    for mode, outs in both(lambda: htf.grouped_allgather([tf.fill([1], R), tf.fill([R, 3], 1.5)])):
        check_equal(npy(outs[0]), ranks.astype(np.int32), f"grouped_allgather 0 {mode}")
        check_equal(npy(outs[1]), np.full([ranks.sum(), 3], 1.5, np.float32),
                    f"grouped_allgather 1 {mode}")

    # ------------------------------------------------------------------- broadcast
    root = P - 1
    BCAST_DTYPES = [tf.float32, tf.bfloat16, tf.int64, tf.bool, tf.uint16, tf.complex128]
    for mode, outs in both(lambda: [htf.broadcast(tf.cast(tf.fill([3], R + 1), dt), root)
                                    for dt in BCAST_DTYPES]):
        for dt, out in zip(BCAST_DTYPES, outs):
            check_equal(npy(out), np.full([3], P).astype(dt.as_numpy_dtype),
                        f"broadcast {dt.name} {mode}")
    out = htf.broadcast(tf.constant(R * 1.0), 0, name="scalar")
    check_equal(npy(out), np.float32(0.0), "broadcast 0-d")

    # -------------------------------------------------------------------- alltoall
    def a2a_even():
        return htf.alltoall(tf.fill([P * 2], R))
    for mode, out in both(a2a_even):
        check_equal(npy(out), np.repeat(ranks, 2).astype(np.int32), f"alltoall even {mode}")
    def a2a_splits():                       # rank r sends j+1 rows of value r to rank j
        splits = [j + 1 for j in range(P)]
        return htf.alltoall(tf.fill([sum(splits), 2], float(R)), splits=splits)
    for mode, (out, rs) in both(a2a_splits):
        check_equal(npy(out), np.repeat(ranks.astype(np.float32), R + 1)[:, None].repeat(2, 1),
                    f"alltoall splits {mode}")
        check_equal(npy(rs), np.full([P], R + 1, np.int32), f"alltoall received splits {mode}")

    # --------------------------------------------------------------- reducescatter
    rows = 2 * P + 1                                   # lower ranks take the remainder
    mine = rows // P + (1 if R < rows % P else 0)
    start = sum(rows // P + (1 if r < rows % P else 0) for r in range(R))
    full = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2)
    for mode, outs in both(lambda: [htf.reducescatter(tf.constant(full), op=op)
                                    for op in (htf.Sum, htf.Average)]):
        for out, op, scale in zip(outs, ("Sum", "Average"), (P, 1)):
            check(out.shape[0] == mine, f"reducescatter rows {mode}", out.shape)
            check_equal(npy(out), full[start:start + mine] * scale, f"reducescatter {op} {mode}")
    outs = htf.grouped_reducescatter([tf.constant(full), tf.ones([P, 1], tf.float64)], op=htf.Sum)
    check_equal(npy(outs[1]), np.full([1, 1], P, np.float64), "grouped_reducescatter")

    # ------------------------------------------------------------------- gradients
    def grads():
        x = tf.constant([1.0, 2.0])
        w = float(R + 1)
        res = {}
        with tf.GradientTape(persistent=True) as t:
            t.watch(x)
            ys = {"allreduce_sum": htf.allreduce(x, op=htf.Sum) * w,
                  "allreduce_avg": htf.allreduce(x) * w,
                  "allgather": htf.allgather(tf.tile(x, [R + 1])) * w,
                  "broadcast": htf.broadcast(x, 0) * w,
                  "reducescatter": htf.reducescatter(tf.tile(x, [P]), op=htf.Sum) * w,
                  "alltoall": htf.alltoall(tf.tile(x, [P])) * w,
                  "grouped": htf.grouped_allreduce([x, 2 * x], op=htf.Sum)[1] * w}
            losses = {k: tf.reduce_sum(y) for k, y in ys.items()}
        for k, loss in losses.items():
            res[k] = t.gradient(loss, x)
        return res
    mean_w, sum_w = (ranks + 1.0).mean(), (ranks + 1.0).sum()
    expect = {"allreduce_sum": [sum_w] * 2, "allreduce_avg": [mean_w] * 2,
              "allgather": [mean_w * (R + 1)] * 2, "broadcast": [mean_w if R == 0 else 0.0] * 2,
              "reducescatter": [P * sum_w] * 2, "alltoall": [P * mean_w] * 2,
              "grouped": [2 * sum_w] * 2}
    # alltoall: d/dx_r of sum_j w_j * (rows x_r sent to j) = sum_j w_j over the rows each
    # rank got from r -> each element of r's tiled input goes to one rank j with weight w_j;
    # x appears P times, once per destination, so the gradient is sum_j w_j = P * mean_w.
    for mode, got in both(grads):
        for k, v in expect.items():
            close(got[k], v, f"gradient {k} {mode}")

    # ------------------------------------------------------- DistributedGradientTape
    a = tf.Variable([1.0, 2.0], name="a")
    b = tf.Variable([[3.0], [4.0]], name="b")
    emb = tf.Variable(tf.ones([P + 1, 2]), name="emb")
    unused = tf.Variable(0.0, name="unused")
    def tape_step(**kw):
        with tf.GradientTape() as tape:
            loss = (R + 1.0) * (tf.reduce_sum(a * a) + tf.reduce_sum(b)) + \
                tf.reduce_sum(tf.gather(emb, [R]))
        tape = htf.DistributedGradientTape(tape, **kw)
        return tape.gradient(loss, {"a": a, "b": b, "emb": emb, "unused": unused})
    ga = np.array([2.0, 4.0], np.float32) * mean_w
    gemb = np.zeros([P + 1, 2], np.float32)
    gemb[:P] = 1.0 / P
    for kw in [{}, {"sparse_as_dense": True}, {"gradient_predivide_factor": 2.0},
               {"compression": htf.Compression.fp16}, {"groups": 2}, {"groups": [[a, emb]]}]:
        for mode, g in both(lambda kw=kw: tape_step(**kw)):
            what = f"tape {kw} {mode}"
            check(g["unused"] is None, f"{what}: None gradient stays None", g["unused"])
            close(g["a"], ga, f"{what} a", 1e-3, 1e-3)
            close(g["b"], np.full([2, 1], mean_w), f"{what} b", 1e-3, 1e-3)
            e = g["emb"]
            check(isinstance(e, tf.IndexedSlices) != bool(kw.get("sparse_as_dense")),
                  f"{what}: sparse gradient kind", type(e))
            close(tf.convert_to_tensor(e), gemb, f"{what} emb", 1e-3, 1e-3)
    for mode, g in both(lambda: tape_step(op=htf.Sum)):
        close(g["a"], ga * P, f"tape op=Sum {mode}")
    calls = []
    _kernels.execute = lambda reqs, arrays: calls.append(len(reqs)) or _orig_execute(reqs, arrays)
    tape_step()
    check(calls == ([4] if P > 1 else []), "tape: all gradients of one gradient() call in one "
          "batch (none at size 1)", calls)
    _kernels.execute = _orig_execute
    with htf.DistributedGradientTape(tf.GradientTape()) as tape:   # wrapped before recording
        loss = (R + 1.0) * tf.reduce_sum(a * a)
    close(tape.gradient(loss, a), ga, "tape wrapped before the with block")
    with tf.GradientTape() as tape:
        loss = (R + 1.0) * tf.reduce_sum(a * a)
    tape = htf.DistributedGradientTape(tape)
    tape.register_local_source(a)
    close(tape.gradient(loss, [a])[0], np.array([2.0, 4.0]) * (R + 1) / P,
          "tape local source scaled by 1/size")

    # ------------------------------------------------------- variables and objects
    vs = [tf.Variable(tf.fill([2, 2], float(R))), tf.Variable(R, dtype=tf.int64),
          tf.Variable([R % 2 == 1]), tf.Variable(np.full([3], R, np.uint32))]
    htf.broadcast_variables(vs, root_rank=root)
    for i, v in enumerate(vs):
        check_equal(npy(v), npy(tf.cast(tf.fill(v.shape, root), v.dtype)) if v.dtype != tf.bool
                    else np.array([root % 2 == 1]), f"broadcast_variables {i}")
    gv = tf.Variable(tf.fill([2], float(R)))
    @tf.function
    def bcast_in_graph():
        htf.broadcast_variables([gv], 0)      # returns the grouped assign op (unused here)
    bcast_in_graph()
    check_equal(npy(gv), np.zeros(2, np.float32), "broadcast_variables in tf.function")
    obj = htf.broadcast_object({"rank": R, "f": (lambda z: z + 1) if R == root else None}, root)
    check(obj["rank"] == root and obj["f"](1) == 2, "broadcast_object", obj)
    check(htf.allgather_object({"r": R}) == [{"r": r} for r in ranks], "allgather_object")

    # ---------------------------------------------------------------- process sets
    x = tf.constant([R + 1.0])
    if EVEN.included():
        out = htf.allreduce(x, op=htf.Sum, process_set=EVEN)
        check_equal(npy(out), np.array([sum(r + 1.0 for r in EVEN.ranks)], np.float32),
                    "allreduce on a process set")
        out = htf.allgather(x, process_set=EVEN)
        check_equal(npy(out), np.array([r + 1.0 for r in EVEN.ranks], np.float32),
                    "allgather on a process set")
        with tf.GradientTape() as tape:
            loss = (R + 1.0) * tf.reduce_sum(a * a)
        g = htf.DistributedGradientTape(tape, process_set=EVEN).gradient(loss, a)
        m = np.mean([r + 1.0 for r in EVEN.ranks])
        close(g, np.array([2.0, 4.0]) * m, "tape on a process set")
    else:
        with tf.GradientTape() as tape:
            loss = (R + 1.0) * tf.reduce_sum(a * a)
        g = htf.DistributedGradientTape(tape, process_set=EVEN).gradient(loss, a)
        close(g, np.array([2.0, 4.0]) * (R + 1), "tape outside the set: local")

    # ----------------------------------------------------------------- join, barrier
    htf.barrier()
    tf.function(lambda: htf.barrier())()
    if R == P - 1:
        last = htf.join()
    else:
        out = htf.allreduce(tf.constant([1.0]), op=htf.Sum, name="while_joined")
        check_equal(npy(out), np.array([P - 1.0], np.float32), "allreduce with a joined rank")
        last = htf.join()
    check(int(last) in range(P), "join returns a rank", last)
    check(tf.function(lambda: htf.join())().dtype == tf.int32, "join in tf.function")

    # ------------------------------------------------------------------ bad inputs
    check_raises(TypeError, lambda: htf.allreduce([1.0, 2.0]), "tf.constant", what="list")
    check_raises(TypeError, lambda: htf.broadcast([1, 2], 0), "list", what="list broadcast")
    check_raises(TypeError, lambda: htf.allgather(3.0), "float", what="float allgather")
    check_raises(TypeError, lambda: htf.broadcast_variables([tf.Variable("text")], 0),
                 "string", "not supported", what="string variable")
    check_raises(TypeError, lambda: htf.allreduce(tf.constant([1], tf.uint32)),
                 "uint32", "not supported", what="uint32 allreduce")
    check_raises(ValueError, lambda: htf.allgather(tf.constant(1.0)), "dimension",
                 what="allgather of a scalar")
    check_raises(ValueError, lambda: htf.reducescatter(tf.ones([P]), op=htf.Max), "Sum",
                 what="reducescatter Max")
    check_raises(ValueError, lambda: htf.broadcast(tf.ones([1]), P), "root_rank",
                 what="root out of range")
    check_raises(ValueError, lambda: htf.alltoall(tf.ones([P]), splits=[P + 1] * P), "splits",
                 what="alltoall bad splits")
    check_raises(ValueError, lambda: htf.DistributedGradientTape(
        tf.GradientTape(), op=htf.Sum, gradient_predivide_factor=2.0), "predivide",
        what="predivide with Sum")
    if P > 1:
        e = check_raises(RuntimeError, lambda: htf.allreduce(tf.ones([R + 2]), name="mismatch"),
                         "shape", what="mismatched shapes (eager)")
        check(isinstance(e, htf.TensorMismatchError), "mismatch is TensorMismatchError", type(e))
        try:
            tf.function(lambda: htf.allreduce(tf.ones([R + 2]), name="mismatch_graph"))()
            fail("mismatched shapes (graph)", "nothing raised")
        except tf.errors.OpError as e:
            check("shape" in str(e) and "mismatch_graph" in str(e), "graph mismatch message",
                  str(e)[:300])
    out = htf.allreduce(tf.ones([2]), op=htf.Sum, name="after_mismatch")
    check_equal(npy(out), np.full([2], P, np.float32), "engine usable after a mismatch")
    xla = tf.function(lambda v: htf.allreduce(v), jit_compile=True)
    check_raises(htf.XLANotSupportedError, lambda: xla(tf.ones([2])), "jit_compile=False",
                 what="XLA")
    def xla_tape(v):
        with tf.GradientTape() as tape:
            tape.watch(v)
            loss = tf.reduce_sum(v * v)
        return htf.DistributedGradientTape(tape).gradient(loss, v)
    check_raises(htf.XLANotSupportedError,
                 lambda: tf.function(xla_tape, jit_compile=True)(tf.ones([2])),
                 "jit_compile=False", what="XLA tape")
    finish()


if __name__ == "__main__":
    main()
