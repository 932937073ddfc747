"""The cached fast path of a repeated allreduce (horovodlike/common/request.py,
allreduce_key): it is taken, and it never accepts a call the slow path refuses nor gives
one another meaning (a non-contiguous view, another byte order or dtype, a tensor resized
in place, a bool scale, a removed or unregistered process set, a tensor that needs a
graph). Two ranks, so every result differs from its input."""
import importlib.util

import pytest

from harness import rank_program, run_ranks

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(120)


def test_cached_allreduce_answers_as_the_slow_path():
    run_ranks(rank_program("prepared_requests"), 2, "horovodlikerun", timeout=90).assert_ok()


def test_cached_send_and_recv_answer_as_the_slow_path():
    run_ranks(rank_program("prepared_p2p"), 2, "horovodlikerun", timeout=90).assert_ok()


def test_blocking_send_and_recv_are_one_engine_call_and_answer_as_apart():
    """numpy and torch: a repeated blocking named send, recv_ and recv is one hvdl_run
    (counted at the cffi library), with the values and the errors of the same call made
    with hvdl_enqueue, hvdl_wait and hvdl_release apart; Ctrl-C in one still waiting
    leaves it posted, its buffer kept alive, and the later message lands there."""
    run_ranks(rank_program("p2p_one_call"), 2, "horovodlikerun", timeout=90).assert_ok()
