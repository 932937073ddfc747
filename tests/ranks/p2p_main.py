"""Rank program of tests/test_p2p.py, run by test_p2p_numpy."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)
import zlib


def main():
    hvd.init()
    R, P = hvd.rank(), hvd.size()
    assert P == 2
    peer = 1 - R
    EAGER = int(os.environ.get("HOROVODLIKE_P2P_EAGER_BYTES", 64 << 10))
    DTYPES = [np.dtype(t) for t in (np.uint8, np.int8, np.int16, np.int32, np.int64,
                                    np.float16, bfloat16, np.float32, np.float64, np.bool_)
              if t is not None]
    SIZES = [(0,), (1,), (7, 3), (1_000_003,)]     # the last: many staging pieces

    def data(dt, shape, salt):
        n = int(np.prod(shape))
        rng = np.random.default_rng(zlib.crc32(repr((dt.name, shape, salt)).encode()))
        if dt == np.bool_:
            return (rng.random(n) < 0.5).reshape(shape)
        if dt.kind in "iu":
            return rng.integers(0, 100, size=n).astype(dt).reshape(shape)
        return rng.integers(-1000, 1000, size=n).astype(dt).reshape(shape)

    # 1. every dtype and size, rank 0 -> rank 1, sent before the recv is posted (the
    # barrier orders it: each eager send has completed before rank 1 leaves the barrier;
    # one above HOROVODLIKE_P2P_EAGER_BYTES is announced, and moves once the recv is
    # posted, so it is only waited for after the recvs).
    sent = []
    if R == 0:
        for dt in DTYPES:
            for shape in SIZES:
                pair = [hvd.send_async(data(dt, shape, 1), 1, name=f"a.{dt.name}.{shape}"),
                        hvd.send_async(data(dt, shape, 2), 1, name=f"b.{dt.name}.{shape}")]
                if data(dt, shape, 1).nbytes <= EAGER:      # completes unmatched
                    [hvd.synchronize(h) for h in pair]
                else:
                    sent += pair
    hvd.barrier()
    if R == 1:
        for dt in DTYPES:
            for shape in SIZES:
                got = hvd.recv(0, name=f"a.{dt.name}.{shape}")
                check_equal(got, data(dt, shape, 1), f"recv {dt} {shape}")
                out = np.empty(shape, dt)
                back = hvd.recv_(out, 0, name=f"b.{dt.name}.{shape}")
                check(back is out, f"recv_ {dt} {shape} returns its buffer")
                check_equal(out, data(dt, shape, 2), f"recv_ {dt} {shape}")

    for h in sent:
        hvd.synchronize(h)

    # 2. the other order: rank 1 posts its recvs (both kinds) first, then rank 0 sends.
    handles = []
    if R == 1:
        for shape in SIZES:
            handles.append(("new", shape, hvd.recv_async(0, name=f"c.{shape}")))
            buf = np.empty(shape, np.float32)
            handles.append((buf, shape, hvd.recv_async_(buf, 0, name=f"d.{shape}")))
    hvd.barrier()
    if R == 0:
        for shape in SIZES:
            hvd.send(data(np.dtype(np.float32), shape, 3), 1, name=f"c.{shape}")
            hvd.send(data(np.dtype(np.float32), shape, 4), 1, name=f"d.{shape}")
    for kind, shape, h in handles:
        got = hvd.synchronize(h)
        salt = 3 if isinstance(kind, str) else 4
        check_equal(got, data(np.dtype(np.float32), shape, salt), f"posted first {shape} {salt}")

    # 3. names received in the reverse order of sending; a repeated name is FIFO;
    # unnamed messages are numbered per pair and direction.
    if R == 0:
        for i in range(5):
            hvd.send(np.array([i]), 1, name=f"rev.{i}")
        for i in range(3):
            hvd.send(np.array([10 + i]), 1, name="same")
        for i in range(3):
            hvd.send(np.array([20 + i]), 1)
    else:
        for i in reversed(range(5)):
            check_equal(hvd.recv(0, name=f"rev.{i}"), np.array([i]), f"reverse {i}")
        for i in range(3):
            check_equal(hvd.recv(0, name="same"), np.array([10 + i]), f"fifo {i}")
        for i in range(3):
            check_equal(hvd.recv(0), np.array([20 + i]), f"unnamed {i}")

    # 4. many outstanding messages both ways, all posted before any is waited for;
    # recvs posted in the opposite order of the peer's sends.
    N = 200
    sends = [hvd.send_async(np.full(17, R * 1000 + i, np.int32), peer, name=f"m.{i}") for i in range(N)]
    recvs = [(i, hvd.recv_async(peer, name=f"m.{i}")) for i in reversed(range(N))]
    for i, h in recvs:
        check_equal(hvd.synchronize(h), np.full(17, peer * 1000 + i, np.int32), f"outstanding {i}")
    for h in sends:
        check(hvd.poll(h) in (True, False), "poll")
        hvd.synchronize(h)

    # 5. both ranks post a send of 8 MiB to each other before either receives: more than
    # the socket buffers (and the ring) hold, so this completes only because posting
    # never blocks and every message is always read (a blocking send this large waits
    # for its recv, as MPI_Send does above its eager limit).
    big = np.arange(1 << 20, dtype=np.float64) + R
    hc = hvd.send_async(big, peer, name="cross")
    check_equal(hvd.recv(peer, name="cross"), np.arange(1 << 20, dtype=np.float64) + peer, "cross")
    hvd.synchronize(hc)

    # 6. its own channel: collectives complete while a recv waits (its message is only
    # sent after them), and while an 8 MiB send is on its way.
    h = hvd.recv_async(peer, name="late")
    hb = hvd.send_async(big, peer, name="beside")
    for i in range(3):
        s = hvd.allreduce(np.ones(1000, np.float32), op=hvd.Sum, name=f"ar.{i}")
        check_equal(s, np.full(1000, 2, np.float32), "allreduce beside a waiting recv")
    check_equal(hvd.recv(peer, name="beside"), np.arange(1 << 20, dtype=np.float64) + peer, "beside")
    hvd.synchronize(hb)
    hvd.send(np.array([R]), peer, name="late")
    check_equal(hvd.synchronize(h), np.array([peer]), "late")

    # 7. recv_ into a buffer that does not match the message: dtype, then size.
    if R == 0:
        hvd.send(np.zeros(10, np.float32), 1, name="wrong.dtype")
        hvd.send(np.zeros(10, np.float32), 1, name="wrong.size")
        hvd.send(np.zeros((2, 5), np.float32), 1, name="other.shape")
    else:
        check_raises(hvd.TensorMismatchError, lambda: hvd.recv_(np.zeros(10, np.float64), 0, name="wrong.dtype"),
                     "p2p.wrong.dtype", "rank 1", "rank 0", "dtype", "float32", "float64")
        check_raises(hvd.TensorMismatchError, lambda: hvd.recv_(np.zeros(11, np.float32), 0, name="wrong.size"),
                     "p2p.wrong.size", "rank 1", "rank 0", "size", "40 bytes (shape [10])",
                     "44 bytes (shape [11])")
        ok = np.ones(10, np.float32)       # the same size in another shape is accepted
        hvd.recv_(ok, 0, name="other.shape")
        check_equal(ok, np.zeros(10, np.float32), "same size, other shape")

    # 8. arguments, refused before anything is queued
    check_raises(ValueError, lambda: hvd.send(np.zeros(1), R), "cannot send to itself")
    check_raises(ValueError, lambda: hvd.recv(5), "source rank 5 is not a rank of the job")
    check_raises(TypeError, lambda: hvd.send(np.zeros(1), 1.0), "must be an int")
    check_raises(TypeError, lambda: hvd.send([1, 2], peer), "numpy array")
    finish()


if __name__ == "__main__":
    main()
