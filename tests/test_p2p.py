"""Point-to-point messages (engine/p2p.c): hvd.send / hvd.recv / hvd.recv_ between two
ranks, matched by (source, destination, name) by those two ranks alone.

Real ranks under horovodlikerun (one host, and fake hosts with -H a:1,b:1), every test
with a timeout. What each causes:
  * every dtype, sizes 0, 1, odd and multi-piece (larger than the staging buffer and
    the socket buffers), recv (a new array) and recv_ (into the caller's);
  * both posting orders (recv posted before the send, and a send completed before its
    recv is posted: eager), names received in the reverse order, a repeated name, 200
    outstanding messages, both ranks sending 8 MiB to each other before either receives;
  * a recv that waits while a collective runs (its own channel);
  * a recv_ into a buffer of the wrong dtype or size, argument errors;
  * the stall inspector naming a recv whose name the peer never sent, and a send the
    stopped peer does not read; HOROVOD_STALL_SHUTDOWN_TIME_SECONDS failing every rank
    on a stalled recv, and the sender on a stalled send;
  * SIGKILL and SIGSTOP of the peer, named within HOROVODLIKE_PEER_TIMEOUT_SECONDS;
  * the timeline's SEND/RECV spans on both ranks' lanes.
"""
import glob
import json
import os
import signal
import textwrap
import time

import pytest

from harness import RANK_PRELUDE, run_ranks
from test_failures import _cleanup, _read_until, _spawn_job

FAKE_NODES = ["-H", "a:1,b:1", "--ssh-command", "sh -c {command}"]

MAIN = RANK_PRELUDE + textwrap.dedent(r"""
    import zlib
    hvd.init()
    R, P = hvd.rank(), hvd.size()
    assert P == 2
    peer = 1 - R
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
    # barrier orders it: each send has completed before rank 1 leaves the barrier).
    if R == 0:
        for dt in DTYPES:
            for shape in SIZES:
                hvd.send(data(dt, shape, 1), 1, name=f"a.{dt.name}.{shape}")
                hvd.send(data(dt, shape, 2), 1, name=f"b.{dt.name}.{shape}")
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

    # 5. both ranks send 8 MiB to each other before either receives: more than the
    # socket buffers hold, so this completes only because every message is always read.
    big = np.arange(1 << 20, dtype=np.float64) + R
    hvd.send(big, peer, name="cross")
    check_equal(hvd.recv(peer, name="cross"), np.arange(1 << 20, dtype=np.float64) + peer, "cross")

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
""")


def _run(script, launcher_args=(), env=None, timeout=200, np_=2):
    return run_ranks(script, np=np_, timeout=timeout, launcher_args=list(launcher_args),
                     env={"HOROVOD_STALL_CHECK_DISABLE": "1", **(env or {})})


@pytest.mark.timeout(240)
@pytest.mark.parametrize("where", ["one-node", "fake-nodes"])
def test_p2p_numpy(where):
    res = _run(MAIN, FAKE_NODES if where == "fake-nodes" else ())
    res.assert_ok()


TORCH = RANK_PRELUDE + textwrap.dedent(r"""
    import torch
    import horovodlike.torch as th
    th.init()
    R = th.rank()
    peer = 1 - R
    DT = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64, torch.bool]
    for i, dt in enumerate(DT):
        for shape in [(0,), (1,), (5, 3), (300_001,)]:
            x = (torch.arange(int(np.prod(shape))) % 7).reshape(shape).to(dt)
            if R == 0:
                th.send(x, 1, name=f"t.{i}.{shape}")
                th.send(x.t() if x.dim() == 2 else x, 1, name=f"u.{i}.{shape}")
            else:
                got = th.recv(0, name=f"t.{i}.{shape}")
                check(got.dtype == dt and tuple(got.shape) == shape and torch.equal(got, x),
                      f"torch recv {dt} {shape}", f"{got.dtype} {tuple(got.shape)}")
                want = x.t() if x.dim() == 2 else x
                out = torch.empty(want.shape, dtype=dt)
                if out.dim() == 2:
                    out = torch.empty(out.shape[::-1], dtype=dt).t()   # non-contiguous
                h = th.recv_async_(out, 0, name=f"u.{i}.{shape}")
                back = th.synchronize(h)
                check(back is out and torch.equal(out, want), f"torch recv_ {dt} {shape}")
    if R == 1:
        check_raises(th.TensorMismatchError,
                     lambda: th.recv_(torch.zeros(3, dtype=torch.int64), 0, name="bad"),
                     "dtype", "rank 0", "rank 1", "p2p.bad")
    else:
        th.send(torch.zeros(3), 1, name="bad")
    finish()
""")


@pytest.mark.timeout(240)
def test_p2p_torch():
    _run(TORCH).assert_ok()


TF = RANK_PRELUDE + textwrap.dedent(r"""
    import tensorflow as tf
    import horovodlike.tensorflow as htf
    htf.init()
    R = htf.rank()
    for i, dt in enumerate([tf.int32, tf.float32, tf.float64, tf.bfloat16, tf.bool]):
        x = tf.cast(tf.reshape(tf.range(12) % 3, (3, 4)), dt)
        if R == 0:
            htf.send(x, 1, name=f"x.{i}")
            htf.send(x, 1, name=f"y.{i}")
        else:
            got = htf.recv(0, name=f"x.{i}")
            check(got.dtype == dt and got.shape == (3, 4) and
                  bool(tf.reduce_all(tf.equal(tf.cast(got, tf.float32), tf.cast(x, tf.float32)))),
                  f"tf recv {dt}")
            v = tf.Variable(tf.zeros((3, 4), dt))
            htf.recv_(v, 0, name=f"y.{i}")
            check(bool(tf.reduce_all(tf.equal(tf.cast(v, tf.float32), tf.cast(x, tf.float32)))),
                  f"tf recv_ {dt}")
    finish()
""")


@pytest.mark.timeout(240)
def test_p2p_tensorflow():
    _run(TF, timeout=220).assert_ok()


STALL = RANK_PRELUDE + textwrap.dedent(r"""
    hvd.init()
    R = hvd.rank()
    if R == 0:
        hvd.send(np.array([1]), 1, name="a")
        # The stall under test: the recv of "b" must wait past the stall check before
        # "b" is sent; 3 check periods cover the periodic check.
        time.sleep(3 * float(os.environ["HOROVOD_STALL_CHECK_TIME_SECONDS"]))
        hvd.send(np.array([2]), 1, name="b")
    else:
        check_equal(hvd.recv(0, name="b"), np.array([2]), "b")
        check_equal(hvd.recv(0, name="a"), np.array([1]), "a")
    finish()
""")


@pytest.mark.timeout(120)
def test_stall_inspector_names_the_waiting_recv_and_what_the_peer_sent():
    res = run_ranks(STALL, np=2, timeout=100, env={"HOROVOD_STALL_CHECK_TIME_SECONDS": "1"})
    res.assert_ok()
    assert "stall: recv 'p2p.b' on rank 1 from rank 0 has waited" in res.stderr, res.stderr[-3000:]
    assert "rank 0 has not sent it (it sent, unmatched: 'p2p.a'" in res.stderr, res.stderr[-3000:]


VICTIM = textwrap.dedent(r"""
    import os, sys, time
    import numpy as np
    import horovodlike as hvd
    hvd.init()
    R = hvd.rank()
    if R == 1:
        hvd.send(np.arange(4.0), 0, name="first")
        print("ready", flush=True)
        time.sleep(300)                     # the test kills or stops this rank here
    else:
        hvd.recv(1, name="first")
        print("ready", flush=True)
        t = time.monotonic()
        try:
            if os.environ["T_WAITS_IN"] == "send":     # more than the socket buffers hold
                hvd.send(np.zeros(64 << 17), 1, name="never")
            else:
                hvd.recv(1, name="never")
            print("no error", flush=True)
        except Exception as e:
            print(f"failed after {time.monotonic() - t:.1f}s: {type(e).__name__}: {e}", flush=True)
""")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["SIGKILL", "SIGSTOP"])
@pytest.mark.parametrize("waits_in", ["recv", "send"])
def test_a_dead_or_stopped_peer_fails_the_waiting_op_naming_it(tmp_path, how, waits_in):
    timeout = 3
    store, procs = _spawn_job(VICTIM, 2, tmp_path, {"HOROVODLIKE_PEER_TIMEOUT_SECONDS": str(timeout),
                                                    "T_WAITS_IN": waits_in})
    try:
        deadline = time.monotonic() + 60
        for p in procs:
            _read_until(p, "ready", deadline)
        os.kill(procs[1].pid, getattr(signal, how))
        out, _ = procs[0].communicate(timeout=60)
        assert "failed after" in out, out
        took = float(out.split("failed after ")[1].split("s:")[0])
        assert "rank 1 (host" in out and "was lost" in out, out
        # a killed peer closes its connections at once; a stopped one is found by the
        # heartbeats within the peer timeout (plus one heartbeat interval)
        assert took < (5 if how == "SIGKILL" else 2 * timeout + 3), out
    finally:
        _cleanup(store, procs)



P2P_STALL_SHUTDOWN = RANK_PRELUDE + textwrap.dedent(r"""
    hvd.init()
    R = hvd.rank()
    t = time.monotonic()
    # Neither rank ever sends "never": the first recv past the shutdown time fails the
    # job, and both ranks end with that one report.
    check_raises(hvd.HorovodInternalError, lambda: hvd.recv(1 - R, name="never"),
                 "stalled: recv 'p2p.never' on rank", "has not sent it",
                 "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", what="stalled recv")
    check(time.monotonic() - t < 20, "p2p stall shutdown came in time")
    finish_alone()
""")


@pytest.mark.timeout(120)
def test_stall_shutdown_fails_every_rank_on_a_stalled_recv():
    res = run_ranks(P2P_STALL_SHUTDOWN, np=2, timeout=90,
                    env={"HOROVOD_STALL_CHECK_TIME_SECONDS": "1",
                         "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "2"})
    assert res.returncode == 0, res.describe()
    assert res.stdout.count("HVDTEST-OK") == 2, res.describe()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("shutdown", [False, True])
def test_stall_inspector_names_a_send_the_peer_does_not_read(tmp_path, shutdown):
    """The peer is stopped while a send larger than the socket buffers is being written:
    the stall inspector warns about the send (and, with a shutdown time shorter than the
    peer timeout, fails it as stalled) before the heartbeats would name the peer."""
    env = {"T_WAITS_IN": "send", "HOROVOD_STALL_CHECK_TIME_SECONDS": "1",
           "HOROVODLIKE_PEER_TIMEOUT_SECONDS": "4" if not shutdown else "60"}
    if shutdown:
        env["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] = "2"
    store, procs = _spawn_job(VICTIM, 2, tmp_path, env)
    try:
        deadline = time.monotonic() + 60
        for p in procs:
            _read_until(p, "ready", deadline)
        os.kill(procs[1].pid, signal.SIGSTOP)
        out, _ = procs[0].communicate(timeout=60)
        assert "stall: send 'p2p.never' on rank 0 to rank 1 has waited" in out, out
        assert "rank 1 is not reading" in out, out
        assert "failed after" in out, out
        if shutdown:
            assert "stalled: send 'p2p.never' on rank 0 to rank 1" in out.split("failed after")[1], out
            assert "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS" in out, out
            assert float(out.split("failed after ")[1].split("s:")[0]) < 15, out
        else:
            assert "rank 1 (host" in out and "was lost" in out, out
    finally:
        os.kill(procs[1].pid, signal.SIGCONT) if procs[1].poll() is None else None
        _cleanup(store, procs)


TIMELINE = RANK_PRELUDE + textwrap.dedent(r"""
    hvd.init()
    R = hvd.rank()
    if R == 0:
        hvd.send(np.zeros(1000, np.float32), 1, name="act")
    else:
        hvd.recv(0, name="act")
    finish()
""")


@pytest.mark.timeout(120)
def test_timeline_shows_send_and_recv_on_both_ranks(tmp_path):
    path = tmp_path / "tl.json"
    res = run_ranks(TIMELINE, np=2, timeout=100, env={"HOROVOD_TIMELINE": str(path)})
    res.assert_ok()
    files = sorted(glob.glob(str(tmp_path / "tl.rank*.json")))
    assert len(files) == 2, os.listdir(tmp_path)
    seen = {}
    for f in files:
        doc = json.load(open(f))
        rank = doc["otherData"]["rank"]
        lanes = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"}
        for e in doc["traceEvents"]:
            if e.get("name") in ("SEND", "RECV"):
                assert lanes[e["tid"]] == "p2p", lanes
                seen[rank] = (e["name"], e["args"])
    assert seen[0] == ("SEND", {"name": "p2p.act", "peer": 1, "bytes": 4000}), seen
    assert seen[1] == ("RECV", {"name": "p2p.act", "peer": 0, "bytes": 4000}), seen


SETS = RANK_PRELUDE + textwrap.dedent(r"""
    hvd.init(process_sets="dynamic")
    R = hvd.rank()
    ends = hvd.add_process_set([0, 2])          # rank 1 (on node a with rank 0) is not in it
    x = np.arange(100_000, dtype=np.float32)
    if R == 0:
        hvd.send(x, 2, name="cross-node", process_set=ends)
        hvd.send(x + 1, 1, name="same-node")
        check_raises(ValueError, lambda: hvd.send(x, 1, name="outside", process_set=ends),
                     "destination rank 1 is not a member")
    elif R == 1:
        check_equal(hvd.recv(0, name="same-node"), x + 1, "same node")
        check_raises(ValueError, lambda: hvd.recv(0, name="outside", process_set=ends),
                     "is not a member")
    else:
        check_equal(hvd.recv(0, name="cross-node", process_set=ends), x, "across nodes, in a set")
    finish()
""")


@pytest.mark.timeout(180)
def test_process_set_membership_and_fake_nodes():
    """Three ranks on two fake nodes (a: ranks 0, 1; b: rank 2): a message within a node,
    one across nodes inside a process set, and a peer outside the set refused."""
    res = _run(SETS, ["-H", "a:2,b:1", "--ssh-command", "sh -c {command}"], np_=3, timeout=160)
    res.assert_ok()
