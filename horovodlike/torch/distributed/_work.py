"""torch.distributed Work objects over engine handles, and the thread that completes
their futures.

A Work holds the binding handles (horovodlike.torch._collectives) of one torch call and a
`finish(outputs)` that turns the engine's outputs into torch's (a copy into the caller's
output tensors where the engine could not write there itself). It is finished exactly
once, by whichever comes first:
- the caller: wait() waits on the engine (the GIL released) and finishes it on the
  caller's thread: a blocking torch call (async_op=False) costs one engine wait, no
  thread hand-off;
- is_completed(): polls, and finishes it once the engine is done;
- the completer thread, for a Work whose get_future() was asked for (DDP's reducer and
  comm hooks chain on the future): it waits on the engine and completes the future, so
  the callbacks run there, never on the caller's thread, which is never blocked.

Cost model: a blocking call pays the engine wait alone. A future costs the completer one
engine wait per Work (oldest first, in short slices so a later Work that finishes first
is noticed within a slice), and its callbacks one thread start.
"""
import collections
import datetime
import threading

import torch
import torch.distributed as dist

from horovodlike.common import ops as _ops
from horovodlike.torch import _collectives

# A future's callbacks (then(), DDP's reducer, comm hooks) run where set_result is called.
# A hook may wait inside its callback for another op's future (PowerSGD does), which
# only the completer can complete: so the completer never runs callbacks itself, but
# hands each settle to a daemon thread of its own (a pool's threads are joined at exit,
# and one still waiting inside a hook would hold the process's exit).
SLICE_S = 0.002         # the completer's wait on its oldest Work before polling the rest


def _seconds(timeout):
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        s = timeout.total_seconds()
    else:
        s = float(timeout)
    return None if s <= 0 else s     # torch's "no timeout" is timedelta(0) or negative


class TimeoutError_(dist.DistBackendError):
    """A Work that did not finish within its timeout (the op goes on in the engine)."""


class Work(dist.Work):
    def __init__(self, what, handles, finish=None, timeout=None, value=None):
        super().__init__()
        self._what = what
        self._handles = list(handles)
        self._finish = finish
        self._timeout = timeout          # seconds or None: the group's default
        self._value = value              # the future's value when finish gives none
        self._lock = threading.Lock()
        self._done = False
        self._error = None
        self._future = None
        self._names = ()
        if not self._handles:
            self._complete()

    # -- torch's Work API
    def is_completed(self):
        if not self._done and all(_collectives.poll(h) for h in self._handles):
            self._complete()
        return self._done

    def is_success(self):
        return self.is_completed() and self._error is None

    def exception(self):
        return self._error

    def source_rank(self):
        return -1

    def wait(self, timeout=None):
        """Wait (the GIL released) until the op has finished; raise its error. timeout:
        this call's limit, else the group's (init_process_group(timeout=...))."""
        limit = _seconds(timeout)
        if limit is None:
            limit = self._timeout
        if not self._done:
            self._wait_engine(limit)
            self._complete()
        if self._error is not None:
            raise self._error
        return True

    def result(self):
        self.wait()
        return self._value if isinstance(self._value, list) else [self._value]

    def get_future(self):
        with self._lock:
            if self._future is None:
                self._future = torch.futures.Future()
                if self._done:
                    self._settle_future()
                    return self._future
            else:
                return self._future
        _completer.add(self)
        return self._future

    def synchronize(self):
        self.wait()

    # -- ours
    def _wait_engine(self, limit):
        import time
        deadline = None if limit is None else time.monotonic() + limit
        for h in _engine_handles(self._handles):
            declared = False
            try:
                while True:
                    try:
                        step = 0.5 if deadline is None else max(0.0, min(0.5, deadline - time.monotonic()))
                        if _ops.wait(h, step):
                            break
                        if not declared:
                            # Blocked until the op ends (or the group's timeout, meant for a
                            # lost rank): the deadlock check may count this thread as
                            # blocked, so ranks that submit different ops (a shape that
                            # differs) are named within seconds rather than hang.
                            _ops.declare_wait(h)
                            declared = True
                    except ValueError:
                        return                      # already collected, or the engine stopped
                    if deadline is not None and time.monotonic() >= deadline:
                        raise TimeoutError_(
                            f"horovodlike: {self._what} did not finish within {limit:g} s "
                            f"(the timeout of the call or of its process group); the op goes "
                            f"on in the engine, which names a lost or stalled rank when it "
                            f"finds one")
            finally:
                if declared:
                    _ops.declare_wait(None)

    def _complete(self):
        with self._lock:
            if self._done:
                return
            try:
                outs = [_collectives.synchronize(h) for h in self._handles]
                value = self._finish(outs) if self._finish is not None else None
                self._value = value if value is not None else self._value
            except ValueError as e:
                if "unknown or already synchronized handle" in str(e):
                    e = dist.DistBackendError(
                        f"horovodlike: {self._what} was still in flight when this rank's "
                        f"engine shut down (destroy_process_group or hvd.shutdown)")
                self._error = e
            except Exception as e:      # noqa: BLE001 - the op's error, raised at wait()
                self._error = _as_dist_error(e)
            self._done = True
            settle = self._future is not None
        if settle:
            if threading.current_thread() is _completer._thread:
                threading.Thread(target=self._settle_future, daemon=True,
                                 name="horovodlike-torch-callback").start()
            else:
                self._settle_future()

    def _settle_future(self):
        if self._error is not None:
            self._future.set_exception(self._error)
        else:
            v = self._value
            self._future.set_result(v if isinstance(v, list) else [v])


def _engine_handles(handles):
    for h in handles:
        if callable(h):
            yield from _engine_handles(getattr(h, "handles", ()))
        else:
            yield h


def _as_dist_error(e):
    """The engine's errors as torch's DistBackendError (what torch's callers catch),
    keeping the engine's message, which names the rank, the op and the field."""
    if isinstance(e, (dist.DistError, TypeError)):
        return e
    err = dist.DistBackendError(f"{type(e).__name__}: {e}")
    err.__cause__ = e
    return err


class _Completer:
    """One daemon thread per process that finishes Works whose future was asked for."""

    def __init__(self):
        self._works = collections.deque()
        self._cv = threading.Condition()
        self._thread = None

    def add(self, work):
        with self._cv:
            self._works.append(work)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="horovodlike-torch-completer")
                self._thread.start()
            self._cv.notify()

    def _run(self):
        while True:
            with self._cv:
                while not self._works:
                    self._cv.wait()
                oldest = self._works[0]
            self._step(oldest)

    def _step(self, oldest):
        try:
            h = next((h for h in _engine_handles(oldest._handles)
                      if not _collectives.poll(h)), None)
            if h is not None:
                _ops.wait(h, SLICE_S)
        except ValueError:
            pass                                 # collected by its caller, or shut down
        with self._cv:
            works = list(self._works)
        for w in works:
            if w._done or _done(w):
                w._complete()
                with self._cv:
                    try:
                        self._works.remove(w)
                    except ValueError:
                        pass


def _done(work):
    try:
        return all(_collectives.poll(h) for h in work._handles)
    except ValueError:
        return True                              # gone from the engine: _complete says why


_completer = _Completer()
