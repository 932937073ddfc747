"""horovodlike as a torch.distributed backend: ``backend="horovodlike"``.

    import horovodlike.torch.distributed            # registers the backend
    dist.init_process_group("horovodlike")

Then DDP, FSDP2 (``fully_shard``), DTensor, tensor parallelism and
``torch.distributed.pipelining`` run their communication on horovodlike's engine. torch
sub-groups (``dist.new_group``, DeviceMesh dimensions) are engine process sets; a Work
is an engine handle. See docs/torch-distributed.md for the supported calls and the
differences from gloo.
"""
import torch.distributed as dist

from ._group import BACKEND_NAME, ProcessGroupHorovodlike  # noqa: F401
from ._startup import create_default, fill_torch_env
from ._work import Work  # noqa: F401


def _create(store, rank, size, timeout):
    return create_default(store, rank, size, timeout)


if BACKEND_NAME not in dist.Backend.backend_list:
    dist.Backend.register_backend(BACKEND_NAME, _create, devices=["cpu"])

fill_torch_env()
