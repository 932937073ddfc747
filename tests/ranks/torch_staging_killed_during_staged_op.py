"""Rank program of tests/test_torch_staging.py."""
import os
import sys
import time
import torch
import horovodlike.torch as hvd
from horovodlike.torch import _staging


def main():
    hvd.init()
    r = hvd.rank()
    device = os.environ.get("STAGE_DEVICE", "cpu")
    if device == "cuda":
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    print(f"ready {r} {os.getpid()}", flush=True)
    x = torch.ones(8 << 20, device=device)     # 32 MiB in pieces
    try:
        for i in range(100000):
            h = hvd.allreduce_async(x, name=f"big.{i % 2}")
            if i == 3:
                print(f"midway {r}", flush=True)
            hvd.synchronize(h)
    except hvd.HorovodInternalError as e:
        print(f"lost {r} staged={_staging.stats().get('pieces', 0)}: {e}", flush=True)
        sys.exit(0)


if __name__ == "__main__":
    main()
