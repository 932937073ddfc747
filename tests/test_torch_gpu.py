"""CUDA tensors through the staging pipeline (horovodlike/torch/_staging.py), at 2 ranks
sharing one GPU (torch.cuda.set_device(local_rank % device_count)). Skipped without CUDA.

- every collective and dtype on CUDA tensors against the same op on CPU tensors (the
  unstaged path), bit for bit, and the outputs are on the tensor's device;
- a CUDA model trained with DistributedOptimizer (buckets, and groups: fused ops) equal
  to the CPU run within fp tolerance; broadcast_optimizer_state of CUDA state;
- stream races: a kernel queued on the current stream writes the tensor (or, inside
  backward, the gradient) just before the op, behind a long GPU sleep, also on a side
  stream made current; the op must wait for it, and its result must be ready for the
  current stream when synchronize() returns;
- a rank killed during a staged CUDA op is named by the survivor;
- without HOROVODLIKE_EXPERIMENTAL_CUDA=1 a CUDA tensor still gets the clear error.
"""
import importlib.util

import pytest
import torch

from harness import rank_program
from test_torch_staging import killed_rank_during_staged_op
from test_torch_support import run_torch

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA device (torch.cuda.is_available() is "
                                        "False)")]
if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark.append(pytest.mark.timeout(300))

CUDA = {"HOROVODLIKE_EXPERIMENTAL_CUDA": "1"}


@pytest.mark.parametrize("program", [pytest.param("torch_gpu_collectives", id="collectives"),
                                     pytest.param("torch_gpu_training", id="training"),
                                     pytest.param("torch_gpu_stream_race", id="stream-race")])
def test_cuda_tensors_at_two_ranks_sharing_one_gpu(program):
    run_torch(rank_program(program), 2, "horovodlikerun", timeout=240, env=CUDA)


def test_cuda_tensors_refused_without_the_switch():
    run_torch(rank_program("torch_gpu_no_switch"), 2, "horovodlikerun", timeout=120,
              env={"HOROVODLIKE_EXPERIMENTAL_CUDA": None})


@pytest.mark.timeout(120)
def test_killed_rank_during_staged_cuda_op_is_named(tmp_path):
    killed_rank_during_staged_op(tmp_path, dict(CUDA, STAGE_DEVICE="cuda"))
