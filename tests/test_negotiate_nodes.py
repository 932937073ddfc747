"""Hierarchical negotiation (engine/control/segment/negotiate_nodes.c): on several nodes, a node's ranks
agree on their cached requests in their segment, and the rank that completes a node's
word tells rank 0 for all of them in one frame.

The nodes are fake (-H a:2,b:2 with a local "ssh"): two host names, two segments, one
machine. Each test causes what it checks: repeated ops (counted by each rank's debug
line), a shape changed on one rank of either node, a rank that stays away (stall
warning and shutdown, naming exactly that rank), a join, a node of one rank beside
nodes of two, and a node's leader killed while the others wait in their segments.
"""
import re
import time

import pytest

from harness import leaked_segments, rank_program, run_ranks
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


MISMATCH = rank_program("negotiate_nodes_mismatch")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("odd", [1, 3], ids=["on-rank-0s-node", "on-the-other-node"])
def test_a_changed_request_is_named_at_once_and_the_engine_goes_on(odd):
    # The stall check is off: only taking the word over can bring the posted bits to
    # rank 0, and the mismatch is named without waiting for anything.
    res = run_ranks(MISMATCH, np=4, launcher_args=NODES, timeout=130,
                    env={"HOROVOD_LOG_LEVEL": "debug", "ODD": str(odd), "HOROVOD_STALL_CHECK_DISABLE": "1"})
    res.assert_ok()
    assert counts(res.stderr)[0][2] >= 2, res.stderr[-3000:]


STALL = rank_program("negotiate_nodes_stall")


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


STALL_SHUTDOWN = rank_program("negotiate_stall_shutdown")


@pytest.mark.timeout(120)
def test_stall_shutdown_names_a_rank_missing_from_another_nodes_segment():
    res = run_ranks(STALL_SHUTDOWN, np=4, launcher_args=NODES, timeout=100,
                    env={"HOROVOD_STALL_CHECK_TIME_SECONDS": "1",
                         "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "4"})
    assert res.stdout.count("HVDTEST-OK") == 3, res.describe()


JOIN = rank_program("negotiate_nodes_join")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("early", [1, 2], ids=["on-rank-0s-node", "a-leader-on-the-other-node"])
def test_a_join_takes_every_word_over_until_it_ends(early):
    # No stall check: the join alone must hand the joined rank's ids to rank 0.
    res = run_ranks(JOIN, np=4, launcher_args=NODES, timeout=130,
                    env={"HOROVOD_LOG_LEVEL": "debug", "EARLY": str(early), "HOROVOD_STALL_CHECK_DISABLE": "1"})
    res.assert_ok()
    c = counts(res.stderr)
    assert c[0][1] >= 2 * 15, c               # before and after the join, in the segments


POSTED_THEN_JOIN = rank_program("negotiate_nodes_posted_then_join")


@pytest.mark.timeout(150)
def test_a_request_posted_before_a_join_counts_as_submitted():
    res = run_ranks(POSTED_THEN_JOIN, np=4, launcher_args=NODES, timeout=130,
                    env={"HOROVOD_STALL_CHECK_DISABLE": "1"})
    res.assert_ok()


WAITER = rank_program("negotiate_waiter")



@pytest.mark.timeout(120)
def test_a_node_leader_killed_while_the_others_wait_is_named(tmp_path):
    store, procs = _spawn_job(WAITER, 4, tmp_path, hosts=["a", "a", "b", "b"],
                              extra_env={"HOW": "SIGKILL", "HOROVODLIKE_PEER_TIMEOUT_SECONDS": "4"})
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
    assert not leaked_segments()
