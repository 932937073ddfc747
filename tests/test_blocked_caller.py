"""A caller blocked in synchronize() never keeps another thread's op, in the same
process, from being announced and completed (the engine side of "no TensorFlow graph
can deadlock", docs/tensorflow.md).

At 2 ranks, rank 0's thread A waits for op `blocked.i`, which rank 1 submits only
after op `other.i` has completed; rank 0 submits `other.i` from its main thread while A
waits. So `other.i` can only complete if rank 0 announces it while A is blocked; if it
did not, both ranks would hang, and a watchdog ends the rank naming the case. Each case
runs 30 times (with no stall inspector and rare heartbeats, whose periodic wake-ups
would hide a missed one), with A and B each blocking (flagged to drive the engine's work
themselves on one node) or asynchronous then synchronize(), under:

- one-node negotiation in shared memory, where a waiting caller runs the loop's work
  itself (loop.c, hvdl__drive) -- the caller-driven path;
- the same with a 20 ms cycle, so `other.i` arrives while `blocked.i` is in flight and
  must wait out the cycle before anyone announces it;
- negotiation over TCP (HOROVODLIKE_SHM_NEGOTIATE=0), where only the loop thread does.
"""
import pytest

from harness import rank_program, run_ranks

BODY = rank_program("blocked_caller")


@pytest.mark.parametrize("env", [
    {},
    {"HOROVOD_CYCLE_TIME": "20"},
    {"HOROVODLIKE_SHM_NEGOTIATE": "0"},
], ids=["shm-caller-driven", "shm-cycle-20ms", "tcp-loop-thread"])
def test_blocked_caller_does_not_hold_back_other_threads(env):
    # No stall inspector and rare heartbeats: their periodic wake-ups would rescue a
    # loop that nothing else woke, and hide a missed wake-up as a slow run.
    env = dict(env, HOROVOD_STALL_CHECK_DISABLE="1", HOROVODLIKE_PEER_TIMEOUT_SECONDS="600")
    run_ranks(BODY, 2, "horovodlikerun", env=env, timeout=120).assert_ok()
