"""Misuse that used to hang forever now ends in an error that says what happened:
a fork after init(), ops that can never match (a deadlock), a rank that leaves while
others wait on its ops. Each case runs real ranks under horovodlikerun (or one plain
python process) with a timeout far below the 60 s of a stall warning, so a hang fails
the test instead of passing it late.
"""
import importlib.util
import os

import pytest

from harness import rank_program, requires_mpirun, run_ranks

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(120)

FORK = rank_program("misuse_hangs_fork")


def test_fork_after_init_raises_in_the_child_and_init_there_works():
    run_ranks(FORK, 1, "python", timeout=60).assert_ok()


# Ops that never match. Each rank records what its op raised and how long it took; the
# job must end within DEADLINE s (the stall warning would come after 60 s).
DEADLINE = 12.0

DEADLOCK = rank_program("misuse_hangs_deadlock")

EXPECTED = {
    "names": ["deadlock: rank 0 waits in allreduce 'a' while rank 1 waits in allreduce 'b'"],
    "kinds": ["rank 0 waits in allreduce 'k' while rank 1 waits in allgather 'k'",
              "'k' is an allreduce on rank 0 and an allgather on rank 1"],
    "skipped": ["rank 0 waits in allreduce 'a' while rank 1 waits in allreduce 'b'"],
    "set": ["rank 0 waits in allreduce 'a' in process set 1, rank 1 waits in allreduce 'b' in process set 1, rank 2 waits in barrier;"],
}


@pytest.mark.parametrize("case,warm,np_", [("names", "fresh", 2), ("names", "cached", 2),
                                           ("kinds", "fresh", 2), ("skipped", "cached", 2),
                                           ("set", "fresh", 3)])
def test_ops_that_never_match_end_the_job_within_seconds(case, warm, np_):
    res = run_ranks(DEADLOCK, np_, "horovodlikerun", args=(case, warm, DEADLINE, *EXPECTED[case]),
                    timeout=60)
    res.assert_ok()
    # Each rank's engine says it once (rank 0, which finds it, as often as the others).
    for r in range(np_):
        said = [line for line in res.stderr.splitlines()
                if line.startswith(f"[{r}]<stderr>:[horovodlike rank {r}] ERROR: deadlock:")]
        assert len(said) == 1, (r, said, res.describe())


BUSY = rank_program("misuse_hangs_busy")


def test_a_rank_busy_elsewhere_is_not_a_deadlock():
    run_ranks(BUSY, 2, "horovodlikerun", timeout=60).assert_ok()


STALL = rank_program("misuse_hangs_stall")


def test_stall_shutdown_time_ends_a_stall_as_in_horovod():
    # Horovod's own test_stall.py settings: warn after 2 s, shut down after 3 s
    env = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "2", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "3"}
    run_ranks(STALL, 2, "horovodlikerun", env=env, timeout=60).assert_ok()


LEAVES = rank_program("misuse_hangs_leaves")


@pytest.mark.parametrize("how,expect", [
    ("shutdown", ["rank 1 called shutdown() without submitting allreduce 'x'"]),
    ("exit", ["rank 1 (host", "was lost", "It never submitted allreduce 'x'"])])
def test_a_rank_that_leaves_is_named_with_the_ops_it_never_submitted(how, expect):
    res = run_ranks(LEAVES, 2, "horovodlikerun", args=(how, *expect), timeout=60)
    # rank 0 checked the message (rank 1 is gone, so the job's own status says little)
    assert "[0]<stdout>:HVDTEST-OK" in res.stdout, res.describe()


# A rank is blocked only when every thread that uses its engine waits: one thread
# waiting while another computes (here 5 s, past the 4 s in which a deadlock is found)
# is a correct program, under either launcher. The 30 s case is the audit's longer one.
BUSY_THREAD = rank_program("deadlock_busy_thread")


@pytest.mark.parametrize("launcher,seconds", [
    ("horovodlikerun", 5),
    pytest.param("mpirun", 5, marks=requires_mpirun),
    pytest.param("horovodlikerun", 30, marks=pytest.mark.skipif(
        not os.environ.get("HVDTEST_LONG"), reason="30 s of compute: set HVDTEST_LONG=1"))])
def test_a_thread_computing_while_another_waits_is_not_a_deadlock(launcher, seconds):
    run_ranks(BUSY_THREAD, 2, launcher, args=(seconds,), timeout=40 + seconds).assert_ok()


# Sends and recvs take part: a cycle through one is found as fast as a collective one
# (DEADLINE), naming both halves.
P2P = rank_program("deadlock_p2p")

P2P_EXPECTED = {
    "recv_allreduce": ["deadlock: rank 0 waits in recv 'x' from rank 1 while rank 1 waits "
                       "in allreduce 'y'"],
    "recv_recv": ["deadlock: rank 0 waits in recv 'a' from rank 1 while rank 1 waits in "
                  "recv 'b' from rank 0"],
    "send_send": ["deadlock: rank 0 waits in send 'a' to rank 1 while rank 1 waits in "
                  "send 'b' to rank 0"],
}


@pytest.mark.parametrize("case", sorted(P2P_EXPECTED))
def test_point_to_point_cycles_end_the_job_within_seconds(case):
    res = run_ranks(P2P, 2, "horovodlikerun", args=(case, DEADLINE, *P2P_EXPECTED[case]),
                    timeout=60)
    res.assert_ok()
