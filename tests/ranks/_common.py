"""What every rank program shares: numpy, horovodlike, check_* helpers that collect
failures (so one launch can check many cases and still report every failure), finish()
which agrees across ranks, and arrive()/wait_for(), the files that order ranks.

A rank program under tests/ranks/ runs by path, so this folder is its sys.path[0]:

    from _common import *  # noqa: F401,F403
"""
import os
import sys
import threading
import time
import traceback
import warnings
import numpy as np
import horovodlike as hvd
try:
    from ml_dtypes import bfloat16
except ImportError:          # bfloat16 cases are then left out
    bfloat16 = None

_FAILURES = []
_MAX_FAILURES = 40
_BEFORE_FINISH = []


def fail(what, detail=""):
    if len(_FAILURES) < _MAX_FAILURES:
        _FAILURES.append(f"{what}: {detail}")
    elif len(_FAILURES) == _MAX_FAILURES:
        _FAILURES.append("... (more failures not shown)")


def _show(a, n=8):
    a = np.asarray(a)
    return np.array2string(a.ravel()[:n].astype(np.float64) if a.dtype.name == "bfloat16"
                           else a.ravel()[:n], threshold=n) + (" ..." if a.size > n else "")


def _diff(got, exp, bad):
    idx = np.flatnonzero(np.asarray(bad).ravel())[:5]
    g, e = np.asarray(got).ravel(), np.asarray(exp).ravel()
    return "; ".join(f"[{i}] got {g[i]!r} expected {e[i]!r}" for i in idx) + \
        f" ({int(np.count_nonzero(bad))} of {np.size(bad)} differ)"


def _meta_ok(got, exp, what):
    if not isinstance(got, np.ndarray):
        fail(what, f"expected a numpy array, got {type(got).__name__}")
        return False
    if got.dtype != exp.dtype or got.shape != exp.shape:
        fail(what, f"got dtype={got.dtype} shape={got.shape}, "
                   f"expected dtype={exp.dtype} shape={exp.shape}")
        return False
    return True


def check_equal(got, exp, what):
    """Same dtype, shape and values (floats compared as float64; -0.0 == 0.0)."""
    exp = np.asarray(exp)
    if not _meta_ok(got, exp, what):
        return False
    if exp.dtype.kind in "fV" or exp.dtype.name == "bfloat16":
        g, e = got.astype(np.float64), exp.astype(np.float64)
        bad = ~((g == e) | (np.isnan(g) & np.isnan(e)))
    else:
        bad = got != exp
    if np.any(bad):
        fail(what, _diff(got, exp, bad))
        return False
    return True


def check_close(got, exp, what, rtol, atol):
    exp = np.asarray(exp)
    if not _meta_ok(got, exp, what):
        return False
    g, e = got.astype(np.float64), exp.astype(np.float64)
    bad = ~(np.abs(g - e) <= atol + rtol * np.abs(e))
    if np.any(bad):
        fail(what, _diff(got, exp, bad) + f" rtol={rtol} atol={atol}")
        return False
    return True


def check(cond, what, detail=""):
    if not cond:
        fail(what, detail)
    return bool(cond)


def check_raises(exc_type, fn, *needles, what=None):
    """fn() must raise exc_type whose message contains every needle; returns the error."""
    what = what or getattr(fn, "__name__", "call")
    try:
        fn()
    except exc_type as e:
        msg = str(e)
        missing = [n for n in needles if n not in msg]
        if missing:
            fail(what, f"{type(e).__name__} message {msg!r} lacks {missing}")
        return e
    except Exception as e:
        fail(what, f"expected {exc_type.__name__}, got {type(e).__name__}: {e}\n"
                   + traceback.format_exc())
        return e
    fail(what, f"expected {exc_type.__name__}, nothing was raised")
    return None


class Refused:
    """Within `with Refused(module, "name"):` a call of module.name raises: a call that
    returns did not go through it (a cached fast path answered)."""

    def __init__(self, module, name):
        self.module, self.name = module, name

    def __enter__(self):
        self.saved = getattr(self.module, self.name)
        setattr(self.module, self.name,
                lambda *a, **k: (_ for _ in ()).throw(AssertionError("slow path")))

    def __exit__(self, *exc):
        setattr(self.module, self.name, self.saved)


class Counted:
    """Within `with Counted() as counted:` the per-op entry points of the engine's cffi
    library (PER_OP), called through horovodlike.common.engine (the one module that calls
    it), are counted in counted.calls."""
    PER_OP = ("hvdl_run", "hvdl_enqueue", "hvdl_wait", "hvdl_release")

    def __init__(self):
        from horovodlike.common import engine
        self.engine, self.lib, self.calls = engine, engine.lib, {}

    def __getattr__(self, name):
        fn = getattr(self.lib, name)
        if name not in self.PER_OP:
            return fn

        def counted(*args):
            self.calls[name] = self.calls.get(name, 0) + 1
            return fn(*args)
        return counted

    def __enter__(self):
        self.engine.lib = self
        return self

    def __exit__(self, *exc):
        self.engine.lib = self.lib


def arrive(what):
    """Tell the other ranks this rank has got to `what` (a file in HVDTEST_DIR)."""
    open(os.path.join(os.environ["HVDTEST_DIR"], what), "w").close()


def wait_for(*whats, timeout=60):
    """Wait until other ranks have arrive()d at each of `whats`: the handshake that orders
    ranks, never a sleep. Raises TimeoutError naming what did not come."""
    deadline = time.monotonic() + timeout
    paths = [os.path.join(os.environ["HVDTEST_DIR"], w) for w in whats]
    while True:
        missing = [w for w, p in zip(whats, paths) if not os.path.exists(p)]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"no rank arrived at {missing} within {timeout} s")
        time.sleep(0.005)


def check_deadlock_verdict(cycle, deadline, expect):
    """Run `cycle` (ops no rank can complete): it must raise HorovodInternalError within
    `deadline` seconds, its message holding every text of `expect`."""
    t0 = time.monotonic()
    try:
        cycle()
        fail("the op of the cycle", "returned")
    except hvd.HorovodInternalError as e:
        took = time.monotonic() - t0
        print(f"took {took:.1f}", flush=True)
        check(took < deadline, "the error comes within seconds", f"{took:.1f} s")
        for needle in expect:
            check(needle in str(e), "the deadlock message", f"{str(e)!r} lacks {needle!r}")


class watchdog:
    """`with watchdog(stage, seconds, detail):` ends this rank (exit 3), naming the stage,
    if the block runs longer than `seconds`: a hang then fails in seconds, naming where
    (the other ranks see their peer gone and end too)."""

    def __init__(self, stage, seconds, detail=""):
        self.stage, self.seconds, self.detail = stage, seconds, detail

    def __enter__(self):
        def fire():
            r = hvd.rank() if hvd.is_initialized() else "?"
            sys.stderr.write(f"rank {r}: HANG in {self.stage} ({self.detail}"
                             f"{', ' if self.detail else ''}{self.seconds:.0f} s)\n")
            sys.stderr.flush()
            os._exit(3)
        self.timer = threading.Timer(self.seconds, fire)
        self.timer.daemon = True
        self.timer.start()

    def __exit__(self, *exc):
        self.timer.cancel()


def finish_alone():
    """For a job that has ended failed, where no collective can agree: report this
    rank's failures and exit 1 if it has any, else print the OK sentinel."""
    if _FAILURES:
        sys.stderr.write("\n".join("  " + f for f in _FAILURES) + "\n")
        sys.stderr.flush()
        sys.exit(1)
    print("HVDTEST-OK", flush=True)


def before_finish(fn):
    """Have finish() call fn() first: a check that a wrapper adds to a whole program."""
    _BEFORE_FINISH.append(fn)


def finish():
    """Agree across ranks, report every failure, exit 1 if any rank failed."""
    for fn in _BEFORE_FINISH:
        fn()
    r = hvd.rank() if hvd.is_initialized() else 0
    mine = np.array([len(_FAILURES)], dtype=np.int64)
    total = int(hvd.allreduce(mine, op=hvd.Sum, name="hvdtest.finish")[0]) \
        if hvd.is_initialized() else len(_FAILURES)
    if _FAILURES:
        sys.stderr.write(f"rank {r}: {len(_FAILURES)} failure(s):\n" +
                         "\n".join("  " + f for f in _FAILURES) + "\n")
        sys.stderr.flush()
    if total:
        print(f"HVDTEST-FAILED rank={r} mine={len(_FAILURES)} all={total}", flush=True)
        sys.exit(1)
    print(f"HVDTEST-OK rank={r}", flush=True)
