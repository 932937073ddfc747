"""Asynchronous collectives on torch tensors, and the handles they return.

Every `*_async` function checks its arguments, hands the engine the addresses of
contiguous CPU buffers (no copy when the tensor already is one) and returns at once with
an integer handle; `poll(handle)` says whether the engine has finished, and
`synchronize(handle)` waits and returns the output. The tensors involved are kept alive
by horovodlike.common.ops until then.

In-place variants (trailing underscore) write into the caller's tensor; a non-contiguous
tensor is reduced in a contiguous copy that is copied back at synchronize().

CUDA tensors (and CPU ones with HOROVODLIKE_FORCE_STAGING=1) go through _staging.py:
there the handle is a _staging.Handle, and a grouped allreduce packs its members per
dtype and device into one staged op.

Grouped ops submit one engine request per tensor and return one handle for the group: a
negative integer, so it can never collide with an engine handle.
"""
import itertools
import threading

import torch

from horovodlike.common import ops as _ops
from horovodlike.common import request
from horovodlike.common.request import (Adasum, Average, Max, Min,  # noqa: F401
                                        Product, Sum)

from . import _staging, _tensors
from ._process_sets import global_process_set

_groups = {}                 # negative handle -> list of member handles
_group_ids = itertools.count(1)
_group_lock = threading.Lock()


# ------------------------------------------------------------------ arguments

def reduce_op(op, average=None, what="allreduce"):
    """Resolve Horovod's op=/average= pair into an engine reduce op (request.reduce_op:
    Adasum is refused there)."""
    return request.reduce_op(op, average, what)


def _tensor_list(tensors, what):
    if isinstance(tensors, torch.Tensor) or not hasattr(tensors, "__iter__"):
        raise TypeError(f"{what} expects a list of tensors, got {type(tensors).__name__}")
    tensors = list(tensors)
    if not tensors:
        raise ValueError(f"{what} needs at least one tensor")
    return tensors


# ------------------------------------------------------------------ handles

def _new_group(handles):
    with _group_lock:
        gid = -next(_group_ids)
        _groups[gid] = list(handles)
    return gid


def _submit_group(requests, tensors, submit_one):
    """Submit one request per tensor and return one handle for all of them. If a member
    is refused, the error is raised at once; members already queued stay alive in the
    engine (their buffers are kept) and complete when the other ranks submit them."""
    handles = [submit_one(t, req) for t, req in zip(tensors, requests)]
    return _new_group(handles)


def poll(handle):
    """True once the operation behind `handle` has finished; never blocks."""
    if isinstance(handle, _staging.Handle):
        return handle.poll()
    if callable(handle):
        return all(poll(h) for h in getattr(handle, "handles", ()))
    if isinstance(handle, int) and handle < 0:
        members = _groups.get(handle)
        if members is None:
            raise ValueError(f"unknown or already synchronized handle {handle}")
        return all(poll(h) for h in members)
    return _ops.poll(handle)


def synchronize(handle):
    """Wait for the operation behind `handle` and return its output (a tensor, a list of
    tensors for grouped ops, (output, received_splits) for alltoall_async); raises the
    operation's error if it failed."""
    if callable(handle):
        return handle()
    if isinstance(handle, int) and handle < 0:
        with _group_lock:
            members = _groups.pop(handle, None)
        if members is None:
            raise ValueError(f"unknown or already synchronized handle {handle}")
        return request.wait_all(members, synchronize)
    return _ops.synchronize(handle)


# ------------------------------------------------------------------ allreduce

def _same_shape_op(tensor, inplace, code, req):
    """Submit an op whose output has the input's shape: in place (written back into the
    caller's tensor, even a non-contiguous one) or into a new tensor."""
    buf = _tensors.contiguous(tensor)
    out = buf if inplace else torch.empty_like(buf)

    def finish(_=None):
        return _tensors.write_back(tensor, buf) if inplace else out
    if _staging.wanted(buf):
        return _staging.same_shape(tensor, buf, out, code, req, finish)
    return _ops.submit((tensor, buf, out), finish,
                       **req.fields(code, buf.shape, buf.data_ptr(), out.data_ptr()))


def _allreduce(tensor, inplace, average, name, op, prescale_factor, postscale_factor,
               process_set, what, now=False):
    """An allreduce's handle; now=True: wait for it here and return the output (a
    cached call then needs no handle: _ops.run_now)."""
    # The cached fast path (request.allreduce_key). The key holds what check_tensor
    # and the staging decision read: dtype, shape and device; and `what`, whose output
    # differs (in place or new). Checked on every call, as the key cannot hold them:
    # the tensor is a plain strided, contiguous one with no negative bit (a view of the
    # same shape may be neither, and takes the slow path's copy; a sparse tensor has
    # no is_contiguous), and staging is not forced (an environment variable).
    key = None
    if (type(tensor) is torch.Tensor and tensor.layout is torch.strided
            and tensor.is_contiguous() and not tensor.is_neg()):
        key = request.allreduce_key(name, op, average, prescale_factor, postscale_factor,
                                    process_set, (what, tensor.dtype, tensor.shape,
                                                  tensor.device))
        prepared = request.cached(key) if key is not None else None
        if prepared is not None and not _staging.forced():
            if now:
                out = tensor if inplace else torch.empty_like(tensor)
                _ops.run_now(prepared, (tensor, out), _ops.pointer(tensor.data_ptr()),
                             _ops.pointer(out.data_ptr()))
                return out
            return _prepared_op(prepared, tensor, inplace)
    if now:
        with _ops.waiting:
            handle = _allreduce(tensor, inplace, average, name, op, prescale_factor,
                                postscale_factor, process_set, what)
        return synchronize(handle)
    seen = request.generation()
    code = _tensors.check_tensor(tensor, what, staged=True)
    req = request.allreduce(name, op, average, prescale_factor, postscale_factor,
                            process_set, what)
    if key is None or _staging.wanted(tensor):
        return _same_shape_op(tensor, inplace, code, req)
    prepared = request.prepare(req, code, tensor.shape)
    handle = _prepared_op(prepared, tensor, inplace)
    request.remember(key, prepared, seen)
    return handle


def _prepared_op(prepared, tensor, inplace):
    """_same_shape_op for a contiguous CPU tensor and a request prepared earlier."""
    out = tensor if inplace else torch.empty_like(tensor)
    return _ops.submit_prepared(prepared, (tensor, out), lambda _: out,
                                tensor.data_ptr(), out.data_ptr())


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    """Start reducing `tensor` over the ranks (Average by default) into a new tensor;
    the input is not modified. Returns a handle for poll()/synchronize()."""
    return _allreduce(tensor, False, average, name, op, prescale_factor, postscale_factor,
                      process_set, "allreduce")


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    """In-place allreduce_async: the result is written into `tensor`."""
    return _allreduce(tensor, True, average, name, op, prescale_factor, postscale_factor,
                      process_set, "allreduce_")


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """In-place allreduce; returns `tensor`."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


def _grouped_allreduce(tensors, inplace, average, name, op, prescale_factor,
                       postscale_factor, process_set, what):
    tensors = _tensor_list(tensors, what)
    codes = [_tensors.check_tensor(t, what, staged=True) for t in tensors]
    reqs = request.allreduce(name, op, average, prescale_factor, postscale_factor,
                             process_set, what, members=len(tensors))
    if any(_staging.wanted(t) for t in tensors):
        return _fused_group(tensors, codes, reqs, inplace)
    return _submit_group(reqs, list(zip(tensors, codes)),
                         lambda tc, req: _same_shape_op(tc[0], inplace, tc[1], req))


def _fused_group(tensors, codes, reqs, inplace):
    """A grouped allreduce of staged tensors: one staged op per (dtype, device), named
    after its first member; members that are not staged go to the engine on their own.
    Returns a callable handle giving the outputs in the members' order."""
    classes, parts = {}, []
    for i, t in enumerate(tensors):
        if _staging.wanted(t):
            classes.setdefault((t.dtype, t.device), []).append(i)
        else:
            parts.append(([i], _same_shape_op(t, inplace, codes[i], reqs[i]), False))
    for idx in classes.values():
        first = reqs[idx[0]]
        if len(idx) == 1:
            parts.append((idx, _same_shape_op(tensors[idx[0]], inplace, codes[idx[0]], first),
                          False))
            continue
        members = [tensors[i] for i in idx]
        parts.append((idx, _staging.fused_allreduce(
            members, [_tensors.contiguous(t) for t in members], codes[idx[0]],
            first.renamed(f"{first.name}.fused{len(idx)}"), inplace,
            _tensors.write_back), True))

    def handle():
        outs = request.wait_all([h for _, h, _ in parts], synchronize)
        result = [None] * len(tensors)
        for (idx, _, fused), out in zip(parts, outs):
            for i, o in zip(idx, out if fused else [out]):
                result[i] = o
        return result

    handle.handles = tuple(h for _, h, _ in parts)
    return handle


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    """Start allreducing a list of tensors as one group; synchronize() returns a list."""
    return _grouped_allreduce(tensors, False, average, name, op, prescale_factor,
                              postscale_factor, process_set, "grouped_allreduce")


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    """In-place grouped_allreduce_async."""
    return _grouped_allreduce(tensors, True, average, name, op, prescale_factor,
                              postscale_factor, process_set, "grouped_allreduce_")


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    """In-place grouped allreduce; returns the list of (updated) tensors."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Reduce a sparse COO tensor by allgathering its indices and values (Horovod's
    method); returns a callable handle that synchronize() (or calling it) resolves into
    the reduced sparse tensor. Duplicate indices add up, so Average and Sum are the
    only ops."""
    what = "sparse_allreduce"
    op = reduce_op(op, None, what)
    if op not in (Average, Sum):
        raise ValueError("sparse_allreduce supports op=hvd.Average or op=hvd.Sum only")
    if not isinstance(tensor, torch.Tensor) or not tensor.is_sparse:
        raise TypeError("sparse_allreduce_async expects a sparse COO tensor")
    t = tensor.coalesce()
    indices, values = t.indices().t().contiguous(), t.values().contiguous()
    reqs = request.allgather(name, process_set, what=what, members=2)
    handles = [_allgather_one(x, _tensors.check_tensor(x, what), req)
               for x, req in zip((indices, values), reqs)]
    size = reqs[0].set_size

    def handle():
        gathered_indices, gathered_values = request.wait_all(handles, synchronize)
        if op == Average:
            gathered_values = gathered_values / size
        return torch.sparse_coo_tensor(gathered_indices.t(), gathered_values, t.size(),
                                       check_invariants=False).coalesce()

    handle.handles = tuple(handles)
    return handle


# ------------------------------------------------------------------ allgather

def _allgather_one(tensor, code, req):
    buf = _tensors.contiguous(tensor)
    dtype, tail = buf.dtype, tuple(buf.shape[1:])
    if _staging.wanted(buf):
        return _staging.gathered(tensor, buf, code, req, lambda out, _res: out)
    return _ops.submit((tensor, buf), lambda res: _tensors.from_engine(res, dtype, tail),
                       **req.fields(code, buf.shape, buf.data_ptr()))


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Start concatenating every rank's `tensor` along the first dimension (which may
    differ between ranks). Returns a handle."""
    code = _tensors.check_tensor(tensor, "allgather", staged=True)
    req = request.allgather(name, process_set, tensor.dim())
    return _allgather_one(tensor, code, req)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """Start allgathering a list of tensors as one group; synchronize() returns a list."""
    what = "grouped_allgather"
    tensors = _tensor_list(tensors, what)
    codes = [_tensors.check_tensor(t, what, staged=True) for t in tensors]
    reqs = request.allgather(name, process_set, [t.dim() for t in tensors], what,
                             members=len(tensors))
    return _submit_group(reqs, list(zip(tensors, codes)),
                         lambda tc, req: _allgather_one(tc[0], tc[1], req))


# ------------------------------------------------------------------ broadcast

def _broadcast(tensor, root_rank, inplace, name, process_set, what):
    code = _tensors.check_tensor(tensor, what, staged=True)
    req = request.broadcast(root_rank, name, process_set, what)
    return _same_shape_op(tensor, inplace, code, req)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Start copying root_rank's `tensor` to every rank, into a new tensor. root_rank is
    a global rank (also with a process set, as in Horovod)."""
    return _broadcast(tensor, root_rank, False, name, process_set, "broadcast")


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """In-place broadcast_async: root_rank's values are written into `tensor`."""
    return _broadcast(tensor, root_rank, True, name, process_set, "broadcast_")


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """In-place broadcast; returns `tensor`."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# ------------------------------------------------------------------ alltoall

def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Start sending splits[j] rows of `tensor` (first dimension) to the j-th rank of the
    set and receiving theirs. Without splits, the rows are split evenly. synchronize()
    returns (output, received_splits) — an int32 tensor of rows from each rank."""
    code = _tensors.check_tensor(tensor, "alltoall", staged=True)
    rows = int(tensor.shape[0]) if tensor.dim() else None
    if isinstance(splits, torch.Tensor):
        if splits.is_floating_point() or splits.is_complex() or splits.dtype == torch.bool:
            # ValueError, as Horovod raises it (its own tests expect that type)
            raise ValueError(f"alltoall: splits must hold integers, got {splits.dtype}")
        splits = splits.detach().cpu()
    req = request.alltoall(splits, rows, name, process_set, tensor.dim())
    buf = _tensors.contiguous(tensor)
    dtype, tail = buf.dtype, tuple(buf.shape[1:])

    def finish(res, out=None):
        out = _tensors.from_engine(res, dtype, tail) if out is None else out
        received = res.recv_splits if res.recv_splits is not None else []
        return out, torch.tensor(received, dtype=torch.int32)

    if _staging.wanted(buf):
        return _staging.gathered(tensor, buf, code, req, lambda out, res: finish(res, out),
                                 splits=req.splits)
    return _ops.submit((tensor, buf), finish,
                       **req.fields(code, buf.shape, buf.data_ptr(), splits=req.splits))


# ------------------------------------------------------------------ reducescatter

def _reducescatter_one(tensor, code, req):
    buf = _tensors.contiguous(tensor)
    out = _tensors.empty_rows(buf, req.rows(int(buf.shape[0])))
    if _staging.wanted(buf):
        return _staging.reducescatter(tensor, buf, out, code, req)
    return _ops.submit((tensor, buf, out), lambda _: out,
                       **req.fields(code, buf.shape, buf.data_ptr(), _tensors.address(out)))


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    """Start reducing `tensor` over the ranks and scattering the result along the first
    dimension: rank i of n gets rows // n rows, plus one if i < rows % n."""
    code = _tensors.check_tensor(tensor, "reducescatter", staged=True)
    req = request.reducescatter(name, op, prescale_factor, postscale_factor, process_set,
                                tensor.dim())
    return _reducescatter_one(tensor, code, req)


def grouped_reducescatter_async(tensors, name=None, op=Average,
                                process_set=global_process_set, prescale_factor=1.0,
                                postscale_factor=1.0):
    """Start reducescattering a list of tensors as one group; synchronize() returns a
    list."""
    what = "grouped_reducescatter"
    tensors = _tensor_list(tensors, what)
    codes = [_tensors.check_tensor(t, what, staged=True) for t in tensors]
    reqs = request.reducescatter(name, op, prescale_factor, postscale_factor, process_set,
                                 [t.dim() for t in tensors], what, members=len(tensors))
    return _submit_group(reqs, list(zip(tensors, codes)),
                         lambda tc, req: _reducescatter_one(tc[0], tc[1], req))


# ------------------------------------------------------------------ the rest

def barrier(process_set=global_process_set):
    """Block until every rank of the set has called barrier()."""
    req = request.barrier(process_set)
    synchronize(_ops.submit((), lambda _: None, **req.fields()))


def join(device=-1):
    """Say this rank has no more data: until every rank has joined, it takes part in the
    other ranks' allreduces with zeros. Blocks until all have joined; returns the rank
    that joined last. `device` is accepted for Horovod compatibility (CPU only)."""
    return int(synchronize(_ops.submit((), lambda res: int(res.value),
                                       **request.join().fields())))


# ------------------------------------------------------------------ point-to-point

def send_async(tensor, dst, name=None, process_set=global_process_set):
    """Send `tensor` to global rank `dst`, matched by (this rank, dst, name). The handle
    completes once the data has left this rank, possibly before dst posts its recv."""
    code = _tensors.check_tensor(tensor, "send")
    req = request.p2p("send", dst, name, process_set)
    buf = _tensors.contiguous(tensor)
    return _ops.submit_send(req, code, buf.shape, _tensors.address(buf), (tensor, buf))


def _p2p_key(kind, tensor, peer, name, process_set):
    """(key, prepared request or None) of a named blocking send's, recv_'s cached one-call
    path (request.p2p_key). The key holds what check_tensor reads (dtype, shape, device);
    checked on every call, as allreduce's: a plain strided, contiguous tensor with no
    negative bit (anything else takes the slow path's copy)."""
    if (type(tensor) is torch.Tensor and tensor.layout is torch.strided
            and tensor.is_contiguous() and not tensor.is_neg()):
        key = request.p2p_key(kind, name, peer, process_set,
                              (tensor.dtype, tensor.shape, tensor.device))
        return key, (request.cached(key) if key is not None else None)
    return None, None


def _p2p_first(kind, key, tensor, peer, name, process_set):
    """The first call under a key: every check, the one-call path, then remembered."""
    seen = request.generation()
    what = "send" if kind == "send" else "recv_"
    code = _tensors.check_tensor(tensor, what)
    req = request.p2p("send" if kind == "send" else "recv", peer, name, process_set, what=what)
    prepared = request.prepare(req, code, tensor.shape, recv_into=kind != "send")
    ptr = _ops.pointer(tensor.data_ptr())
    _ops.run_now(prepared, tensor, *((ptr, _ops.NULL) if kind == "send" else (_ops.NULL, ptr)))
    request.remember(key, prepared, seen)


def send(tensor, dst, name=None, process_set=global_process_set):
    key, prepared = _p2p_key("send", tensor, dst, name, process_set)
    if prepared is not None:
        _ops.run_now(prepared, tensor, _ops.pointer(tensor.data_ptr()), _ops.NULL)
    elif key is not None:
        _p2p_first("send", key, tensor, dst, name, process_set)
    else:
        synchronize(send_async(tensor, dst, name, process_set))


def _message(res):
    dtype, shape, _ = res.message()
    dt = next(t for t, c in _tensors.TORCH_DTYPES.items() if c == request.engine.DTYPES[dtype])
    if not res.nbytes:
        return torch.empty(shape, dtype=dt)
    return torch.frombuffer(res.buffer(), dtype=dt).view(shape)


def recv_async(src, name=None, process_set=global_process_set):
    """Receive the message `name` from global rank `src` as a new tensor whose dtype and
    shape are the message's."""
    return _ops.submit_recv(request.p2p("recv", src, name, process_set), _message)


def recv(src, name=None, process_set=global_process_set):
    key, prepared = _ops.recv_key(src, name, process_set)
    if prepared is not None:
        return _ops.run_now_result(prepared, _message)
    if key is not None:
        return _ops.recv_prepared(key, src, name, process_set, _message)
    return synchronize(recv_async(src, name, process_set))


def recv_async_(tensor, src, name=None, process_set=global_process_set):
    """Receive into `tensor` (any strides: a non-contiguous one is filled at synchronize).
    A message of another dtype or size fails, naming both ranks, the name and the field."""
    code = _tensors.check_tensor(tensor, "recv_")
    req = request.p2p("recv", src, name, process_set, what="recv_")
    buf = _tensors.contiguous(tensor)
    return _ops.submit_recv_into(req, code, buf.shape, _tensors.address(buf), (tensor, buf),
                                 lambda _: _tensors.write_back(tensor, buf))


def recv_(tensor, src, name=None, process_set=global_process_set):
    key, prepared = _p2p_key("recv_", tensor, src, name, process_set)
    if prepared is not None:
        _ops.run_now(prepared, tensor, _ops.NULL, _ops.pointer(tensor.data_ptr()))
    elif key is not None:
        _p2p_first("recv_", key, tensor, src, name, process_set)
    else:
        return synchronize(recv_async_(tensor, src, name, process_set))
    return tensor
