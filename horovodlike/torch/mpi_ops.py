"""The namespace of Horovod's `horovod.torch.mpi_ops`: every collective (differentiable
and asynchronous forms), poll/synchronize, join/barrier, the reduction ops, process sets
and the start-up and topology calls, so that code importing from
`horovod.torch.mpi_ops` works with `horovodlike.torch.mpi_ops`.
"""
from horovodlike.common.exceptions import HorovodInternalError  # noqa: F401

from ._autograd import (HorovodAllgather, HorovodAllreduce, HorovodAlltoall,  # noqa: F401
                        HorovodBroadcast, HorovodGroupedAllgather, HorovodGroupedAllreduce,
                        HorovodGroupedReducescatter, HorovodReducescatter, allgather,
                        allreduce, alltoall, broadcast, grouped_allgather, grouped_allreduce,
                        grouped_reducescatter, reducescatter)
from ._basics import *  # noqa: F401,F403
from ._collectives import (Adasum, Average, Max, Min, Product, Sum,  # noqa: F401
                           allgather_async, allreduce_, allreduce_async, allreduce_async_,
                           alltoall_async, barrier, broadcast_, broadcast_async,
                           broadcast_async_, grouped_allgather_async, grouped_allreduce_,
                           grouped_allreduce_async, grouped_allreduce_async_,
                           grouped_reducescatter_async, join, poll, recv, recv_, recv_async,
                           recv_async_, reducescatter_async, send, send_async,
                           sparse_allreduce_async, synchronize)
from ._process_sets import (ProcessSet, add_process_set, get_process_sets,  # noqa: F401
                            global_process_set, remove_process_set)
from .compression import Compression  # noqa: F401
