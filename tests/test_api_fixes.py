"""Horovod's API where a migrating user meets it: the exception types Horovod's own
tests expect, keyword names, and features that need no special init()."""
import importlib.util

import pytest

from harness import RANK_PRELUDE, run_ranks

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(120)

ALLTOALL_SPLITS = RANK_PRELUDE + r'''
import torch
import horovodlike.torch as hvdt
hvdt.init()
check_raises(ValueError, lambda: hvdt.alltoall(torch.ones(2), splits=torch.tensor([2.0])),
             "splits must hold integers", what="alltoall with float32 splits")
ps = hvdt.ProcessSet(ranks_or_comm=[0])            # Horovod's keyword
check(ps.ranks == [0], "ProcessSet(ranks_or_comm=)", repr(ps.ranks))
finish()
'''


def test_alltoall_float_splits_raise_value_error_and_process_set_keyword():
    run_ranks(ALLTOALL_SPLITS, 1, "python", timeout=60).assert_ok()
