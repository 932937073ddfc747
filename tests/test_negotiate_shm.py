"""Negotiation in the shared-memory segment (engine/negotiate_shm.c): a one-node job
agrees on repeated (cached) requests without rank 0, and every check of rank 0's
coordinator still holds, because rank 0 takes a name over whenever it is involved.

Each test causes what it checks: repeated ops (counted by each rank's debug line as
its engine stops), more log entries at once than the log holds, a shape that changes on one
rank (before and after the others posted), a rank that stays away (stall warning and
shutdown), a process set beside global ops, a join, and a rank killed or stopped while
the others wait in the segment.
"""
import glob
import os
import re
import signal
import textwrap
import time

import pytest

from harness import RANK_PRELUDE, run_ranks
from test_failures import HOST, _cleanup, _read_until, _spawn_job

AGREED = re.compile(r"rank (\d+) agreed on (\d+) tensors in shared memory and executed (\d+) "
                    r"responses planned by rank 0; waiting callers executed (\d+) log entries")


BARRIERS = re.compile(r"rank (\d+)'s shared-memory barriers: (\d+) waits, ([\d.]+) us each on average; "
                      r"(\d+) slept, woken ([\d.]+) us after the release")


TWO_SHOTS = re.compile(r"rank (\d+)'s two-shot allreduces: (\d+), on average ([\d.]+) us copying in, "
                       r"([\d.]+) us reducing, ([\d.]+) us copying out")


def agreed_counts(stderr):
    """{rank: (tensors agreed in the segment, responses planned by rank 0)}"""
    return {int(m[1]): (int(m[2]), int(m[3])) for m in AGREED.finditer(stderr)}


def caller_counts(stderr):
    """{rank: log entries executed by a waiting caller rather than the engine's thread}"""
    return {int(m[1]): int(m[4]) for m in AGREED.finditer(stderr)}


REPEATED = RANK_PRELUDE + textwrap.dedent("""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    iters = int(os.environ["ITERS"])
    x = np.arange(1000, dtype=np.float32) + r
    exp = sum(np.arange(1000, dtype=np.float32) + q for q in range(n))
    for i in range(iters):                       # more entries than the log's ring holds
        out = hvd.allreduce(x, op=hvd.Sum, name="a")
        if i % 500 == 0:
            check_equal(out, exp, f"sum {i}")
    fused = int(os.environ.get("FUSED", "40"))
    for it in range(4):                          # fused: FUSED tensors announced together
        hs = [hvd.allreduce_async(np.full(33, float(r + k), np.float32), op=hvd.Average, name=f"g{k}")
              for k in range(fused)]
        for k, h in enumerate(hs):
            check_close(hvd.synchronize(h), np.full(33, (n - 1) / 2 + k, np.float32), f"avg {it}.{k}",
                        rtol=1e-6, atol=1e-6)
        rows = hvd.allgather(np.full((r + 1, 2), r, np.int64), name="ag")
        check_equal(rows, np.concatenate([np.full((q + 1, 2), q, np.int64) for q in range(n)]), f"ag {it}")
        check_equal(hvd.broadcast(np.full(5, r), root_rank=n - 1, name="b"), np.full(5, n - 1), f"bc {it}")
    big = hvd.allreduce(np.full(1 << 18, float(r), np.float32), op=hvd.Sum, name="big")   # two-shot
    check_equal(big, np.full(1 << 18, float(sum(range(n))), np.float32), "big")
    finish()
""")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("np_,negotiate,launcher_args", [
    (2, "1", []), (3, "1", []), (2, "0", []),
    (3, "1", ["-H", "a:2,b:1", "--ssh-command", "sh -c {command}"]),     # two fake nodes
], ids=["2-ranks", "3-ranks", "switched-off", "two-fake-nodes"])
def test_repeated_requests_are_agreed_in_the_segment(np_, negotiate, launcher_args):
    iters = 4500 if np_ == 2 else 600
    res = run_ranks(REPEATED, np=np_, launcher_args=launcher_args, timeout=280,
                    env={"HOROVOD_LOG_LEVEL": "debug", "ITERS": str(iters),
                         "HOROVODLIKE_SHM_NEGOTIATE": negotiate})
    res.assert_ok()
    if not launcher_args:
        # Every rank counts its barriers (one per small allreduce), as its engine stops.
        barriers = {int(m[1]): (int(m[2]), int(m[4])) for m in BARRIERS.finditer(res.stderr)}
        assert sorted(barriers) == list(range(np_)), res.stderr[-3000:]
        assert all(w >= iters and 0 <= slept <= w for w, slept in barriers.values()), barriers
        work = {int(m[1]): [float(v) for v in m.groups()[2:]] for m in TWO_SHOTS.finditer(res.stderr)}
        assert sorted(work) == list(range(np_)) and all(
            int(m[2]) >= 1 for m in TWO_SHOTS.finditer(res.stderr)), res.stderr[-3000:]
        assert all(all(t > 0 for t in ts) for ts in work.values()), work
    counts = agreed_counts(res.stderr)
    if negotiate == "0" or launcher_args:
        assert counts == {}, res.stderr[-3000:]      # the path exists only on one node
        return
    assert sorted(counts) == list(range(np_)), res.stderr[-3000:]
    for rank, (fast, planned) in counts.items():
        # everything after each name's first round: the loop, 3 x 40 fused, ag, b
        # (a rank more than a second late has its ids taken over by rank 0: some slack)
        assert fast >= 0.9 * (iters - 1 + 3 * 40 + 6), (rank, fast, planned)
        assert planned < 60, (rank, fast, planned)
    # Blocking ops do not wake the engine's thread: the waiting caller starts them, and
    # executes what the log holds while it waits (hvdl__drive). How many depends on the
    # scheduling; that callers execute entries at all does not.
    assert all(n > 0 for n in caller_counts(res.stderr).values()), res.stderr[-3000:]


OVERFLOW = RANK_PRELUDE + textwrap.dedent("""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    N = 4500                  # ids past 4096 go through rank 0, one response each
    def enqueue():
        return [hvd.allreduce_async(np.full(3, r + k, np.float32 if k % 2 else np.float64),
                                    op=hvd.Sum, name=f"t{k}") for k in range(N)]
    def check_all(hs, tag):
        for k, h in enumerate(hs):
            out = hvd.synchronize(h)
            if out[0] != sum(q + k for q in range(n)):
                fail(f"{tag} t{k}", str(out))
    check_all(enqueue(), "first")      # through rank 0: every name gets its cache id
    # Rank 1 posts everything first. Rank 0 holds a gate in flight (rank 1 joins it
    # only once rank 0 has enqueued all N), so its loop is never idle and announces all
    # N in one cycle: it completes 4095 ids at once and then plans 404 responses, more
    # entries than the log holds.
    if r == 1:
        hs = enqueue()
        arrive("rank1-enqueued")
        wait_for("rank0-enqueued")
        gate = hvd.allreduce_async(np.ones(1), op=hvd.Sum, name="gate")
    else:
        wait_for("rank1-enqueued")
        gate = hvd.allreduce_async(np.ones(1), op=hvd.Sum, name="gate")
        hs = enqueue()
        arrive("rank0-enqueued")
    check_all(hs, "second")
    check_equal(hvd.synchronize(gate), np.full(1, float(n)), "gate")
    finish()
""")


@pytest.mark.timeout(240)
def test_more_entries_at_once_than_the_log_holds():
    """Rank 0 completes 4095 entries in one announcement and then plans 404 responses:
    more than the log's 4096 slots while the other rank has executed almost none. The
    entries past the ring wait (never blocking rank 0) and go in as room appears.
    (Checked by hand: the waiting entries are there in this run.)"""
    res = run_ranks(OVERFLOW, np=2, timeout=220,
                    env={"HOROVOD_LOG_LEVEL": "debug", "HOROVOD_CACHE_CAPACITY": "5000",
                         "HOROVOD_FUSION_THRESHOLD": "0", "HOROVOD_CYCLE_TIME": "1000"})
    res.assert_ok()
    counts = agreed_counts(res.stderr)
    assert counts[0][0] >= 4095 and counts[1][0] >= 4095, counts


MISMATCH = RANK_PRELUDE + textwrap.dedent("""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    last = n - 1
    for i in range(3):                                   # cached, agreed in the segment
        check_equal(hvd.allreduce(np.ones(4), op=hvd.Sum, name="a"), np.full(4, float(n)), f"warm {i}")
    for late in (last, 0):
        # The changed request reaches rank 0 after the others posted theirs (late = last)
        # or before (late = 0: the last rank changes it at once, the others wait).
        if r != last and late == 0:
            time.sleep(1)
        if r == last and late == last:
            time.sleep(1)
        shape = 5 if r == last else 4
        check_raises(hvd.TensorMismatchError,
                     lambda: hvd.allreduce(np.ones(shape), op=hvd.Sum, name="a"),
                     "allreduce.a", "shape", "rank 0 has [4]", f"rank {last} has [5]",
                     what=f"changed on rank {last}, late {late}")
        for i in range(3):                               # and the engine goes on
            check_equal(hvd.allreduce(np.ones(4), op=hvd.Sum, name="a"), np.full(4, float(n)),
                        f"after {late}.{i}")
    for i in range(3):                                   # every rank changes it: a new entry
        check_equal(hvd.allreduce(np.ones(6), op=hvd.Sum, name="a"), np.full(6, float(n)), f"six {i}")
    check_raises(hvd.TensorMismatchError,                # rank 0 changes the dtype
                 lambda: hvd.allreduce(np.ones(6, np.float32 if r == 0 else np.float64),
                                       op=hvd.Sum, name="a"),
                 "dtype", "float32", "float64", what="dtype on rank 0")
    check_equal(hvd.allreduce(np.ones(6), op=hvd.Sum, name="a"), np.full(6, float(n)), "last")
    finish()
""")


@pytest.mark.timeout(150)
def test_a_changed_request_is_named_and_the_engine_goes_on():
    res = run_ranks(MISMATCH, np=3, timeout=130, env={"HOROVOD_LOG_LEVEL": "debug"})
    res.assert_ok()
    assert all(fast >= 9 for fast, _ in agreed_counts(res.stderr).values()), res.stderr[-3000:]


STALL = RANK_PRELUDE + textwrap.dedent("""
    hvd.init()
    r = hvd.rank()
    for i in range(3):
        hvd.allreduce(np.ones(4), op=hvd.Sum, name="late")
    if r == 1:
        # The stall under test: away for 5 check periods while the others have posted
        # "late" in the segment (the warning comes after one or two).
        time.sleep(5 * float(os.environ["HOROVOD_STALL_CHECK_TIME_SECONDS"]))
    check_equal(hvd.allreduce(np.ones(4), op=hvd.Sum, name="late"), np.full(4, float(hvd.size())), "late")
    finish()
""")


@pytest.mark.timeout(120)
def test_stall_warning_names_a_rank_missing_from_the_segment():
    res = run_ranks(STALL, np=3, timeout=100,
                    env={"HOROVOD_STALL_CHECK_TIME_SECONDS": "1", "HOROVOD_LOG_LEVEL": "debug"})
    res.assert_ok()
    warn = [ln for ln in res.stderr.splitlines() if "stall:" in ln]
    assert warn and "allreduce.late" in warn[0] and "ranks [1]" in warn[0], res.stderr[-3000:]


STALL_SHUTDOWN = RANK_PRELUDE + textwrap.dedent("""
    hvd.init()
    for i in range(3):
        hvd.allreduce(np.ones(2), name="x")
    if hvd.rank() == 2:
        wait_for("stalled.0", "stalled.1")   # never submits: the stall shutdown ends the job
        sys.exit(0)
    check_raises(hvd.HorovodInternalError, lambda: hvd.allreduce(np.ones(2), name="x"),
                 "stalled", "allreduce.x", "ranks [2]", what="stalled op")
    arrive(f"stalled.{hvd.rank()}")
    finish_alone()
""")


@pytest.mark.timeout(120)
def test_stall_shutdown_names_a_rank_missing_from_the_segment():
    res = run_ranks(STALL_SHUTDOWN, np=3, timeout=100,
                    env={"HOROVOD_STALL_CHECK_TIME_SECONDS": "1",
                         "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "3"})
    assert res.stdout.count("HVDTEST-OK") == 2, res.describe()


SETS_AND_JOIN = RANK_PRELUDE + textwrap.dedent("""
    hvd.init(process_sets="dynamic")
    r, n = hvd.rank(), hvd.size()
    pair = hvd.add_process_set([0, 1])        # through rank 0, between the segment's entries
    for i in range(20):
        hg = hvd.allreduce_async(np.full(7, r + i, np.float32), op=hvd.Sum, name="g")
        if r in (0, 1):
            check_equal(hvd.allreduce(np.full(3, r * i, np.float32), op=hvd.Sum, name="p",
                                      process_set=pair), np.full(3, float(i), np.float32), f"pair {i}")
        hh = hvd.allreduce_async(np.full(2, 1.0), op=hvd.Sum, name="h")
        check_equal(hvd.synchronize(hg), np.full(7, float(sum(q + i for q in range(n))), np.float32), f"g {i}")
        check_equal(hvd.synchronize(hh), np.full(2, float(n)), f"h {i}")
    # a join: rank 1 leaves early; the cached "g" must now go through rank 0 (zeros for 1)
    if r == 1:
        hvd.join()
    else:
        for i in range(5):
            check_equal(hvd.allreduce(np.full(7, 1.0, np.float32), op=hvd.Sum, name="g"),
                        np.full(7, float(n - 1), np.float32), f"joined {i}")
        time.sleep(0.5)
        hvd.join()
    for i in range(5):                        # after the join: the segment again
        check_equal(hvd.allreduce(np.full(7, 1.0, np.float32), op=hvd.Sum, name="g"),
                    np.full(7, float(n), np.float32), f"after join {i}")
    finish()
""")


@pytest.mark.timeout(150)
def test_process_sets_and_join_beside_the_segment():
    # No stall check: the join alone must hand the joined rank's ids to rank 0 (the
    # stall scan would otherwise take them over, a minute later).
    res = run_ranks(SETS_AND_JOIN, np=3, timeout=130,
                    env={"HOROVOD_LOG_LEVEL": "debug", "HOROVOD_STALL_CHECK_DISABLE": "1"})
    res.assert_ok()
    counts = agreed_counts(res.stderr)
    assert all(fast >= 30 for fast, _ in counts.values()), counts


BARRIERS_LOOP = RANK_PRELUDE + textwrap.dedent("""
    hvd.init(process_sets="dynamic")
    r, n = hvd.rank(), hvd.size()
    evens = hvd.add_process_set([q for q in range(n) if q % 2 == 0])
    for i in range(300):
        late = i % 100 == 50                     # from the segment: the first is rank 0's
        if r == 0 and late:
            time.sleep(0.3)
        t = time.monotonic()
        hvd.barrier()
        waited = time.monotonic() - t
        if r != 0 and late and waited < 0.2:
            fail(f"barrier {i}", f"passed after {waited:.3f} s, before rank 0 arrived")
        if r in evens.ranks:
            hvd.barrier(process_set=evens)
        s = hvd.allreduce(np.full(1, float(i)), op=hvd.Sum, name="s")
        check_equal(s, np.full(1, float(i * n)), f"allreduce after barrier {i}")
    finish()
""")


@pytest.mark.timeout(150)
def test_repeated_barriers_are_agreed_in_the_segment():
    # An eager barrier has one name, as in Horovod, so after the first one every
    # barrier (and every barrier of a process set) is a cached request.
    res = run_ranks(BARRIERS_LOOP, np=3, timeout=130, env={"HOROVOD_LOG_LEVEL": "debug"})
    res.assert_ok()
    counts = agreed_counts(res.stderr)
    assert sorted(counts) == [0, 1, 2], res.stderr[-3000:]
    # 300 barriers + 300 allreduces; the set's barriers go through rank 0 (a set is
    # not the segment's), so the even ranks' planned counts hold those 300.
    for rank, (fast, planned) in counts.items():
        assert fast >= 590, (rank, fast, planned)
        assert planned <= (310 if rank % 2 == 0 else 10), (rank, fast, planned)


WAITER = textwrap.dedent("""
    import os, signal, sys, time
    import numpy as np
    import horovodlike as hvd
    hvd.init()
    r = hvd.rank()
    for i in range(5):
        hvd.allreduce(np.ones(4), name="k")
    print(f"ready {r}", flush=True)
    if r == 2:
        time.sleep(1)                        # the others post "k" and wait in the segment
        os.kill(os.getpid(), getattr(signal, os.environ["HOW"]))
    t = time.monotonic()
    try:
        hvd.allreduce(np.ones(4), name="k")
        print(f"finished {r}", flush=True)
    except hvd.HorovodInternalError as e:
        print(f"lost {r} after {time.monotonic() - t:.1f}s: {e}", flush=True)
""")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["SIGKILL", "SIGSTOP"])
def test_a_rank_lost_while_others_wait_in_the_segment_is_named(tmp_path, how):
    store, procs = _spawn_job(WAITER, 3, tmp_path,
                              extra_env={"HOW": how, "HOROVODLIKE_PEER_TIMEOUT_SECONDS": "4"})
    try:
        deadline = time.monotonic() + 60
        for p in procs:
            _read_until(p, "ready", deadline)
        for r in (0, 1):
            out = "".join(_read_until(procs[r], f"lost {r}", time.monotonic() + 40))
            assert f"rank 2 (host {HOST})" in out, out
            assert float(re.search(r"after ([\d.]+)s", out)[1]) < 20, out
    finally:
        if how == "SIGSTOP" and procs[2].poll() is None:
            os.kill(procs[2].pid, signal.SIGCONT)
        _cleanup(store, procs)
    assert not glob.glob("/dev/shm/hvdl-*")


BARRIER_THEN_SHUTDOWN = RANK_PRELUDE + textwrap.dedent("""
    import signal, subprocess
    hvd.init()
    r = hvd.rank()
    hvd.allreduce(np.ones(1), name="sync")
    if r == 2:
        # Stopped (whole process) just after its barrier request left, until the others
        # have finished the barrier and shut down: the barrier's response and rank 0's
        # goodbye then wait in its socket together.
        stopper = subprocess.Popen(
            [sys.executable, "-c", "import os, sys, time, signal; p = int(sys.argv[1]); "
             "sys.stdin.read(1); time.sleep(0.05); os.kill(p, signal.SIGSTOP); time.sleep(1.5); "
             "os.kill(p, signal.SIGCONT)", str(os.getpid())], stdin=subprocess.PIPE, text=True)
        stopper.stdin.write("x")
        stopper.stdin.flush()
    else:
        time.sleep(0.4)
    try:
        hvd.barrier()
    except Exception as e:
        fail("barrier", repr(e))
    hvd.shutdown()
    if r == 2:
        stopper.wait()
    finish_alone()
""")


@pytest.mark.timeout(120)
def test_an_op_finished_on_rank_0_before_a_shutdown_finishes_everywhere():
    """A barrier's entry needs no peer, so rank 0 finishes it and shuts down while a
    stopped rank has not even read its response. That rank must still finish it: rank
    0's goodbye says how far rank 0 executed the log."""
    res = run_ranks(BARRIER_THEN_SHUTDOWN, np=3, timeout=100)
    assert res.returncode == 0 and res.stdout.count("HVDTEST-OK") == 3, res.describe()
