"""Rank program of tests/test_prepared_requests.py: the cached fast path of a repeated
named numpy send / recv_ (request.p2p_key) takes the calls it may, and every call it must
not take gets the slow path's answer: the same message or the same error. Rank 0 sends,
rank 1 receives."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)
from horovodlike.common import request

hvd.init(process_sets="dynamic")
R = hvd.rank()
PEER = 1 - R


def refused():
    """The slow path's argument checks (request.p2p) raise inside this."""
    return Refused(request, "p2p")


def one(x, name, i, **kw):
    """rank 0 sends x + i, rank 1 receives into a buffer like x and checks it."""
    if R == 0:
        hvd.send(x + i, PEER, name=name, **kw)
    else:
        got = hvd.recv_(np.zeros_like(x), PEER, name=name, **kw)
        check_equal(got, x + i, f"{name} message {i}")


def fast_path_is_taken():
    x = np.arange(1000, dtype=np.float32)
    one(x, "a", 0)
    with refused():
        for i in range(1, 4):
            one(x, "a", i)
        if R == 0:
            hvd.synchronize(hvd.send_async(x + 9, PEER, name="a"))
        else:
            buf = np.zeros_like(x)
            check_equal(hvd.synchronize(hvd.recv_async_(buf, PEER, name="a")), x + 9,
                        "recv_async_, cached call")


def slow_path_answers():
    x = np.arange(1000, dtype=np.float32)
    one(x, "b", 0)
    view = np.zeros(2000, np.float32)[::2]                   # same shape and dtype
    if R == 0:
        check_raises(ValueError, lambda: hvd.send(view, PEER, name="b"), "not C-contiguous",
                     what="send: non-contiguous view of a cached shape")
        check_raises(TypeError, lambda: hvd.send(x.astype(x.dtype.newbyteorder("S")), PEER,
                                                 name="b"), "byte order",
                     what="send: other byte order")
        check_raises(TypeError, lambda: hvd.send(x, True, name="b"), "must be an int",
                     what="send: dst=True after dst=1")
    else:
        check_raises(ValueError, lambda: hvd.recv_(view, PEER, name="b"), "not C-contiguous",
                     what="recv_: non-contiguous view of a cached shape")
        check_raises(TypeError, lambda: hvd.recv_(x, False, name="b"), "must be an int",
                     what="recv_: src=False after src=0")
        frozen = np.zeros_like(x)
        frozen.flags.writeable = False                       # same shape and dtype
        check_raises(ValueError, lambda: hvd.recv_(frozen, PEER, name="b"), "read-only",
                     what="recv_: a read-only array of a cached shape")
        check_raises(ValueError, lambda: hvd.recv_async_(frozen, PEER, name="b"), "read-only",
                     what="recv_async_: a read-only array of a cached shape")
        check_equal(frozen, np.zeros_like(x), "the read-only array is untouched")
    one(x.astype(np.int32), "b", 1)                        # changed dtype: a new key
    one(x[:10].copy(), "b", 2)                             # changed shape
    # a recv_ whose cached buffer no longer matches the message fails as the slow path does
    if R == 0:
        hvd.send(x[:5].copy(), PEER, name="b")
    else:
        check_raises(hvd.TensorMismatchError if hasattr(hvd, "TensorMismatchError")
                     else RuntimeError, lambda: hvd.recv_(np.zeros(10, np.float32), PEER,
                                                          name="b"),
                     "differ in size", what="recv_: cached buffer, message of another size")


def removed_set_is_refused():
    ps = hvd.add_process_set([0, 1])
    x = np.arange(8, dtype=np.float64)
    one(x, "c", 0, process_set=ps)
    one(x, "c", 1, process_set=ps)                         # cached under the set
    hvd.remove_process_set(ps)
    fn = (lambda: hvd.send(x, PEER, name="c", process_set=ps)) if R == 0 else \
        (lambda: hvd.recv_(np.zeros_like(x), PEER, name="c", process_set=ps))
    check_raises(ValueError, fn, what="a removed process set")


fast_path_is_taken()
slow_path_answers()
removed_set_is_refused()
finish()
