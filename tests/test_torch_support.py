"""Shared pieces of the horovodlike.torch tests, and the checks of the API surface that
need no launch (names exported, mpi_ops aliases, signatures).

Torch rank programs live in tests/ranks/ and start with `from _torch_common import *`
(horovodlike.torch as `thvd`, the t_* checks); run_torch runs one.
"""
import importlib
import inspect

from harness import rank_program, run_ranks


def run_torch(program, np_, launcher="horovodlikerun", timeout=180, env=None, **kw):
    """Run a torch rank program (a path under tests/ranks/, from rank_program) on np_
    ranks and require every rank to pass."""
    return run_ranks(program, np_, launcher, env=env, timeout=timeout, **kw).assert_ok()


# ----------------------------------------------------------------- API surface

HOROVOD_TORCH_NAMES = """
allreduce allreduce_ allreduce_async allreduce_async_ grouped_allreduce grouped_allreduce_
grouped_allreduce_async grouped_allreduce_async_ sparse_allreduce_async allgather
allgather_async grouped_allgather grouped_allgather_async broadcast broadcast_
broadcast_async broadcast_async_ alltoall alltoall_async reducescatter reducescatter_async
grouped_reducescatter grouped_reducescatter_async join barrier poll synchronize init
shutdown is_initialized start_timeline stop_timeline size local_size cross_size rank
local_rank cross_rank mpi_threads_supported mpi_enabled mpi_built gloo_enabled gloo_built
nccl_built ddl_built ccl_built cuda_built rocm_built is_homogeneous ProcessSet
global_process_set add_process_set remove_process_set Average Sum Adasum Min Max Product
DistributedOptimizer SyncBatchNorm Compression broadcast_parameters
broadcast_optimizer_state broadcast_object allgather_object HorovodInternalError mpi_ops
""".split()

MPI_OPS_NAMES = """
allreduce allreduce_ allreduce_async allreduce_async_ grouped_allreduce grouped_allreduce_
grouped_allreduce_async grouped_allreduce_async_ allgather allgather_async grouped_allgather
grouped_allgather_async broadcast broadcast_ broadcast_async broadcast_async_ alltoall
alltoall_async reducescatter reducescatter_async grouped_reducescatter
grouped_reducescatter_async sparse_allreduce_async join barrier poll synchronize init
shutdown size rank local_rank local_size Average Sum Adasum Min Max Product ProcessSet
global_process_set HorovodAllreduce HorovodAllgather HorovodBroadcast HorovodAlltoall
HorovodReducescatter
""".split()


def test_horovod_torch_names_are_exported():
    import horovodlike.torch as hvd
    missing = [n for n in HOROVOD_TORCH_NAMES if not hasattr(hvd, n)]
    assert not missing, f"horovodlike.torch lacks {missing}"
    missing = [n for n in MPI_OPS_NAMES if not hasattr(hvd.mpi_ops, n)]
    assert not missing, f"horovodlike.torch.mpi_ops lacks {missing}"
    for n in MPI_OPS_NAMES:
        if hasattr(hvd, n):
            assert getattr(hvd, n) is getattr(hvd.mpi_ops, n), n


def test_submodules_match_horovods_layout():
    for mod, names in [("horovodlike.torch.compression", ["Compression"]),
                       ("horovodlike.torch.optimizer", ["DistributedOptimizer"]),
                       ("horovodlike.torch.functions",
                        ["broadcast_parameters", "broadcast_optimizer_state",
                         "broadcast_object", "allgather_object"]),
                       ("horovodlike.torch.sync_batch_norm", ["SyncBatchNorm"])]:
        m = importlib.import_module(mod)
        for n in names:
            assert hasattr(m, n), f"{mod}.{n}"


def test_signatures_accept_horovods_keywords():
    import horovodlike.torch as hvd
    expect = {
        "allreduce": ["tensor", "average", "name", "compression", "op", "prescale_factor",
                      "postscale_factor", "process_set"],
        "allreduce_async_": ["tensor", "average", "name", "op", "prescale_factor",
                             "postscale_factor", "process_set"],
        "grouped_allreduce": ["tensors", "average", "name", "compression", "op",
                              "prescale_factor", "postscale_factor", "process_set"],
        "allgather": ["tensor", "name", "process_set"],
        "broadcast": ["tensor", "root_rank", "name", "process_set"],
        "broadcast_": ["tensor", "root_rank", "name", "process_set"],
        "alltoall": ["tensor", "splits", "name", "process_set"],
        "reducescatter": ["tensor", "name", "compression", "op", "process_set",
                          "prescale_factor", "postscale_factor"],
        "grouped_reducescatter": ["tensors", "name", "compression", "op", "process_set",
                                  "prescale_factor", "postscale_factor"],
        "DistributedOptimizer": ["optimizer", "named_parameters", "compression",
                                 "backward_passes_per_step", "op",
                                 "gradient_predivide_factor", "num_groups", "groups",
                                 "sparse_as_dense", "process_set"],
        "broadcast_object": ["obj", "root_rank", "name"],
        "allgather_object": ["obj", "name"],
        "join": ["device"],
        "barrier": ["process_set"],
    }
    for fn, params in expect.items():
        got = list(inspect.signature(getattr(hvd, fn)).parameters)
        assert got[:len(params)] == params, f"{fn}{tuple(got)}"


def test_compression_round_trip():
    import torch
    import horovodlike.torch as hvd
    x = torch.linspace(-2, 2, 7, dtype=torch.float64)
    c, ctx = hvd.Compression.fp16.compress(x)
    assert c.dtype == torch.float16
    back = hvd.Compression.fp16.decompress(c, ctx)
    assert back.dtype == torch.float64 and torch.allclose(back, x, atol=1e-3)
    i = torch.arange(4)
    c, ctx = hvd.Compression.fp16.compress(i)
    assert c is i and hvd.Compression.fp16.decompress(c, ctx) is i
    c, ctx = hvd.Compression.none.compress(x)
    assert c is x and hvd.Compression.none.decompress(c, ctx) is x


def test_calls_before_init_raise_a_clear_error():
    """In a fresh process: every collective refuses with 'not initialized'."""
    run_ranks(rank_program("torch_support_before_init"), 1, "python", timeout=60).assert_ok()
