"""Rank program of tests/test_api_errors.py: one bad-argument case (argv[1] names a
case_* function below), then works() checks that the engine still serves every op."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)


def works(tag):
    """The engine still serves every kind of op after a refused call."""
    R, P = hvd.rank(), hvd.size()
    x = np.arange(7, dtype=np.float32) + R
    check_equal(hvd.allreduce(x, op=hvd.Sum),
                sum(np.arange(7, dtype=np.float32) + r for r in range(P)),
                f"{tag}: a following allreduce")
    check_equal(hvd.synchronize(hvd.allreduce_async(x, op=hvd.Max, name=f"after.{tag}")),
                np.arange(7, dtype=np.float32) + P - 1, f"{tag}: a following allreduce_async")
    check_equal(hvd.allgather(np.full((R + 1, 2), R, dtype=np.int32)),
                np.concatenate([np.full((r + 1, 2), r, dtype=np.int32) for r in range(P)]),
                f"{tag}: a following allgather")
    check_equal(hvd.broadcast(x, P - 1), np.arange(7, dtype=np.float32) + P - 1,
                f"{tag}: a following broadcast")
    hvd.barrier()


def all_ops(x, root=0):
    """Every entry point that takes a tensor, as (label, thunk)."""
    return [("allreduce", lambda: hvd.allreduce(x, op=hvd.Sum)),
            ("allreduce_async", lambda: hvd.allreduce_async(x, op=hvd.Sum)),
            ("allgather", lambda: hvd.allgather(x)),
            ("allgather_async", lambda: hvd.allgather_async(x)),
            ("broadcast", lambda: hvd.broadcast(x, root)),
            ("broadcast_async", lambda: hvd.broadcast_async(x, root))]


def case_before_init():
    check(not hvd.is_initialized(), "is_initialized() before init")
    x = np.ones(3, dtype=np.float32)
    calls = [("rank", hvd.rank), ("size", hvd.size), ("local_rank", hvd.local_rank),
             ("local_size", hvd.local_size), ("cross_rank", hvd.cross_rank),
             ("cross_size", hvd.cross_size), ("barrier", hvd.barrier)] + all_ops(x)
    for label, fn in calls:
        check_raises(ValueError, fn, "Horovod has not been initialized; use hvd.init().",
                     what=f"{label}() before init")
    check_raises(ValueError, lambda: hvd.synchronize(1), what="synchronize() before init")
    hvd.init()
    check(hvd.is_initialized(), "is_initialized() after init")


def case_bad_process_set_at_init():
    # The engine starts, the set is refused, and the engine is stopped again: a later
    # init() starts a working one.
    check_raises(ValueError, lambda: hvd.init(process_sets=[[0, 5]]), "[0, 5]",
                 what="init with a set beyond the world")
    check(not hvd.is_initialized(), "not initialized after a refused set")
    a = hvd.ProcessSet([0])
    hvd.init(process_sets=[a])
    check(hvd.is_initialized(), "is_initialized() after the second init")
    hvd.shutdown()
    hvd.init(process_sets=[hvd.ProcessSet([0])])
    # At one rank a set naming every rank is the global set (Horovod's rule), so `a`, of
    # the previous engine, is the global set of this one too and stays usable.
    check_equal(hvd.allreduce(np.ones(2), process_set=a), np.ones(2),
                "a set of the previous engine that names every rank")


def case_not_an_array():
    hvd.init()
    for bad, tname in ((None, "NoneType"), ([1.0, 2.0], "list"), (3.0, "float"),
                       ((1, 2), "tuple"), ("abc", "str")):
        for label, fn in all_ops(bad):
            check_raises(TypeError, fn, "numpy array", tname, what=f"{label}({bad!r})")


def case_unsupported_dtype():
    hvd.init()
    for dt in ("complex64", "complex128", "uint16", "uint32", "uint64", "object"):
        x = np.zeros(4, dtype=dt)
        for label, fn in all_ops(x):
            check_raises(TypeError, fn, dt, "not supported", what=f"{label}({dt})")


def case_non_contiguous():
    hvd.init()
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    for desc, x in (("strided", base[:, ::2]), ("transposed", base.T),
                    ("fortran", np.asfortranarray(base)), ("step", base.ravel()[::3])):
        assert not x.flags.c_contiguous
        for label, fn in all_ops(x):
            check_raises(ValueError, fn, "contiguous", what=f"{label}({desc})")
    # a contiguous copy of the same data is fine
    check_equal(hvd.allreduce(np.ascontiguousarray(base[:, ::2]), op=hvd.Sum),
                base[:, ::2], "allreduce of the contiguous copy")


def case_allgather_0d():
    hvd.init()
    for x in (np.array(3.0, dtype=np.float32), np.array(7, dtype=np.int64)):
        check_raises(ValueError, lambda: hvd.allgather(x), "dimension", what="allgather(0-d)")
        check_raises(ValueError, lambda: hvd.allgather_async(x), "dimension",
                     what="allgather_async(0-d)")
    # 0-d is fine for the ops that do not concatenate
    check_equal(hvd.allreduce(np.array(2.5), op=hvd.Sum), np.array(2.5), "allreduce(0-d)")
    check_equal(hvd.broadcast(np.array(4, dtype=np.int8), 0), np.array(4, dtype=np.int8),
                "broadcast(0-d)")


def case_bad_root():
    hvd.init()
    x = np.arange(5, dtype=np.float64)
    for root in (-1, -7, 1, 2, 1000):
        check_raises(ValueError, lambda: hvd.broadcast(x, root), str(root),
                     what=f"broadcast(root={root}) at size 1")
        check_raises(ValueError, lambda: hvd.broadcast_async(x, root), str(root),
                     what=f"broadcast_async(root={root}) at size 1")
    for root in (0.0, "0", None):
        check_raises(TypeError, lambda: hvd.broadcast(x, root), "root_rank",
                     what=f"broadcast(root={root!r})")


def case_bool_average():
    hvd.init()
    b = np.array([True, False, True])
    for label, fn in (("default op", lambda: hvd.allreduce(b)),
                      ("op=Average", lambda: hvd.allreduce(b, op=hvd.Average)),
                      ("async op=Average", lambda: hvd.allreduce_async(b, op=hvd.Average)),
                      ("prescale", lambda: hvd.allreduce(b, op=hvd.Sum, prescale_factor=2.0)),
                      ("postscale", lambda: hvd.allreduce(b, op=hvd.Max, postscale_factor=0.5))):
        check_raises(ValueError, fn, "bool", what=f"bool allreduce ({label})")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        check_raises(ValueError, lambda: hvd.allreduce(b, average=True), "bool",
                     what="bool allreduce (average=True)")
    check_raises(ValueError, lambda: hvd.allreduce(b, op=hvd.Average), "Average",
                 what="the bool message names Average")
    for op in (hvd.Sum, hvd.Max, hvd.Min, hvd.Product):
        check_equal(hvd.allreduce(b, op=op), b, f"bool allreduce op={op} at size 1")


def case_bad_op_and_dims():
    hvd.init()
    x = np.ones(3, dtype=np.float32)
    check_raises(ValueError, lambda: hvd.allreduce(x, op=99), "99", what="allreduce(op=99)")
    check_raises(ValueError, lambda: hvd.allreduce(np.ones((1,) * 9)), "9",
                 what="allreduce of a 9-d array")


def case_unknown_handle():
    hvd.init()
    for h in (123456789, -1, 0, 2 ** 40):
        check_raises(ValueError, lambda: hvd.synchronize(h), "handle", str(h),
                     what=f"synchronize({h})")
        check_raises(ValueError, lambda: hvd.poll(h), "handle", what=f"poll({h})")
    x = np.arange(4, dtype=np.int32)
    h1 = hvd.allreduce_async(x, op=hvd.Sum)
    check_equal(hvd.synchronize(h1), x, "synchronize(h1)")
    check_raises(ValueError, lambda: hvd.synchronize(h1), str(h1), what="synchronize(h1) twice")
    # the freed slot is reused by the next op; the stale handle must not alias it
    h2 = hvd.allreduce_async(x * 3, op=hvd.Sum)
    check_raises(ValueError, lambda: hvd.poll(h1), what="poll(stale h1) while h2 in flight")
    check_raises(ValueError, lambda: hvd.synchronize(h1), what="synchronize(stale h1)")
    check_equal(hvd.synchronize(h2), x * 3, "synchronize(h2) after the stale-handle calls")


def case_duplicate_name_single_rank():
    # Alone, an op may finish before the next line runs, so a duplicate cannot be forced;
    # an 8 MB tensor keeps the first op busy for a while, and a few tries make a refusal
    # (with the right message) practically certain. The two-rank case is the sure one.
    hvd.init()
    x = np.ones(2_000_000, dtype=np.float32)
    refused = {"allreduce": 0, "allgather": 0}
    for attempt in range(20):
        for kind, submit in (("allreduce", lambda: hvd.allreduce_async(x, op=hvd.Sum,
                                                                         name="dup")),
                             ("allgather", lambda: hvd.allgather_async(x, name="dup"))):
            first = submit()
            try:
                second = submit()
            except ValueError as e:
                second = None
                refused[kind] += 1
                for needle in (f"{kind}.dup", "in flight"):
                    check(needle in str(e), f"duplicate {kind} name",
                          f"message {str(e)!r} lacks {needle!r}")
            except Exception as e:
                fail(f"duplicate {kind} name", f"{type(e).__name__}: {e}")
                second = None
            check_equal(hvd.synchronize(first), x, f"the first '{kind}.dup' (try {attempt})")
            if second is not None:       # the first had finished: legal, and it must work
                check_equal(hvd.synchronize(second), x, f"second '{kind}.dup'")
        if min(refused.values()) >= 2:
            break
    for kind, n in refused.items():
        check(n >= 1, f"duplicate {kind} name", "never refused in 20 tries")
    # once finished, the name is free again, and the other op type never clashed with it
    check_equal(hvd.allreduce(x[:5], op=hvd.Sum, name="dup"), x[:5], "reusing 'dup'")


def case_duplicate_name_two_ranks():
    # The others submit only once rank 0 has made its checks, so rank 0's first op
    # cannot have finished.
    hvd.init()
    R, P = hvd.rank(), hvd.size()
    x = np.arange(6, dtype=np.float32) + R
    exp = sum(np.arange(6, dtype=np.float32) + r for r in range(P))
    if R != 0:
        wait_for("rank0-checked")
    h = hvd.allreduce_async(x, op=hvd.Sum, name="dup2")
    if R == 0:
        check(not hvd.poll(h), "poll before rank 1 submitted", "already done?")
        check_raises(ValueError, lambda: hvd.allreduce_async(x, op=hvd.Sum, name="dup2"),
                     "allreduce.dup2", "in flight", what="duplicate name on rank 0")
        b = hvd.broadcast_async(x, 0, name="bdup")
        check_raises(ValueError, lambda: hvd.broadcast_async(x, 0, name="bdup"),
                     "broadcast.bdup", what="duplicate broadcast name on rank 0")
        arrive("rank0-checked")
    else:
        b = hvd.broadcast_async(x, 0, name="bdup")
    check_equal(hvd.synchronize(h), exp, "the first 'dup2' allreduce on every rank")
    check_equal(hvd.synchronize(b), np.arange(6, dtype=np.float32), "the 'bdup' broadcast")


def main():
    case = sys.argv[1]
    cases = {k[len("case_"):]: v for k, v in globals().items() if k.startswith("case_")}
    cases[case]()
    works(case)
    finish()


if __name__ == "__main__":
    main()
