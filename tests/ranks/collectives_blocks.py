"""Rank program of tests/test_collectives.py: the blocks that argv names (allreduce_matrix,
broadcast, topology, ...), run in that order after one hvd.init() (init_shutdown makes
its own), then finish(). The helpers below compare every collective against numpy."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)
import zlib

R = P = None          # this rank and the job's size, set by main() after init

BIG = int(os.environ.get("HVDTEST_BIG", "100003"))
QUICK = os.environ.get("HVDTEST_QUICK") == "1"
ALL_DTYPES = [np.dtype(t) for t in (np.uint8, np.int8, np.int16, np.int32, np.int64,
                                    np.float16, bfloat16, np.float32, np.float64, np.bool_)
              if t is not None]
FLOAT_DTYPES = [d for d in ALL_DTYPES if d.kind == "f" or d.name == "bfloat16"]
EPS = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -23,
       "float64": 2.0 ** -52}
OPS = [("Sum", hvd.Sum), ("Average", hvd.Average), ("Min", hvd.Min), ("Max", hvd.Max),
       ("Product", hvd.Product)]


def is_int(dt):
    return dt.kind in "iu"


def is_bool(dt):
    return dt == np.dtype(bool)


def rng_for(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def numel(shape):
    return int(np.prod(shape, dtype=np.int64))


def make_input(dt, opname, shape, r, key):
    """Rank r's input for an exact check of `opname` (any rank can recompute it)."""
    rng, n = rng_for(key, r), numel(shape)
    if is_bool(dt):
        flat = rng.random(n) < 0.5
    elif is_int(dt):
        info = np.iinfo(dt)            # the whole range: Sum and Product must wrap
        flat = rng.integers(info.min, info.max, size=n, dtype=dt, endpoint=True)
    else:                              # integer-valued, so every partial is exact
        lo, hi = {"Product": (-3, 3), "Min": (-1000, 1000), "Max": (-1000, 1000)}.get(
            opname, (-60, 60))
        flat = rng.integers(lo, hi, size=n, endpoint=True).astype(dt)
        if opname in ("Min", "Max") and n > 2:
            if r == 0:
                flat[1] = np.inf
            if r == P - 1:
                flat[2] = -np.inf
    return np.ascontiguousarray(flat.reshape(shape))


def scale(a, f):
    """The engine's scaling: ints in double truncated toward zero, halves via float32."""
    dt = a.dtype
    if f == 1.0 or a.size == 0:
        return a
    if is_int(dt):
        out = a.astype(np.float64) * f
    elif dt.name in ("float16", "bfloat16"):
        out = a.astype(np.float32) * np.float32(f)
    elif dt == np.float32:
        out = a * np.float32(f)
    else:
        out = a * f
    return np.asarray(out).astype(dt).reshape(a.shape)


def emulate(xs, opname, pre=1.0, post=1.0):
    dt = xs[0].dtype
    if is_bool(dt):
        f = np.logical_or if opname in ("Sum", "Max") else np.logical_and
        return f.reduce(np.stack(xs), axis=0)
    xs = [scale(x, pre) for x in xs]
    ufunc = {"Sum": np.add, "Average": np.add, "Min": np.minimum, "Max": np.maximum,
             "Product": np.multiply}[opname]
    acc = xs[0].copy()
    for x in xs[1:]:
        ufunc(acc, x, out=acc)
    return scale(acc, post * (1.0 / P) if opname == "Average" else post)


def check_allreduce(x, xs, opname, op, what, name=None, **scales):
    before = x.copy()
    out = hvd.allreduce(x, op=op, name=name, **scales)
    ok = check_equal(out, emulate(xs, opname, scales.get("prescale_factor", 1.0),
                                  scales.get("postscale_factor", 1.0)), what)
    check_equal(x, before, what + ": the input was modified")
    if isinstance(out, np.ndarray) and x.size:
        check(not np.shares_memory(out, x), what, "returned the input's memory")
    return ok


def allreduce_matrix():
    # Every dtype x every valid op x shapes (0-d, empty, 1, odd, multi-dim, above fusion).
    SHAPES = [(), (0,), (1,), (1001,), (4, 0, 3), (3, 5, 7), (BIG,)]
    if QUICK:
        SHAPES = [(), (0,), (1001,), (3, 5, 7)]
    case = 0
    for dt in ALL_DTYPES:
        for opname, op in OPS:
            if is_bool(dt) and opname == "Average":
                continue
            for shape in SHAPES:
                key = ("matrix", dt.name, opname, shape)
                xs = [make_input(dt, opname, shape, r, key) for r in range(P)]
                name = f"matrix.{case}" if case % 2 == 0 else None   # named and numbered
                check_allreduce(xs[R], xs, opname, op,
                                f"allreduce dtype={dt.name} op={opname} shape={shape} "
                                f"name={name}", name=name)
                case += 1
    print(f"allreduce matrix: {case} cases", flush=True)


def allreduce_fractional():
    # Fractional floats: the reduction order matters, so compare with a rounding bound.
    for dt in FLOAT_DTYPES:
        eps = EPS[dt.name]
        for opname, op in OPS:
            if opname in ("Min", "Max"):
                continue
            for shape in [(1001,), (BIG,)] if dt == np.float32 else [(1001,)]:
                key = ("fractional", dt.name, opname, shape)
                if opname == "Product":
                    xs = [rng_for(key, r).uniform(0.5, 2.0, shape).astype(dt) for r in range(P)]
                else:
                    xs = [rng_for(key, r).normal(0.0, 1.0, shape).astype(dt) for r in range(P)]
                exact = emulate([x.astype(np.float64) for x in xs], opname).astype(dt)
                bound = max(float(np.max(np.abs(x.astype(np.float64)))) for x in xs)
                atol = 0.0 if opname == "Product" else 2 * P * P * eps * bound
                out = hvd.allreduce(xs[R], op=op)
                check_close(out, exact, f"allreduce fractional dtype={dt.name} op={opname} "
                                        f"shape={shape}", rtol=2 * (P + 1) * eps, atol=atol)

    # Rounding, exactly: only rank 0 contributes non-zero values, so the sum is exact and
    # the result is decided by the scaling steps alone, whose rounding (float32 arithmetic,
    # round-to-nearest-even into the type) numpy reproduces bit for bit. x * 3 and x / 3 hit
    # ties and near-ties for every dtype.
    for dt in FLOAT_DTYPES:
        for opname, op, pre, post in [("Sum", hvd.Sum, 3.0, 1.0), ("Sum", hvd.Sum, 1.0, 1 / 3),
                                      ("Average", hvd.Average, 1.0, 1.0),
                                      ("Average", hvd.Average, 0.1, 7.0)]:
            key = ("rounding", dt.name, opname, pre, post)
            rng = rng_for(key)
            x0 = (rng.standard_normal(4099) * 2.0 ** rng.integers(-8, 8, 4099)).astype(dt)
            xs = [x0] + [np.zeros_like(x0) for _ in range(P - 1)]
            check_allreduce(xs[R], xs, opname, op, f"allreduce rounding dtype={dt.name} "
                            f"op={opname} prescale={pre} postscale={post}",
                            prescale_factor=pre, postscale_factor=post)
    print("allreduce fractional and rounding: done", flush=True)


def allreduce_scaling():
    # prescale/postscale: exact, because factors are dyadic for floats and integer data
    # stays in range; ints also get 1/3 to check truncation toward zero.
    FLOAT_FACTORS = [(0.5, 0.25), (3.0, 0.5), (1.0, 2.0), (0.25, 4.0)]
    INT_FACTORS = [(0.5, 0.25), (3.0, 0.5), (1.0 / 3.0, 1.0), (1.0, 1.0 / 3.0), (0.5, 1.0)]
    case = 0
    for dt in [d for d in ALL_DTYPES if not is_bool(d)]:
        for pre, post in INT_FACTORS if is_int(dt) else FLOAT_FACTORS:
            for opname, op in [("Sum", hvd.Sum), ("Average", hvd.Average)]:
                for shape in [(1,), (1001,), (2, 3, 4)]:
                    key = ("scale", dt.name, pre, post, opname, shape)
                    lo = 0 if dt.kind == "u" else -20
                    xs = [rng_for(key, r).integers(lo, 20, size=shape, endpoint=True).astype(dt)
                          for r in range(P)]
                    check_allreduce(xs[R], xs, opname, op,
                                    f"allreduce dtype={dt.name} op={opname} shape={shape} "
                                    f"prescale={pre} postscale={post}",
                                    name=f"scale.{case}", prescale_factor=pre,
                                    postscale_factor=post)
                    case += 1

    # Default op is Average; the deprecated average= still works and warns.
    for dt in (np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.float64)):
        xs = [make_input(dt, "Sum", (17,), r, ("default", dt.name)) for r in range(P)]
        check_equal(hvd.allreduce(xs[R]), emulate(xs, "Average"),
                    f"allreduce({dt.name}) with no op must average")
        check_equal(hvd.synchronize(hvd.allreduce_async(xs[R], name=f"dflt.{dt.name}")),
                    emulate(xs, "Average"), f"allreduce_async({dt.name}) with no op must average")
        for average, opname in ((True, "Average"), (False, "Sum")):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                out = hvd.allreduce(xs[R], average=average)
            check_equal(out, emulate(xs, opname), f"allreduce({dt.name}, average={average})")
            check(any(issubclass(w.category, DeprecationWarning) and "average" in str(w.message)
                      for w in caught), f"allreduce(average={average})",
                  f"no DeprecationWarning mentioning average=; got {[str(w.message) for w in caught]}")
            with warnings.catch_warnings(record=True):
                warnings.simplefilter("always")
                out = hvd.synchronize(hvd.allreduce_async(xs[R], average=average))
            check_equal(out, emulate(xs, opname), f"allreduce_async({dt.name}, average={average})")
    check_raises(ValueError, lambda: hvd.allreduce(xs[R], op=hvd.Sum, average=True), "average",
                 what="allreduce(op=Sum, average=True)")
    check_equal(hvd.allreduce(xs[R], op=hvd.Sum), emulate(xs, "Sum"),
                "allreduce after the refused op=+average= call")
    print(f"allreduce scaling: {case} cases", flush=True)


def async_fusion():
    # Many named async allreduces in flight at once, submitted in a rank-dependent order
    # (negotiation must match them by name), small enough to be fused, of mixed dtypes, ops
    # and scaling (only compatible ones may share a fused buffer), plus tensors above the
    # fusion threshold; all polled to completion before any is synchronized.
    N = 60 if QUICK else 160
    specs = []
    dts = [np.dtype(np.float32), np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.float64),
           np.dtype(np.float16), np.dtype(np.int64), np.dtype(np.uint8), np.dtype(np.bool_)]
    ops = [("Sum", hvd.Sum), ("Average", hvd.Average), ("Max", hvd.Max), ("Sum", hvd.Sum),
           ("Min", hvd.Min)]
    for i in range(N):
        dt = dts[i % len(dts)]
        opname, op = ops[i % len(ops)]
        if is_bool(dt) and opname == "Average":
            opname, op = "Sum", hvd.Sum
        shape = (i % 23 + 1,) if i % 3 else (i % 5 + 1, 4)
        if i % 40 == 7:
            shape = (BIG,)
        scales = {"prescale_factor": 0.5} if (i % 11 == 0 and not is_bool(dt)) else {}
        specs.append((i, dt, opname, op, shape, scales))
    inputs = {i: [make_input(dt, opname, shape, r, ("async", i)) for r in range(P)]
              for i, dt, opname, op, shape, scales in specs}
    order = rng_for("async-order", R).permutation(len(specs))
    handles = {}
    for k in order:
        i, dt, opname, op, shape, scales = specs[k]
        handles[i] = hvd.allreduce_async(inputs[i][R], op=op, name=f"async.{i}", **scales)
        check(isinstance(handles[i], int), f"allreduce_async #{i}",
              f"handle is {type(handles[i]).__name__}, not int")
    deadline = time.monotonic() + 60
    pending = set(handles)
    while pending and time.monotonic() < deadline:
        pending = {i for i in pending if not hvd.poll(handles[i])}
        time.sleep(0.001)
    check(not pending, "poll", f"{len(pending)} async ops never polled True within 60 s")
    for i, dt, opname, op, shape, scales in specs:
        check(hvd.poll(handles[i]) is True, f"poll(async.{i})", "a finished op must stay True")
    for i, dt, opname, op, shape, scales in reversed(specs):
        out = hvd.synchronize(handles[i])
        check_equal(out, emulate(inputs[i], opname, scales.get("prescale_factor", 1.0)),
                    f"allreduce_async #{i} dtype={dt.name} op={opname} shape={shape} {scales}")
        check_raises(ValueError, lambda: hvd.synchronize(handles[i]), str(handles[i]),
                     what=f"synchronize(async.{i}) twice")
        check_raises(ValueError, lambda: hvd.poll(handles[i]), str(handles[i]),
                     what=f"poll(async.{i}) after synchronize")

    # Unnamed async ops of every kind are numbered per op type: rank-dependent interleaving
    # of the types must still pair them up. Synchronize without polling, in reverse.
    for rnd in range(3):
        a = [make_input(np.dtype(np.float32), "Sum", (37, 3), r, ("mix", rnd)) for r in range(P)]
        g = [np.full((r % 3, 2), r + 10 * rnd, dtype=np.int16) for r in range(P)]
        root = rnd % P
        b = [make_input(np.dtype(np.float64), "Min", (129,), r, ("mixb", rnd)) for r in range(P)]
        submit = [("allreduce", lambda: hvd.allreduce_async(a[R], op=hvd.Sum)),
                  ("allgather", lambda: hvd.allgather_async(g[R])),
                  ("broadcast", lambda: hvd.broadcast_async(b[R], root))]
        if R % 2:
            submit.reverse()
        hs = {kind: fn() for kind, fn in submit}
        check_equal(hvd.synchronize(hs["broadcast"]), b[root], f"broadcast_async round {rnd}")
        check_equal(hvd.synchronize(hs["allgather"]), np.concatenate(g),
                    f"allgather_async round {rnd}")
        check_equal(hvd.synchronize(hs["allreduce"]), emulate(a, "Sum"),
                    f"allreduce_async round {rnd}")
    print(f"async: {N} named + mixed unnamed ops", flush=True)


def allgather():
    def rows_for(r, pattern):
        return {"mixed": [3, 0, 2, 5][r % 4],      # rank 1 contributes nothing
                "rank": r,                          # rank 0 contributes nothing
                "none": 0,                          # nobody contributes
                "one": 1}[pattern]

    case = 0
    for dt in ALL_DTYPES:
        for pattern in ("mixed", "rank", "none", "one"):
            for tail in [(), (3,), (2, 0), (2, 3, 2)]:
                key = ("gather", dt.name, pattern, tail)
                xs = [make_input(dt, "Max", (rows_for(r, pattern),) + tail, r, key)
                      for r in range(P)]
                before = xs[R].copy()
                name = f"gather.{case}" if case % 2 else None
                out = hvd.allgather(xs[R], name=name)
                what = f"allgather dtype={dt.name} rows={pattern} tail={tail} name={name}"
                check_equal(out, np.concatenate(xs), what)
                check_equal(xs[R], before, what + ": the input was modified")
                case += 1
    # Large and uneven: about 100k float32 in total.
    xs = [make_input(np.dtype(np.float32), "Max", (BIG // 4 + 7 * r, 4), r, ("gbig",))
          for r in range(P)]
    check_equal(hvd.allgather(xs[R], name="gather.big"), np.concatenate(xs), "allgather big")
    print(f"allgather: {case + 1} cases", flush=True)


def broadcast():
    case = 0
    SHAPES = [(), (0,), (1,), (1001,), (7, 3), (BIG,)]
    if QUICK:
        SHAPES = [(), (0,), (1001,), (7, 3)]
    for root in range(P):
        for dt in ALL_DTYPES:
            for shape in SHAPES:
                key = ("bcast", root, dt.name, shape)
                xs = [make_input(dt, "Max", shape, r, key) for r in range(P)]
                before = xs[R].copy()
                name = f"bcast.{case}" if case % 2 else None
                out = hvd.broadcast(xs[R], root, name=name)
                what = f"broadcast root={root} dtype={dt.name} shape={shape} name={name}"
                check_equal(out, xs[root], what)
                check_equal(xs[R], before, what + ": the input was modified")
                if isinstance(out, np.ndarray) and out.size:
                    check(not np.shares_memory(out, xs[R]), what, "returned the input's memory")
                case += 1
    # numpy integer root, and broadcast_async
    x = np.arange(5, dtype=np.int64) + 100 * R
    check_equal(hvd.broadcast(x, np.int64(P - 1)), np.arange(5) + 100 * (P - 1),
                "broadcast with a numpy integer root")
    check_equal(hvd.synchronize(hvd.broadcast_async(x, 0, name="bcast.async")), np.arange(5),
                "broadcast_async")
    print(f"broadcast: {case} cases", flush=True)


def barrier():
    # Each rank announces its arrival with a file (ranks share the working directory), late
    # ranks arrive later; after the barrier every rank must see every file.
    for rnd in range(3):
        time.sleep(0.05 * ((R + rnd) % P))
        open(f"arrived.{rnd}.{R}", "w").close()
        ret = hvd.barrier()
        check(ret is None, "barrier", f"returned {ret!r}")
        missing = [r for r in range(P) if not os.path.exists(f"arrived.{rnd}.{r}")]
        check(not missing, f"barrier round {rnd}", f"passed before ranks {missing} arrived")
        hvd.barrier()       # nobody deletes or re-creates files until all have looked
    print("barrier: done", flush=True)


def topology():
    import json as _json
    topo = dict(rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(),
                local_size=hvd.local_size(), cross_rank=hvd.cross_rank(),
                cross_size=hvd.cross_size(), is_initialized=hvd.is_initialized(),
                mpi_built=hvd.mpi_built(), gloo_built=hvd.gloo_built(),
                nccl_built=hvd.nccl_built(), hostname=os.environ.get("HOROVOD_HOSTNAME"),
                homogeneous=hvd.is_homogeneous())
    try:
        topo["threads"] = hvd.mpi_threads_supported()
    except ValueError:
        topo["threads"] = "not-mpi"
    print("topo=" + _json.dumps(topo), flush=True)
    everyone = hvd.allgather(np.array([[hvd.rank(), hvd.local_rank(), hvd.local_size(),
                                        hvd.cross_rank(), hvd.cross_size()]], dtype=np.int32))
    check_equal(everyone[:, 0], np.arange(P, dtype=np.int32), "allgather of the ranks")
    print("all_topo=" + _json.dumps(everyone.tolist()), flush=True)


def init_shutdown():
    import json as _json
    msg = "Horovod has not been initialized; use hvd.init()."
    check(not hvd.is_initialized(), "is_initialized before init")
    for fn in (hvd.rank, hvd.size, hvd.local_rank, hvd.local_size, hvd.cross_rank,
               hvd.cross_size, hvd.barrier, lambda: hvd.allreduce(np.ones(2))):
        check_raises(ValueError, fn, msg, what="before init: " + getattr(fn, "__name__", "op"))

    hvd.init()
    R, P = hvd.rank(), hvd.size()
    topo = (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(),
            hvd.cross_size())
    x = np.arange(6, dtype=np.float32).reshape(2, 3) + R
    expected = sum(np.arange(6, dtype=np.float32).reshape(2, 3) + r for r in range(P))

    # init() is idempotent, also while an op is in flight
    h = hvd.allreduce_async(x, op=hvd.Sum, name="inflight")
    hvd.init()
    hvd.init()
    check_equal(hvd.synchronize(h), expected, "allreduce across repeated init()")
    check(hvd.is_initialized(), "is_initialized after init")
    check((hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(),
           hvd.cross_size()) == topo, "topology after repeated init()")
    check_equal(hvd.allreduce(x, op=hvd.Sum, name="first"), expected, "allreduce after init x3")

    for generation in range(2):
        hvd.shutdown()
        check(not hvd.is_initialized(), f"is_initialized after shutdown #{generation}")
        check_raises(ValueError, hvd.rank, msg, what="rank() after shutdown")
        check_raises(ValueError, lambda: hvd.allreduce(x, name="after"), msg,
                     what="allreduce after shutdown")
        hvd.shutdown()      # a second shutdown is harmless
        hvd.init()
        check(hvd.is_initialized(), f"is_initialized after re-init #{generation}")
        check((hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(),
               hvd.cross_size()) == topo, f"topology after re-init #{generation}")
        # the same names as before, and unnamed ops (numbering continues per process)
        check_equal(hvd.allreduce(x, op=hvd.Sum, name="first"), expected,
                    f"named allreduce after re-init #{generation}")
        check_equal(hvd.allreduce(x, op=hvd.Sum), expected,
                    f"unnamed allreduce after re-init #{generation}")
        check_equal(hvd.allgather(np.array([R])), np.arange(P), f"allgather after re-init #{generation}")
        check_equal(hvd.broadcast(x, P - 1), x - R + P - 1, f"broadcast after re-init #{generation}")
        hvd.barrier()
    print("init/shutdown: done", flush=True)


def main():
    global R, P
    names = sys.argv[1:]
    if "init_shutdown" not in names:
        hvd.init()
        R, P = hvd.rank(), hvd.size()
    for name in names:
        globals()[name]()
    finish()


if __name__ == "__main__":
    main()
