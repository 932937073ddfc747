"""Horovod's API where a migrating user meets it: the exception types Horovod's own
tests expect, keyword names, and features that need no special init()."""
import importlib.util

import pytest

from harness import rank_program, run_ranks

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(120)

ALLTOALL_SPLITS = rank_program("api_fixes_alltoall_splits")


def test_alltoall_float_splits_raise_value_error_and_process_set_keyword():
    run_ranks(ALLTOALL_SPLITS, 1, "python", timeout=60).assert_ok()


SYNC_BN_KERAS = rank_program("api_fixes_sync_bn_keras")


def test_sync_batch_normalization_fused_false_in_keras():
    run_ranks(SYNC_BN_KERAS, 1, "python", timeout=90).assert_ok()


KERAS_API = rank_program("api_fixes_keras_api")


def test_keras_adasum_and_positional_arguments_as_in_horovod():
    run_ranks(KERAS_API, 1, "python", timeout=90).assert_ok()
