"""Rank program of tests/test_timeline.py, run by
test_fused_in_place_tensors_back_to_back_in_one_buffer_are_not_copied."""
import torch
import horovodlike.torch as hvd


def main():
    hvd.init()
    buf = torch.arange(4 * 3000, dtype=torch.float32) + hvd.rank()
    views = buf.view(4, 3000)           # four tensors back to back in one buffer
    # float64, so that they fuse among themselves and not with the views
    apart = [torch.full((3000,), float(hvd.rank()), dtype=torch.float64) for _ in range(4)]
    for step in range(3):
        lead = hvd.allreduce_async_(torch.ones(8), name="lead")   # announced alone
        hs = [hvd.allreduce_async_(v, name=f"view{i}") for i, v in enumerate(views)]
        hs += [hvd.allreduce_async_(t, name=f"apart{i}") for i, t in enumerate(apart)]
        for h in [lead] + hs:
            hvd.synchronize(h)
    assert torch.equal(buf, torch.arange(4 * 3000, dtype=torch.float32) + 0.5), buf
    assert all(torch.equal(t, torch.full((3000,), 0.5, dtype=torch.float64)) for t in apart)
    print("HVDTEST-OK", flush=True)


if __name__ == "__main__":
    main()
