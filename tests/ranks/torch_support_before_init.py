"""Rank program of tests/test_torch_support.py, run by
test_calls_before_init_raise_a_clear_error: in a fresh process every collective refuses
with 'not initialized'."""
import torch
import horovodlike.torch as thvd


def main():
    for fn in (lambda: thvd.allreduce(torch.ones(2)), lambda: thvd.allgather(torch.ones(2)),
               lambda: thvd.broadcast(torch.ones(2), 0), lambda: thvd.rank(),
               lambda: thvd.barrier()):
        try:
            fn()
        except ValueError as e:
            assert "not been initialized" in str(e), e
        else:
            raise AssertionError("no error before init")
    print("HVDTEST-OK rank=0")


if __name__ == "__main__":
    main()
