"""Rank program of tests/test_api_fixes.py, run by
test_alltoall_float_splits_raise_value_error_and_process_set_keyword."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)
import torch
import horovodlike.torch as hvdt


def main():
    hvdt.init()
    check_raises(ValueError, lambda: hvdt.alltoall(torch.ones(2), splits=torch.tensor([2.0])),
                 "splits must hold integers", what="alltoall with float32 splits")
    ps = hvdt.ProcessSet(ranks_or_comm=[0])            # Horovod's keyword
    check(ps.ranks == [0], "ProcessSet(ranks_or_comm=)", repr(ps.ranks))
    finish()


if __name__ == "__main__":
    main()
