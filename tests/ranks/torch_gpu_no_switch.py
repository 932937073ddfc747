"""Rank program of tests/test_torch_gpu.py, run by
test_cuda_tensors_refused_without_the_switch: without HOROVODLIKE_EXPERIMENTAL_CUDA=1 a
CUDA tensor gets the clear error."""
from torch_gpu_common import *  # noqa: F401,F403 (init, same, data, torch, thvd, hvd)


def main():
    R, P, DEV = init()
    for fn in (lambda: thvd.allreduce(torch.ones(2, device=DEV)),
               lambda: thvd.allgather_async(torch.ones(2, device=DEV)),
               lambda: thvd.broadcast_(torch.ones(2, device=DEV), 0)):
        check_raises(TypeError, fn, "move it to the CPU first",
                     "HOROVODLIKE_EXPERIMENTAL_CUDA=1")
    finish()


if __name__ == "__main__":
    main()
