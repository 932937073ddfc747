"""Shared pieces of the horovodlike.torch tests, and the checks of the API surface that
need no launch (names exported, mpi_ops aliases, signatures).

TORCH_PRELUDE extends the harness's RANK_PRELUDE: `thvd` is horovodlike.torch (`hvd`
stays the numpy API that finish() uses), torch runs one thread per rank, and the
t_* checks compare tensors the way check_* compare arrays, collecting failures so one
launch reports every failing case.
"""
import importlib
import inspect

from harness import RANK_PRELUDE, run_ranks

TORCH_PRELUDE = RANK_PRELUDE + r'''
import torch
import horovodlike.torch as thvd
torch.set_num_threads(1)

ALL_TORCH_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool]
FLOAT_TORCH_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
TORCH_EPS = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7,
             torch.float32: 2.0 ** -23, torch.float64: 2.0 ** -52}


def _tshow(t, n=8):
    flat = t.detach().reshape(-1)[:n]
    return str(flat.double().tolist() if flat.is_floating_point() else flat.tolist())


def _tmeta(got, exp, what):
    if not isinstance(got, torch.Tensor):
        fail(what, f"expected a torch.Tensor, got {type(got).__name__}")
        return False
    if got.dtype != exp.dtype or tuple(got.shape) != tuple(exp.shape):
        fail(what, f"got dtype={got.dtype} shape={tuple(got.shape)}, expected "
                   f"dtype={exp.dtype} shape={tuple(exp.shape)}")
        return False
    return True


def _tdiff(got, exp, bad):
    idx = torch.nonzero(bad.reshape(-1)).reshape(-1)[:5].tolist()
    g, e = got.detach().reshape(-1), exp.detach().reshape(-1)
    return "; ".join(f"[{i}] got {g[i].item()!r} expected {e[i].item()!r}" for i in idx) + \
        f" ({int(bad.sum())} of {bad.numel()} differ)"


def t_equal(got, exp, what):
    """Same dtype, shape and values (floats compared in float64; NaN == NaN)."""
    if not _tmeta(got, exp, what):
        return False
    if exp.is_floating_point():
        g, e = got.detach().double(), exp.detach().double()
        bad = ~((g == e) | (torch.isnan(g) & torch.isnan(e)))
    else:
        bad = got.detach() != exp.detach()
    if bool(bad.any()):
        fail(what, _tdiff(got, exp, bad))
        return False
    return True


def t_close(got, exp, what, rtol=1e-5, atol=1e-6):
    if not _tmeta(got, exp, what):
        return False
    g, e = got.detach().double(), exp.detach().double()
    bad = ~((g - e).abs() <= atol + rtol * e.abs())
    if bool(bad.any()):
        fail(what, _tdiff(got, exp, bad) + f" rtol={rtol} atol={atol}")
        return False
    return True


def flat_params(model):
    return torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])


def accumulate_global_batch(model, loss_fn, parts, m):
    """The single-process reference of data parallelism with gradient accumulation:
    parts holds each replica's (x, y); every one of the len(parts) × m micro-batches
    adds loss / (m · len(parts)) to model's gradients. Returns the micro-batch losses,
    replica by replica."""
    losses = []
    for xd, yd in parts:
        for xm, ym in zip(torch.tensor_split(xd, m), torch.tensor_split(yd, m)):
            loss = loss_fn(model(xm), ym)
            (loss / (m * len(parts))).backward()
            losses.append(loss.detach())
    return losses


def same_on_every_rank(t, what, process_set=None):
    """The tensor is bit-identical on every rank (of the set)."""
    ps = process_set or thvd.global_process_set
    gathered = thvd.allgather(t.detach().reshape(1, -1).contiguous(), process_set=ps)
    for i in range(gathered.shape[0]):
        if not torch.equal(gathered[i], gathered[0]):
            d = (gathered[i].double() - gathered[0].double()).abs().max().item()
            fail(what, f"set member {i} differs from member 0 (max |diff| {d})")
            return False
    return True
'''


def run_torch(body, np_, launcher="horovodlikerun", timeout=180, env=None, **kw):
    """Run TORCH_PRELUDE + body on np_ ranks and require every rank to pass."""
    return run_ranks(TORCH_PRELUDE + body, np_, launcher, env=env, timeout=timeout,
                     **kw).assert_ok()


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
    body = r'''
import torch
import horovodlike.torch as thvd
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
'''
    run_ranks(body, 1, "python", timeout=60).assert_ok()
