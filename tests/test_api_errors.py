"""Bad arguments and misuse: the right exception type, a message that names the problem,
and an engine that still serves the next op.

Single-rank cases run one plain-python subprocess each (cheap, and a fresh process, so
"before init" and shutdown are real). Cases that need peers (a duplicate name that is
surely still in flight, ranks that disagree, a lost rank) run under horovodlikerun.
"""
import importlib.util

import pytest

from harness import launcher_matrix, rank_program, run_ranks

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(120)

NOT_INIT = "Horovod has not been initialized; use hvd.init()."


SINGLE = rank_program("api_errors_cases")

SINGLE_CASES = ["before_init", "not_an_array", "unsupported_dtype", "non_contiguous",
                "allgather_0d", "bad_root", "bool_average", "bad_op_and_dims",
                "unknown_handle", "bad_process_set_at_init"]


@pytest.mark.parametrize("case", SINGLE_CASES)
def test_bad_arguments_single_rank(case):
    run_ranks(SINGLE, 1, "python", args=(case,), timeout=60).assert_ok()


def test_duplicate_in_flight_name_single_rank():
    run_ranks(SINGLE, 1, "python", args=("duplicate_name_single_rank",),
              timeout=60).assert_ok()


@pytest.mark.parametrize("launcher,np_", launcher_matrix([("horovodlikerun", 2),
                                                          ("mpirun", 2)]))
def test_duplicate_in_flight_name_two_ranks(launcher, np_):
    run_ranks(SINGLE, np_, launcher, args=("duplicate_name_two_ranks",),
              timeout=60).assert_ok()


MISMATCH = rank_program("api_errors_mismatch")


@pytest.mark.parametrize("launcher,np_", launcher_matrix(
    [("horovodlikerun", 2), ("horovodlikerun", 3), ("mpirun", 2)]))
def test_ranks_that_disagree_get_tensor_mismatch_error(launcher, np_):
    run_ranks(MISMATCH, np_, launcher, timeout=90).assert_ok()


LOST_PEER = rank_program("api_errors_lost_peer")


@pytest.mark.parametrize("np_", [2, 3])
def test_lost_peer_raises_horovod_internal_error(np_):
    run_ranks(LOST_PEER, np_, "horovodlikerun", timeout=90).assert_ok()


# Unnamed ops from several threads at once: numbered per thread (by the thread's name),
# so each pairs with the same thread's op on the other ranks; the issue this guards
# against paired a third to a half of them with another thread's tensor, silently.
THREADS = rank_program("api_errors_threads")


def test_unnamed_ops_from_several_threads_pair_by_thread():
    run_ranks(THREADS, 2, "horovodlikerun", timeout=90).assert_ok()


@pytest.mark.parametrize("status", ["HVDL_ERR_SYSTEM", "HVDL_ERR_PEER_LOST", "HVDL_ERR_INVALID"])
def test_no_error_is_raised_without_a_message(status):
    """The one place engine errors become exceptions never raises one with no text (a
    HorovodInternalError("") once came out of start-up), whatever the engine said."""
    from horovodlike.common import engine
    err = engine._error(getattr(engine.lib, status), "")
    name = engine.ffi.string(engine.lib.hvdl_status_name(getattr(engine.lib, status))).decode()
    assert str(err) and name in str(err), repr(err)
