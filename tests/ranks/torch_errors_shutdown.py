"""Rank program of tests/test_torch_errors.py, run by
test_ops_after_shutdown_raise_and_init_starts_again."""
import torch
import horovodlike.torch as thvd


def main():
    thvd.init()
    t = thvd.allreduce(torch.ones(2), op=thvd.Sum)
    assert torch.equal(t, torch.ones(2)), t
    thvd.shutdown()
    for fn in (lambda: thvd.allreduce(torch.ones(2)), lambda: thvd.broadcast(torch.ones(1), 0)):
        try:
            fn()
        except ValueError as e:
            assert "not been initialized" in str(e), e
        else:
            raise AssertionError("no error after shutdown")
    thvd.init()
    assert torch.equal(thvd.allreduce(torch.ones(2), op=thvd.Sum), torch.ones(2))
    print("HVDTEST-OK rank=0")


if __name__ == "__main__":
    main()
