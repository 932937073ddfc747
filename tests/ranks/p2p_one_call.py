"""Rank program of tests/test_prepared_requests.py: a repeated blocking named send, recv_
and recv, of numpy arrays and of torch CPU tensors, costs one engine call (hvdl_run) and
answers exactly as the calls that enqueue, wait and release apart: the same values, the
same errors (another dtype, another size, a peer that is no rank, a removed set); and
Ctrl-C in a one-call recv_ still waiting leaves it posted with its buffer kept alive.
Rank 0 sends, rank 1 receives."""
import contextlib
import os
import signal
import threading

from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)
import torch
import horovodlike.torch as th
from horovodlike.common import engine, ops

hvd.init(process_sets="dynamic")
R = hvd.rank()
PEER = 1 - R
BINDINGS = {
    "numpy": (hvd, lambda n, dt: np.arange(n).astype(dt), np.zeros_like, np.float32, np.int32,
              lambda a, b: a.dtype == b.dtype and a.shape == b.shape and (a == b).all()),
    "torch": (th, lambda n, dt: torch.arange(n).to(dt), torch.zeros_like, torch.float32,
              torch.int32, lambda a, b: a.dtype == b.dtype and torch.equal(a, b)),
}


def one_engine_call_each(binding):
    """After a first call of each (name, peer, dtype, shape), every blocking call is one
    hvdl_run, and nothing else of the per-op API."""
    api, make, zeros, f32, _, same = BINDINGS[binding]
    x = make(1000, f32)
    for i in range(6):
        counted = Counted() if i else None
        with counted or contextlib.nullcontext():
            if R == 0:
                api.send(x + i, PEER, name=f"{binding}.into")
                api.send(x - i, PEER, name=f"{binding}.new")
            else:
                buf = zeros(x)
                got = api.recv_(buf, PEER, name=f"{binding}.into")
                check(got is buf and same(buf, x + i), f"{binding} recv_ call {i}")
                new = api.recv(PEER, name=f"{binding}.new")
                check(same(new, x - i), f"{binding} recv call {i}", f"{new}")
        if counted:
            check(counted.calls == {"hvdl_run": 2}, f"{binding} call {i}: one engine call a "
                  f"message", f"{dict(counted.calls)}")


def errors_as_apart(binding):
    """A cached call's errors are those of the same call made with the engine's calls
    apart (its *_async form, then synchronize): word for word."""
    api, make, zeros, f32, i32, _ = BINDINGS[binding]
    x = make(4, f32)
    name = f"{binding}.bad"
    if R == 0:
        api.send(x, PEER, name=name)                  # the receiver's call is cached now
        for _ in range(2):                            # another dtype, twice
            api.send(make(4, i32), PEER, name=name)
        for _ in range(2):                            # another size, twice
            api.send(make(5, f32), PEER, name=name)
        for dst, needle in ((7, "not a rank of the job"), (R, "cannot send to itself")):
            apart = check_raises(ValueError, lambda: api.synchronize(api.send_async(
                x, dst, name=name)), needle, what=f"{binding} send_async to {dst}")
            api.send(x, PEER, name=name + ".peer")    # a key of its own, cached
            once = check_raises(ValueError, lambda: api.send(x, dst, name=name + ".peer"),
                                needle, what=f"{binding} send to {dst}")
            check(str(once).replace(".peer", "") == str(apart), f"{binding} send to {dst}",
                  f"{once!r} != {apart!r}")
    else:
        api.recv_(zeros(x), PEER, name=name)
        for field in ("dtype", "differ in size"):
            apart = check_raises(hvd.TensorMismatchError, lambda: api.synchronize(
                api.recv_async_(zeros(x), PEER, name=name)), field, "rank 0", "rank 1",
                f"p2p.{name}", what=f"{binding} recv_async_, {field}")
            with Counted() as counted:
                once = check_raises(hvd.TensorMismatchError,
                                    lambda: api.recv_(zeros(x), PEER, name=name), field,
                                    "rank 0", "rank 1", f"p2p.{name}",
                                    what=f"{binding} recv_, {field}")
            check(counted.calls == {"hvdl_run": 1}, f"{binding} recv_ {field}: one call",
                  f"{dict(counted.calls)}")
            check(str(once) == str(apart), f"{binding} recv_ {field}", f"{once!r} != {apart!r}")
        for _ in range(2):
            api.recv(PEER, name=name + ".peer")
    # a removed set: refused by the cached call as by the first
    ps = hvd.add_process_set([0, 1])
    fn = (lambda: api.send(x, PEER, name=name, process_set=ps)) if R == 0 else \
        (lambda: api.recv_(zeros(x), PEER, name=name, process_set=ps))
    fn()
    fn()
    hvd.remove_process_set(ps)
    check_raises(ValueError, fn, "is not registered", what=f"{binding}: a removed process set")


def interrupted_recv_stays_posted():
    """Ctrl-C (SIGINT) once the one-call recv_ has waited its first half second: the
    KeyboardInterrupt comes out, the op stays posted with its buffer kept alive
    (ops._pending), and the message sent afterwards lands in that buffer."""
    x = np.arange(64, dtype=np.float64)
    if R == 0:
        hvd.send(x, PEER, name="late")                          # rank 1's call is cached
        hvd.recv(PEER, name="go")
        hvd.send(x + 1, PEER, name="late")
        return
    buf = np.zeros_like(x)
    hvd.recv_(buf, PEER, name="late")
    timed_out = threading.Event()
    real = engine.lib

    class Lib:
        def __getattr__(self, name):
            return getattr(real, name)

        @staticmethod
        def hvdl_run(req, inp, out, timeout, handle, msg, res):
            rc = real.hvdl_run(req, inp, out, timeout, handle, msg, res)
            if handle[0]:                   # still in flight: now it is safe to interrupt
                timed_out.set()
            return rc

    killer = threading.Thread(target=lambda: timed_out.wait(60) and os.kill(os.getpid(),
                                                                             signal.SIGINT))
    before = dict(ops._pending)
    engine.lib = Lib()
    killer.start()
    try:
        hvd.recv_(buf, PEER, name="late")
        fail("recv_ interrupted", "it returned")
    except KeyboardInterrupt:
        pass
    finally:
        engine.lib = real
        killer.join()
    parked = [v for k, v in ops._pending.items() if k not in before]
    check(len(parked) == 1 and parked[0][1] is buf, "the interrupted recv_ is parked with "
          "its buffer", f"{parked}")
    hvd.send(np.zeros(1), PEER, name="go")
    if parked:
        check(engine.wait(parked[0][0], 60), "the parked recv_ completes")
        check_equal(buf, x + 1, "the message sent after Ctrl-C, in the parked buffer")


for b in BINDINGS:
    one_engine_call_each(b)
    errors_as_apart(b)
interrupted_recv_stays_posted()
finish()
