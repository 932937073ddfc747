"""Rank program of tests/test_p2p.py, run by test_p2p_torch."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)
import torch
import horovodlike.torch as th


def main():
    th.init()
    R = th.rank()
    peer = 1 - R
    DT = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64, torch.bool]
    for i, dt in enumerate(DT):
        for shape in [(0,), (1,), (5, 3), (300_001,)]:
            x = (torch.arange(int(np.prod(shape))) % 7).reshape(shape).to(dt)
            if R == 0:
                th.send(x, 1, name=f"t.{i}.{shape}")
                th.send(x.t() if x.dim() == 2 else x, 1, name=f"u.{i}.{shape}")
            else:
                got = th.recv(0, name=f"t.{i}.{shape}")
                check(got.dtype == dt and tuple(got.shape) == shape and torch.equal(got, x),
                      f"torch recv {dt} {shape}", f"{got.dtype} {tuple(got.shape)}")
                want = x.t() if x.dim() == 2 else x
                out = torch.empty(want.shape, dtype=dt)
                if out.dim() == 2:
                    out = torch.empty(out.shape[::-1], dtype=dt).t()   # non-contiguous
                h = th.recv_async_(out, 0, name=f"u.{i}.{shape}")
                back = th.synchronize(h)
                check(back is out and torch.equal(out, want), f"torch recv_ {dt} {shape}")
    if R == 1:
        check_raises(th.TensorMismatchError,
                     lambda: th.recv_(torch.zeros(3, dtype=torch.int64), 0, name="bad"),
                     "dtype", "rank 0", "rank 1", "p2p.bad")
    else:
        th.send(torch.zeros(3), 1, name="bad")
    finish()


if __name__ == "__main__":
    main()
