"""Hierarchical negotiation (engine/negotiate_nodes.c): on several nodes, a node's ranks
agree on their cached requests in their segment, and the rank that completes a node's
word tells rank 0 for all of them in one frame.

The nodes are fake (-H a:2,b:2 with a local "ssh"): two host names, two segments, one
machine. Each test causes what it checks: repeated ops (counted by each rank's debug
line), a shape changed on one rank of either node, a rank that stays away (stall
warning and shutdown, naming exactly that rank), a join, a node of one rank beside
nodes of two, and a node's leader killed while the others wait in their segments.
"""
import glob
import re
import textwrap
import time

import pytest

from harness import RANK_PRELUDE, run_ranks
from test_failures import _cleanup, _read_until, _spawn_job
from test_negotiate_shm import REPEATED

NODES = ["-H", "a:2,b:2", "--ssh-command", "sh -c {command}"]
LINE = re.compile(r"rank (\d+) completed its node's agreement on (\d+) tensors in (\d+) announcements; "
                  r"rank 0 recorded (\d+) node agreements and took (\d+) words over")


def counts(stderr):
    """{rank: (tensors it completed for its node, node agreements recorded, words taken over)}"""
    return {int(m[1]): (int(m[2]), int(m[4]), int(m[5])) for m in LINE.finditer(stderr)}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("np_,hosts,negotiate", [
    (4, "a:2,b:2", "1"), (5, "a:2,b:1,c:2", "1"), (4, "a:2,b:2", "0"),
], ids=["two-nodes", "a-node-of-one", "switched-off"])
def test_repeated_requests_are_agreed_per_node(np_, hosts, negotiate):
    iters = 400
    res = run_ranks(REPEATED, np=np_, timeout=280,
                    launcher_args=["-H", hosts, "--ssh-command", "sh -c {command}"],
                    env={"HOROVOD_LOG_LEVEL": "debug", "ITERS": str(iters), "FUSED": "20",
                         "HOROVODLIKE_SHM_NEGOTIATE": negotiate})
    res.assert_ok()
    c = counts(res.stderr)
    if negotiate == "0":
        assert c == {}, res.stderr[-3000:]
        return
    assert sorted(c) == list(range(np_)), res.stderr[-3000:]
    rounds = iters - 1 + 3 * 20 + 6              # every round after each name's first
    nodes_with_words = 2
    # every node with a segment completes every round once (some slack: a rank more
    # than a second late has a word taken over), and rank 0 records each of them
    assert sum(done for done, _, _ in c.values()) >= 0.9 * rounds * nodes_with_words, c
    assert c[0][1] >= 0.9 * rounds * nodes_with_words, c
    assert c[0][2] < 0.05 * rounds, c               # takeovers are rare, not the rule
    if np_ == 5:
        assert c[2][0] == 0, c                      # alone on its node: its own frames


MISMATCH = RANK_PRELUDE + textwrap.dedent("""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    odd = int(os.environ["ODD"])                          # the rank whose request changes
    for i in range(3):                                   # cached, agreed in the segments
        check_equal(hvd.allreduce(np.ones(4), op=hvd.Sum, name="a"), np.full(4, float(n)), f"warm {i}")
    for late in (True, False):
        # The changed request reaches rank 0 after its node mates posted theirs (late)
        # or before (the others wait a second).
        if (r == odd) == late:
            time.sleep(1)
        shape = 5 if r == odd else 4
        check_raises(hvd.TensorMismatchError,
                     lambda: hvd.allreduce(np.ones(shape), op=hvd.Sum, name="a"),
                     "allreduce.a", "shape", "has [4]", f"rank {odd} has [5]",
                     what=f"changed on rank {odd}, late {late}")
        for i in range(3):                               # and the engine goes on
            check_equal(hvd.allreduce(np.ones(4), op=hvd.Sum, name="a"), np.full(4, float(n)),
                        f"after {late}.{i}")
    finish()
""")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("odd", [1, 3], ids=["on-rank-0s-node", "on-the-other-node"])
def test_a_changed_request_is_named_at_once_and_the_engine_goes_on(odd):
    # The stall check is off: only taking the word over can bring the posted bits to
    # rank 0, and the mismatch is named without waiting for anything.
    res = run_ranks(MISMATCH, np=4, launcher_args=NODES, timeout=130,
                    env={"HOROVOD_LOG_LEVEL": "debug", "ODD": str(odd), "HOROVOD_STALL_CHECK_DISABLE": "1"})
    res.assert_ok()
    assert counts(res.stderr)[0][2] >= 2, res.stderr[-3000:]


STALL = RANK_PRELUDE + textwrap.dedent("""
    hvd.init()
    r, late = hvd.rank(), [int(q) for q in os.environ["LATE"].split(",")]
    for i in range(3):
        hvd.allreduce(np.ones(4), op=hvd.Sum, name="late")
    if r in late:
        # The stall under test: away for 3 check periods while its node mate has posted
        # "late" in the segment (the warning comes after one or two).
        time.sleep(3 * float(os.environ["HOROVOD_STALL_CHECK_TIME_SECONDS"]))
    check_equal(hvd.allreduce(np.ones(4), op=hvd.Sum, name="late"), np.full(4, float(hvd.size())), "late")
    finish()
""")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("late", ["1", "3", "1, 3"], ids=["on-rank-0s-node", "on-the-other-node", "on-both"])
def test_stall_warning_names_exactly_the_missing_rank(late):
    # "on-both": no node completes, so rank 0 knows of nothing: each node's leader
    # reports what its word holds
    res = run_ranks(STALL, np=4, launcher_args=NODES, timeout=100,
                    env={"HOROVOD_STALL_CHECK_TIME_SECONDS": "2", "LATE": late.replace(" ", "")})
    res.assert_ok()
    warn = [ln for ln in res.stderr.splitlines() if "stall:" in ln]
    assert warn and "allreduce.late" in warn[0] and f"ranks [{late}]" in warn[0], res.stderr[-3000:]


STALL_SHUTDOWN = RANK_PRELUDE + textwrap.dedent("""
    hvd.init()
    for i in range(3):
        hvd.allreduce(np.ones(2), name="x")
    if hvd.rank() == 3:
        wait_for("stalled.0", "stalled.1", "stalled.2")   # never submits: the stall
        sys.exit(0)                                        # shutdown ends the job
    check_raises(hvd.HorovodInternalError, lambda: hvd.allreduce(np.ones(2), name="x"),
                 "stalled", "allreduce.x", "ranks [3]", what="stalled op")
    arrive(f"stalled.{hvd.rank()}")
    finish_alone()
""")


@pytest.mark.timeout(120)
def test_stall_shutdown_names_a_rank_missing_from_another_nodes_segment():
    res = run_ranks(STALL_SHUTDOWN, np=4, launcher_args=NODES, timeout=100,
                    env={"HOROVOD_STALL_CHECK_TIME_SECONDS": "1",
                         "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "4"})
    assert res.stdout.count("HVDTEST-OK") == 3, res.describe()


JOIN = RANK_PRELUDE + textwrap.dedent("""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    early = int(os.environ["EARLY"])
    for i in range(10):
        check_equal(hvd.allreduce(np.full(7, 1.0, np.float32), op=hvd.Sum, name="g"),
                    np.full(7, float(n), np.float32), f"before {i}")
    # the early rank leaves: "g" must go through rank 0 (zeros for it) until all join
    if r == early:
        hvd.join()
    else:
        for i in range(5):
            check_equal(hvd.allreduce(np.full(7, 1.0, np.float32), op=hvd.Sum, name="g"),
                        np.full(7, float(n - 1), np.float32), f"joined {i}")
        time.sleep(0.5)
        hvd.join()
    for i in range(10):                       # after the join: the segments again
        check_equal(hvd.allreduce(np.full(7, 1.0, np.float32), op=hvd.Sum, name="g"),
                    np.full(7, float(n), np.float32), f"after join {i}")
    finish()
""")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("early", [1, 2], ids=["on-rank-0s-node", "a-leader-on-the-other-node"])
def test_a_join_takes_every_word_over_until_it_ends(early):
    # No stall check: the join alone must hand the joined rank's ids to rank 0.
    res = run_ranks(JOIN, np=4, launcher_args=NODES, timeout=130,
                    env={"HOROVOD_LOG_LEVEL": "debug", "EARLY": str(early), "HOROVOD_STALL_CHECK_DISABLE": "1"})
    res.assert_ok()
    c = counts(res.stderr)
    assert c[0][1] >= 2 * 15, c               # before and after the join, in the segments


POSTED_THEN_JOIN = RANK_PRELUDE + textwrap.dedent("""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    for i in range(5):
        check_equal(hvd.broadcast(np.full(3, float(r)), root_rank=1, name="b"), np.full(3, 1.0), f"before {i}")
    if r == 2:
        # posts "b" in its node's word, then joins without waiting: its request counts
        # as submitted, ahead of its join (as joined, only an allreduce could run)
        h = hvd.broadcast_async(np.full(3, float(r)), root_rank=1, name="b")
        hvd.join()
        check_equal(hvd.synchronize(h), np.full(3, 1.0), "posted then joined")
    else:
        time.sleep(0.5)
        check_equal(hvd.broadcast(np.full(3, float(r)), root_rank=1, name="b"), np.full(3, 1.0), "with 2's")
        hvd.join()
    for i in range(5):
        check_equal(hvd.broadcast(np.full(3, float(r)), root_rank=1, name="b"), np.full(3, 1.0), f"after {i}")
    finish()
""")


@pytest.mark.timeout(150)
def test_a_request_posted_before_a_join_counts_as_submitted():
    res = run_ranks(POSTED_THEN_JOIN, np=4, launcher_args=NODES, timeout=130,
                    env={"HOROVOD_STALL_CHECK_DISABLE": "1"})
    res.assert_ok()


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
        time.sleep(1)                        # the others post "k" and wait
        os.kill(os.getpid(), signal.SIGKILL)
    t = time.monotonic()
    try:
        hvd.allreduce(np.ones(4), name="k")
        print(f"finished {r}", flush=True)
    except hvd.HorovodInternalError as e:
        print(f"lost {r} after {time.monotonic() - t:.1f}s: {e}", flush=True)
""")


@pytest.mark.timeout(120)
def test_a_node_leader_killed_while_the_others_wait_is_named(tmp_path):
    store, procs = _spawn_job(WAITER, 4, tmp_path, hosts=["a", "a", "b", "b"],
                              extra_env={"HOROVODLIKE_PEER_TIMEOUT_SECONDS": "4"})
    try:
        deadline = time.monotonic() + 60
        for p in procs:
            _read_until(p, "ready", deadline)
        for r in (0, 1, 3):
            out = "".join(_read_until(procs[r], f"lost {r}", time.monotonic() + 40))
            assert "rank 2 (host b)" in out, out
            assert float(re.search(r"after ([\d.]+)s", out)[1]) < 20, out
    finally:
        _cleanup(store, procs)
    assert not glob.glob("/dev/shm/hvdl-*")
