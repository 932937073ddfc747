"""The torch.distributed ProcessGroup that turns each call into engine requests.

One ProcessGroupHorovodlike is one torch group: the default group (the engine's global
set) or a `dist.new_group(ranks)` (an engine process set, registered by every rank in
the same order, as torch requires of new_group). Every method torch calls on a group
maps onto the engine's ops (the table in docs/torch-distributed.md):

  allreduce, allreduce_coalesced        allreduce (SUM, AVG, MIN, MAX, PRODUCT;
                                        PREMUL_SUM as SUM with a prescale)
  broadcast                             broadcast (the root made global)
  allgather, all_gather_single (+ the   allgather, written straight into the output
  coalesced forms), gather              tensor when it is one contiguous buffer
  reduce_scatter, reduce_scatter_single reducescatter (SUM, AVG); other ops and uneven
  (+ coalesced)                         splits: an allreduce, keeping this rank's part
  all_to_all_single, alltoall, scatter  alltoall with splits
  reduce                                allreduce, kept on the root
  barrier, monitored_barrier            barrier
  send, recv                            the engine's p2p

Names. The engine negotiates by name, and a name it has seen with the same metadata
takes its cached path (a bit, not a frame). torch gives no names, so each op is named
from what every rank agrees on: the group, the op kind, the signature the ranks must
share (dtype and shape, all but the first dimension where ranks may differ; the reduce
op and scale), and the occurrence of that signature modulo WINDOW:
"torch.g0.allreduce.float32[1024].3". A training loop's calls repeat the same names every
step, each name always with the same metadata, so every repeat is a cache hit. Ranks
whose shapes disagree at one call name their ops differently; the engine's deadlock
detection then ends the job within seconds, naming both ops, so both shapes ("rank 0
waits in allreduce '...float32[3].0' while rank 1 waits in '...float32[4].0'"), never a
hang. A name is reused only once the op that last used it has finished on this rank
(waited for here if not), as the engine requires names unique among in-flight ops.
"""
import hashlib
import threading

import torch
import torch.distributed as dist

from horovodlike.common import basics, request
from horovodlike.common import ops as _ops
from horovodlike.torch import _collectives, _tensors

from ._work import Work, _seconds

WINDOW = 16          # same-signature ops in flight before the next waits for the oldest
BACKEND_NAME = "horovodlike"

_RED = {
    dist.ReduceOp.SUM: request.Sum, dist.ReduceOp.AVG: request.Average,
    dist.ReduceOp.MIN: request.Min, dist.ReduceOp.MAX: request.Max,
    dist.ReduceOp.PRODUCT: request.Product,
}
_group_numbers = iter(range(1 << 30))
_number_lock = threading.Lock()


def _reduce_op(rop, what):
    """(engine op, prescale) for a torch ReduceOp."""
    kind = getattr(rop, "op", rop)
    if kind == dist.ReduceOp.PREMUL_SUM:
        factor = rop.factor
        if isinstance(factor, torch.Tensor):
            factor = float(factor.item())
        return request.Sum, float(factor)
    try:
        return _RED[kind], 1.0
    except KeyError:
        raise ValueError(f"horovodlike: {what} with {kind} is not supported; the engine "
                         f"reduces with SUM, AVG, MIN, MAX, PRODUCT and PREMUL_SUM") from None


def _flat(t):
    """A 1-D contiguous view (or copy) of t; 0-d tensors become one element."""
    return t.reshape(-1) if t.is_contiguous() else t.contiguous().reshape(-1)


class ProcessGroupHorovodlike(dist.ProcessGroup):
    """A torch process group whose ops run on horovodlike's engine (see the module doc)."""

    def __init__(self, rank, size, ranks, process_set, timeout=None, group_name=None):
        super().__init__(rank, size)
        self._ranks = list(ranks)                  # global ranks, in group-rank order
        self._set = process_set                    # the engine's set (hvd.ProcessSet)
        self._timeout = _seconds(timeout)
        with _number_lock:
            self._tag = f"torch.g{next(_group_numbers)}"
        self._group_name = group_name or self._tag
        self._counts = {}          # name without its occurrence -> occurrences
        self._last = {}            # name -> the Work that used it last
        self._lock = threading.Lock()
        self._closed = False
        self._owns_engine = False

    # ---------------------------------------------------------------- identity
    def getBackendName(self):
        return BACKEND_NAME

    def name(self):
        return BACKEND_NAME

    def _get_backend_name(self):
        return BACKEND_NAME

    def setGroupName(self, name):
        self._group_name = name

    def getGroupName(self):
        return self._group_name

    def _set_group_name(self, name):
        self._group_name = name

    @property
    def group_name(self):
        return self._group_name

    @property
    def process_set(self):
        """The engine's process set behind this group (pass it to hvd.* calls)."""
        return self._set

    def __repr__(self):
        return (f"ProcessGroupHorovodlike(rank={self.rank()}, size={self.size()}, "
                f"ranks={self._ranks}, set={self._set.process_set_id})")

    # ---------------------------------------------------------------- naming
    def _name(self, kind, sig):
        """The engine name of the next `kind` op of this signature (module docstring)."""
        base = f"{self._tag}.{kind}.{_sig_text(sig)}"
        with self._lock:
            n = self._counts.get(base, 0)
            self._counts[base] = n + 1
            name = f"{base}.{n % WINDOW}"
            prior = self._last.get(name)
        if prior is not None and not prior._done:
            prior._wait_engine(self._timeout)   # finished by its owner's wait()/future
        return name

    def _work(self, what, handles, finish=None, names=(), value=None):
        w = Work(f"{what} on {self._desc()}", handles, finish, self._timeout, value)
        w._names = tuple(names)
        with self._lock:
            for n in names:
                self._last[n] = w
        return w

    def _desc(self):
        return f"group {self._group_name!r} (ranks {self._ranks})"

    def _global(self, group_rank, what):
        if not 0 <= group_rank < len(self._ranks):
            raise ValueError(f"horovodlike: {what}: rank {group_rank} is not a rank of "
                             f"{self._desc()}")
        return self._ranks[group_rank]

    def _check(self, t, what):
        if self._closed:
            raise dist.DistBackendError(f"horovodlike: {what} on {self._desc()}, which "
                                        f"was destroyed on this rank")
        return _tensors.check_tensor(t, what)

    # ---------------------------------------------------------------- allreduce
    def _allreduce_one(self, t, op, pre, what):
        if t.is_complex():
            if op not in (request.Sum, request.Average):
                raise ValueError(f"horovodlike: {what} of a complex tensor supports SUM, "
                                 f"AVG and PREMUL_SUM only")
            t = torch.view_as_real(t)
        self._check(t, what)
        name = self._name("allreduce", (t.dtype, tuple(t.shape), request.OP_NAMES[op], pre))
        h = _collectives._allreduce(t, True, None, name, op, pre, 1.0, self._set,
                                    "allreduce_")
        return h, name

    def allreduce(self, tensors, opts=None):
        op, pre = _reduce_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM,
                             "allreduce")
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        parts = [self._allreduce_one(t, op, pre, "allreduce") for t in tensors]
        return self._work("allreduce", [h for h, _ in parts],
                          names=[n for _, n in parts], value=list(tensors))

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(list(tensors), opts)

    def reduce(self, tensors, opts):
        op, pre = _reduce_op(opts.reduceOp, "reduce")
        root = opts.rootRank
        self._global(root, "reduce")
        tmp = [t.clone() for t in tensors]
        parts = [self._allreduce_one(t, op, pre, "reduce") for t in tmp]
        keep = self.rank() == root

        def finish(_):
            if keep:
                for t, r in zip(tensors, tmp):
                    t.copy_(r)
            return list(tensors)
        return self._work("reduce", [h for h, _ in parts], finish, [n for _, n in parts])

    # ---------------------------------------------------------------- broadcast
    def broadcast(self, tensors, opts=None):
        root = self._global(opts.rootRank if opts is not None else 0, "broadcast")
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        handles, names = [], []
        for t in tensors:
            v = torch.view_as_real(t) if t.is_complex() else t
            self._check(v, "broadcast")
            name = self._name("broadcast", (v.dtype, tuple(v.shape), f"root{root}"))
            handles.append(_collectives._broadcast(v, root, True, name, self._set,
                                                   "broadcast_"))
            names.append(name)
        return self._work("broadcast", handles, names=names, value=list(tensors))

    # ---------------------------------------------------------------- allgather
    def _gather_flat(self, t, what):
        """Submit an allgather of t (flattened); finish gets the flat concatenation."""
        v = torch.view_as_real(t) if t.is_complex() else t
        code = self._check(v, what)
        flat = _flat(v)
        name = self._name("allgather", (v.dtype,))
        req = request.allgather(name, self._set, 1)
        h = _ops.submit((t, flat), lambda res: _tensors.from_engine(res, flat.dtype, ()),
                        **req.fields(code, flat.shape, _tensors.address(flat)))
        return h, name

    def _gather_into(self, out, t, what):
        """Submit an allgather of t written straight into `out` (contiguous, n x t)."""
        code = self._check(t, what)
        inp = _tensors.contiguous(t)
        if inp.dim() == 0:
            inp = inp.reshape(1)
        name = self._name("allgather_into", (t.dtype, tuple(inp.shape[1:])))
        req = request.allgather(name, self._set, inp.dim())

        def finish(res):
            if res.data is not None:            # the engine could not write into out
                got = torch.frombuffer(res.buffer(), dtype=inp.dtype)
                out.view(-1).copy_(got)
            return out
        h = _ops.submit((t, inp, out), finish,
                        **req.fields(code, inp.shape, _tensors.address(inp), _tensors.address(out)))
        return h, name

    def allgather(self, output_lists, input_tensors, opts=None):
        if isinstance(input_tensors, torch.Tensor):
            input_tensors, output_lists = [input_tensors], [output_lists]
        handles, names = [], []
        for t in input_tensors:
            h, n = self._gather_flat(t, "allgather")
            handles.append(h)
            names.append(n)

        def finish(outs):
            for flat, outputs in zip(outs, output_lists):
                _split_into(flat, outputs, "allgather", self.size())
            return [o for outputs in output_lists for o in outputs]
        return self._work("allgather", handles, finish, names)

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        return self.allgather(output_lists, input_tensors, opts)

    def all_gather_single(self, output, input, opts=None):
        if output.numel() != input.numel() * self.size():
            raise ValueError(f"horovodlike: all_gather_into_tensor: the output has "
                             f"{output.numel()} elements; {self.size()} x the input's "
                             f"{input.numel()} expected")
        if output.is_contiguous() and not input.is_complex() and output.dtype == input.dtype:
            h, n = self._gather_into(output, input, "all_gather_into_tensor")
            return self._work("all_gather_into_tensor", [h], lambda _: [output], [n])
        h, n = self._gather_flat(input, "all_gather_into_tensor")

        def finish(outs):
            output.copy_(_from_real(outs[0], output).view(output.shape))
            return [output]
        return self._work("all_gather_into_tensor", [h], finish, [n])

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return _joined(self, "all_gather_into_tensor_coalesced", works, list(outputs))

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(self, output_lists, input_tensors, opts):
        """Every rank's tensor to the root. As an allgather (one collective, n times the
        bytes to every rank): torch's gather is rare on the hot path."""
        root = opts.rootRank
        self._global(root, "gather")
        keep = self.rank() == root
        handles, names = [], []
        for t in input_tensors:
            h, n = self._gather_flat(t, "gather")
            handles.append(h)
            names.append(n)

        def finish(outs):
            if keep:
                for flat, outputs in zip(outs, output_lists):
                    _split_into(flat, outputs, "gather", self.size())
            return [o for outputs in output_lists for o in outputs]
        return self._work("gather", handles, finish, names)

    # ---------------------------------------------------------------- reducescatter
    def _reducescatter(self, out, rows, opts, what):
        """out: this rank's part; rows: a (size, k) input, one row per group rank."""
        op, pre = _reduce_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, what)
        code = self._check(rows, what)
        if op in (request.Sum, request.Average):
            name = self._name("reducescatter", (rows.dtype, tuple(rows.shape), request.OP_NAMES[op], pre))
            req = request.reducescatter(name, op, pre, 1.0, self._set, rows.dim())
            direct = out.is_contiguous() and out.dtype == rows.dtype
            dst = out if direct else torch.empty(rows.shape[1:], dtype=rows.dtype).unsqueeze(0)

            def finish(_):
                if not direct:
                    out.copy_(dst.view(out.shape))
                return out
            h = _ops.submit((rows, dst, out), finish,
                            **req.fields(code, rows.shape, _tensors.address(rows), _tensors.address(dst)))
            return h, name
        # MIN / MAX / PRODUCT: the engine's reducescatter sums; reduce all, keep ours
        tmp = rows.clone()
        h, name = self._allreduce_one(tmp, op, pre, what)
        me = self.rank()
        fin = _collectives.synchronize

        def wrapped():
            fin(h)
            out.copy_(tmp[me].view(out.shape))
            return out
        wrapped.handles = (h,)
        return _Deferred(h, wrapped), name

    def reduce_scatter_single(self, output, input, opts=None):
        n = self.size()
        if input.numel() != output.numel() * n:
            raise ValueError(f"horovodlike: reduce_scatter_tensor: the input has "
                             f"{input.numel()} elements; {n} x the output's "
                             f"{output.numel()} expected")
        rows = _tensors.contiguous(input).view(n, -1)
        h, name = self._reducescatter(output.view(1, -1) if output.is_contiguous() else output,
                                      rows, opts, "reduce_scatter_tensor")
        return self._work("reduce_scatter_tensor", [h], lambda _: [output], [name])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return _joined(self, "reduce_scatter_tensor_coalesced", works, list(outputs))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def reduce_scatter(self, outputs, input_lists, opts=None):
        if isinstance(outputs, torch.Tensor):
            outputs, input_lists = [outputs], [input_lists]
        handles, names = [], []
        for out, parts in zip(outputs, input_lists):
            if len(parts) != self.size():
                raise ValueError(f"horovodlike: reduce_scatter: {len(parts)} inputs for "
                                 f"a group of {self.size()}")
            sizes = {p.numel() for p in parts}
            if len(sizes) == 1:
                rows = torch.stack([_flat(p) for p in parts])
                h, name = self._reducescatter(out.view(1, -1) if out.is_contiguous() else out,
                                              rows, opts, "reduce_scatter")
            else:
                # uneven parts: reduce the whole and keep this rank's part
                flat = torch.cat([_flat(p) for p in parts])
                op, pre = _reduce_op(opts.reduceOp, "reduce_scatter")
                h, name = self._allreduce_one(flat, op, pre, "reduce_scatter")
                start = sum(p.numel() for p in parts[:self.rank()])
                h = _Deferred(h, _slice_into(h, flat, start, out))
            handles.append(h)
            names.append(name)
        return self._work("reduce_scatter", handles, lambda _: list(outputs), names)

    # ---------------------------------------------------------------- alltoall
    def _alltoall(self, inp, splits, what, finish):
        code = self._check(inp, what)
        name = self._name("alltoall", (inp.dtype, tuple(inp.shape[1:])))
        req = request.alltoall(splits, int(inp.shape[0]), name, self._set, inp.dim())
        h = _ops.submit((inp,), lambda res: finish(_tensors.from_engine(
            res, inp.dtype, tuple(inp.shape[1:]))),
            **req.fields(code, inp.shape, _tensors.address(inp), splits=req.splits))
        return h, name

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes,
                          opts=None):
        inp = _tensors.contiguous(input)
        if inp.dim() == 0:
            raise ValueError("horovodlike: all_to_all_single needs a tensor of at least "
                             "one dimension")
        splits = list(input_split_sizes) if input_split_sizes else None
        expect = list(output_split_sizes) if output_split_sizes else None

        def finish(got):
            if got.shape[0] != output.shape[0] or (
                    expect is not None and sum(expect) != got.shape[0]):
                raise ValueError(f"horovodlike: all_to_all_single received {got.shape[0]} "
                                 f"rows; the output has {output.shape[0]}")
            output.copy_(got.view(output.shape))
            return output
        h, name = self._alltoall(inp, splits, "all_to_all_single", finish)
        return self._work("all_to_all_single", [h], lambda _: [output], [name])

    alltoall_base = all_to_all_single

    def alltoall(self, outputs, inputs, opts=None):
        dtypes = {t.dtype for t in list(inputs) + list(outputs)}
        if len(dtypes) != 1:
            raise TypeError("horovodlike: all_to_all needs one dtype for every tensor")
        flat = torch.cat([_flat(t) for t in inputs])
        splits = [t.numel() for t in inputs]

        def finish(got):
            _split_into(got, outputs, "all_to_all", None)
            return list(outputs)
        h, name = self._alltoall(flat, splits, "all_to_all", finish)
        return self._work("all_to_all", [h], lambda _: list(outputs), [name])

    def scatter(self, outputs, input_lists, opts):
        """The root's i-th tensor to group rank i: an alltoall in which only the root
        sends (each rank receives its part alone)."""
        root = opts.rootRank
        self._global(root, "scatter")
        handles, names = [], []
        for i, out in enumerate(outputs):
            n = out.numel()
            if self.rank() == root:
                parts = input_lists[i]
                flat = torch.cat([_flat(p) for p in parts])
                splits = [p.numel() for p in parts]
            else:
                flat = torch.empty(0, dtype=out.dtype)
                splits = [0] * self.size()

            def finish(got, out=out, n=n):
                if got.numel() != n:
                    raise ValueError(f"horovodlike: scatter: received {got.numel()} "
                                     f"elements; the output has {n}")
                out.copy_(got.view(out.shape))
                return out
            h, name = self._alltoall(flat, splits, "scatter", finish)
            handles.append(h)
            names.append(name)
        return self._work("scatter", handles, lambda _: list(outputs), names)

    # ---------------------------------------------------------------- barrier
    def barrier(self, opts=None):
        if self._closed:
            raise dist.DistBackendError(f"horovodlike: barrier on {self._desc()}, which "
                                        f"was destroyed on this rank")
        req = request.barrier(self._set)
        h = _ops.submit((), lambda _: None, **req.fields())
        return self._work("barrier", [h])

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        """A barrier with a limit; a rank that never comes is named by the engine (lost)
        or by the limit's error. torch's dist.monitored_barrier refuses every backend
        but gloo in 2.13; call this on the group (dist.group.WORLD.monitored_barrier)."""
        w = self.barrier()
        w.wait(timeout)

    # ---------------------------------------------------------------- p2p
    def _p2p_name(self, src, dst, tag):
        with self._lock:
            key = ("p2p", src, dst, tag)
            n = self._counts.get(key, 0)
            self._counts[key] = n + 1
        return f"{self._tag}.{src}>{dst}.t{tag}.{n % (WINDOW * 4)}"

    def send(self, tensors, dst, tag=0):
        peer = self._global(dst, "send")
        handles = []
        for t in tensors:
            v = torch.view_as_real(t) if t.is_complex() else t
            self._check(v, "send")
            name = self._p2p_name(basics.rank(), peer, tag)
            handles.append(_collectives.send_async(v, peer, name, self._set))
        return self._work("send", handles, value=list(tensors))

    def recv(self, tensors, src, tag=0):
        peer = self._global(src, "recv")
        handles = []
        for t in tensors:
            v = torch.view_as_real(t) if t.is_complex() else t
            self._check(v, "recv")
            name = self._p2p_name(peer, basics.rank(), tag)
            handles.append(_collectives.recv_async_(v, peer, name, self._set))
        return self._work("recv", handles, value=list(tensors))

    def recv_anysource(self, tensors, tag=0):
        raise ValueError("horovodlike: recv from any source is not supported: the engine "
                         "matches a message by (source, destination, name); pass src=")

    # ---------------------------------------------------------------- sub-groups
    # new_group (dist.new_group delegates to it) is attached by _startup.py, which makes
    # groups: this file then needs nothing of the start-up (no import cycle).

    def shutdown(self):
        """This rank's part of the group ends (teardown is per rank): the engine's own
        shutdown only where this backend started the engine."""
        if self._closed:
            return
        self._closed = True
        if self._owns_engine and basics.is_initialized():
            basics.shutdown()

    def abort(self):
        self.shutdown()


def _sig_text(sig):
    """A signature as readable text: "float32[4,3]", with what else it holds."""
    dtype, *rest = sig
    text = str(dtype).replace("torch.", "")
    for x in rest:
        if isinstance(x, tuple):
            text += "[" + ",".join(map(str, x)) + "]"
        elif isinstance(x, float):
            text += "" if x == 1.0 else f"*{x!r}"
        else:
            text += f".{x}"
    if len(text) > 80:                  # a name stays short; the hash keeps it unique
        text = text[:40] + "~" + hashlib.sha1(text.encode()).hexdigest()[:16]
    return text


class _Deferred:
    """A handle whose output needs a step after the engine's (a callable handle, as
    _collectives.synchronize/poll accept), that still waits on the engine handle."""

    def __init__(self, handle, fn):
        self.handles = (handle,)
        self._fn = fn

    def __call__(self):
        return self._fn()


def _slice_into(h, flat, start, out):
    def fn():
        _collectives.synchronize(h)
        out.copy_(flat[start:start + out.numel()].view(out.shape))
        return out
    return fn


def _from_real(flat, like):
    return torch.view_as_complex(flat.view(-1, 2)) if like.is_complex() else flat


def _split_into(flat, outputs, what, n):
    """Copy a flat concatenation into `outputs` in order (each its own numel)."""
    flat = flat.reshape(-1)
    total = sum(o.numel() * (2 if o.is_complex() else 1) for o in outputs)
    if flat.numel() != total:
        raise ValueError(f"horovodlike: {what}: received {flat.numel()} elements; the "
                         f"outputs hold {total}" + (f" ({n} tensors)" if n else ""))
    at = 0
    for o in outputs:
        k = o.numel() * (2 if o.is_complex() else 1)
        part = flat[at:at + k]
        o.copy_(_from_real(part, o).view(o.shape))
        at += k


def _joined(group, what, works, value):
    """One Work for several: done when all are."""
    handles = [h for w in works for h in w._handles]
    finishes = [(w, len(w._handles)) for w in works]

    def finish(outs):
        at = 0
        for w, k in finishes:
            if w._finish is not None:
                w._finish(outs[at:at + k])
            at += k
        return value
    out = Work(what, handles, finish, works[0]._timeout if works else None)
    out._names = tuple(n for w in works for n in w._names)
    with group._lock:
        for n in out._names:
            group._last[n] = out
    for w in works:          # the parts are finished through the joined Work
        w._handles, w._done = [], True
    return out

