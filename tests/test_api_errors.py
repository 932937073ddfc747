"""Bad arguments and misuse: the right exception type, a message that names the problem,
and an engine that still serves the next op.

Single-rank cases run one plain-python subprocess each (cheap, and a fresh process, so
"before init" and shutdown are real). Cases that need peers (a duplicate name that is
surely still in flight, ranks that disagree, a lost rank) run under horovodlikerun.
"""
import importlib.util

import pytest

from harness import RANK_PRELUDE, launcher_matrix, run_ranks

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(120)

NOT_INIT = "Horovod has not been initialized; use hvd.init()."

LIB = r'''
CASE = sys.argv[1]


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
'''

SINGLE_RANK_CASES = r'''
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
    # `a` belonged to the previous engine; it must not alias the new set with its id.
    check_raises(ValueError, lambda: hvd.allreduce(np.ones(2), process_set=a),
                 "not registered", what="a set of the previous engine")


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


CASES = {k[len("case_"):]: v for k, v in list(globals().items()) if k.startswith("case_")}
CASES[CASE]()
works(CASE)
finish()
'''

SINGLE = RANK_PRELUDE + LIB + SINGLE_RANK_CASES

SINGLE_CASES = ["before_init", "not_an_array", "unsupported_dtype", "non_contiguous",
                "allgather_0d", "bad_root", "bool_average", "bad_op_and_dims",
                "unknown_handle", "bad_process_set_at_init"]


@pytest.mark.parametrize("case", SINGLE_CASES)
def test_bad_arguments_single_rank(case):
    run_ranks(SINGLE, 1, "python", args=(case,), timeout=60).assert_ok()


def test_duplicate_in_flight_name_single_rank():
    run_ranks(SINGLE, 1, "python", args=("duplicate_name_single_rank",),
              timeout=60).assert_ok()


@pytest.mark.parametrize("launcher,np_", launcher_matrix([("horovodlikerun", 2),
                                                          ("mpirun", 2)]))
def test_duplicate_in_flight_name_two_ranks(launcher, np_):
    run_ranks(SINGLE, np_, launcher, args=("duplicate_name_two_ranks",),
              timeout=60).assert_ok()


MISMATCH = RANK_PRELUDE + r'''
import re
hvd.init()
R, P = hvd.rank(), hvd.size()
LAST = P - 1          # only the last rank disagrees
odd = R == LAST
f32 = np.float32


def expect_mismatch(label, fn, name, field, good=None, bad=None):
    """TensorMismatchError on every rank; the message names the tensor, the field, the
    disagreeing rank with its value, and some other rank with the agreed value (which
    rank the engine takes as the reference is its own business)."""
    needles = [name, field, f"rank {LAST}"] + ([f"rank {LAST} has {bad}"] if bad else [])
    e = check_raises(hvd.TensorMismatchError, fn, *needles, what=label)
    check(isinstance(e, RuntimeError), label, "TensorMismatchError is a RuntimeError")
    if e is not None and good is not None:
        others = [int(m) for m in re.findall(r"rank (\d+) has " + re.escape(good), str(e))]
        check(any(r != LAST for r in others), label,
              f"message {str(e)!r} names no agreeing rank with {good}")


cases = [
    ("shape", lambda: hvd.allreduce(np.ones(5 if odd else 4, f32), name="m.shape"),
     ["allreduce.m.shape", "shape", "[4]", "[5]"]),
    ("shape 2-d", lambda: hvd.allreduce(np.ones((2, 3) if odd else (3, 2), f32),
                                        name="m.shape2"),
     ["allreduce.m.shape2", "shape", "[3, 2]", "[2, 3]"]),
    ("dtype", lambda: hvd.allreduce(np.ones(4, np.float64 if odd else f32), name="m.dtype"),
     ["allreduce.m.dtype", "dtype", "float32", "float64"]),
    ("op", lambda: hvd.allreduce(np.ones(4, f32), op=hvd.Max if odd else hvd.Sum,
                                 name="m.op"),
     ["allreduce.m.op", "op", "Sum", "Max"]),
    ("root", lambda: hvd.broadcast(np.ones(4, f32), 1 if odd else 0, name="m.root"),
     ["broadcast.m.root", "root", "0", "1"]),
    ("scale", lambda: hvd.allreduce(np.ones(4, f32), op=hvd.Sum, name="m.scale",
                                    prescale_factor=2.0 if odd else 1.0),
     ["allreduce.m.scale", "prescale"]),
    ("allgather trailing dims", lambda: hvd.allgather(np.ones((2, 4 if odd else 3), f32),
                                                      name="m.gather"),
     ["allgather.m.gather", "shape"]),
    ("allgather dtype", lambda: hvd.allgather(np.ones((R, 3), np.int32 if odd else np.int64),
                                              name="m.gdtype"),
     ["allgather.m.gdtype", "dtype", "int64", "int32"]),
    ("async shape", lambda: hvd.synchronize(hvd.allreduce_async(
        np.ones(3 if odd else 2, f32), name="m.async")),
     ["allreduce.m.async", "shape", "[2]", "[3]"]),
]
for label, fn, needles in cases:
    expect_mismatch(f"mismatch on {label}", fn, *needles)
    # the engine goes on: the same name now agrees, then unrelated ops
    check_equal(hvd.allreduce(np.full(3, R, f32), op=hvd.Sum, name="after.mismatch"),
                np.full(3, sum(range(P)), f32), f"allreduce after mismatch on {label}")
# a mismatched op inside a batch of good in-flight ops fails alone
good = [hvd.allreduce_async(np.full(8, R + i, f32), op=hvd.Sum, name=f"batch.{i}")
        for i in range(10)]
bad = hvd.allreduce_async(np.ones(7 if odd else 6, f32), op=hvd.Sum, name="batch.bad")
expect_mismatch("mismatch inside a batch", lambda: hvd.synchronize(bad),
                "allreduce.batch.bad", "shape", "[6]", "[7]")
for i, h in enumerate(good):
    check_equal(hvd.synchronize(h), np.full(8, sum(range(P)) + P * i, f32),
                f"good op {i} of the batch with a mismatch")
finish()
'''


@pytest.mark.parametrize("launcher,np_", launcher_matrix(
    [("horovodlikerun", 2), ("horovodlikerun", 3), ("mpirun", 2)]))
def test_ranks_that_disagree_get_tensor_mismatch_error(launcher, np_):
    run_ranks(MISMATCH, np_, launcher, timeout=90).assert_ok()


LOST_PEER = RANK_PRELUDE + r'''
hvd.init()
R, P = hvd.rank(), hvd.size()
x = np.ones(4, dtype=np.float32)
check_equal(hvd.allreduce(x, op=hvd.Sum, name="before"), x * P, "allreduce before the loss")
if R == P - 1:
    # Wait until the others have their copy of "before" (what happens to an op that a
    # rank crashes in the middle of is not the point here), then vanish: no atexit, no
    # goodbye.
    wait_for(*[f"before-done.{r}" for r in range(P - 1)])
    print("HVDTEST-OK (leaving without shutdown)", flush=True)
    os._exit(0)
arrive(f"before-done.{R}")
t0 = time.monotonic()
e = check_raises(hvd.HorovodInternalError, lambda: hvd.allreduce(x, name="after"),
                 f"rank {P - 1}", "lost", what="allreduce after a peer vanished")
check(time.monotonic() - t0 < 30, "loss detection", f"took {time.monotonic() - t0:.1f} s")
check(isinstance(e, RuntimeError), "HorovodInternalError is a RuntimeError")
check_raises(hvd.HorovodInternalError, lambda: hvd.allreduce(x, name="later"),
             what="later ops keep failing")
if _FAILURES:
    sys.stderr.write("\n".join(_FAILURES) + "\n")
    sys.exit(1)
print("HVDTEST-OK", flush=True)
'''


@pytest.mark.parametrize("np_", [2, 3])
def test_lost_peer_raises_horovod_internal_error(np_):
    run_ranks(LOST_PEER, np_, "horovodlikerun", timeout=90).assert_ok()


# Unnamed ops from several threads at once: numbered per thread (by the thread's name),
# so each pairs with the same thread's op on the other ranks; the issue this guards
# against paired a third to a half of them with another thread's tensor, silently.
THREADS = RANK_PRELUDE + r'''
import threading
hvd.init()
P = hvd.size()
OPS = 40
results = {}


def work(i):
    results[i] = [hvd.allreduce(np.full(3, float(100 * i + k)), op=hvd.Sum)[0]
                  for k in range(OPS)]


threads = [threading.Thread(target=work, args=(i,), name=f"worker-{i}") for i in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
for i in range(4):
    check_equal(np.array(results[i]), np.array([P * (100.0 * i + k) for k in range(OPS)]),
                f"unnamed allreduces of thread worker-{i}")
check_equal(hvd.allreduce(np.ones(2), op=hvd.Sum), np.full(2, float(P)), "main thread")

# Two live threads of one name cannot be told apart: refused, with a clear error.
submitted, leave, errors = threading.Event(), threading.Event(), []


def first():
    hvd.allreduce(np.ones(1), op=hvd.Sum)
    submitted.set()
    leave.wait(60)


def second():
    try:
        hvd.allreduce(np.ones(1), op=hvd.Sum)
    except ValueError as e:
        errors.append(str(e))


a = threading.Thread(target=first, name="twin")
a.start()
submitted.wait(60)
b = threading.Thread(target=second, name="twin")
b.start()
b.join()
leave.set()
a.join()
check(len(errors) == 1 and "another live thread" in errors[0] and "name=" in errors[0],
      "two live threads of one name are refused", errors)
finish()
'''


def test_unnamed_ops_from_several_threads_pair_by_thread():
    run_ranks(THREADS, 2, "horovodlikerun", timeout=90).assert_ok()
