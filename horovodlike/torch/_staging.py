"""Staging: torch tensors the engine cannot read in place go through host buffers, in
pieces, on a staging thread.

The engine reads and writes host memory only. A CUDA tensor (with
HOROVODLIKE_EXPERIMENTAL_CUDA=1), or any CPU tensor when HOROVODLIKE_FORCE_STAGING=1,
takes this path instead of being handed to the engine by address:

    caller thread                      staging thread (one per process)
    -------------                      --------------------------------
    record "ready" on the tensor's     per piece, as soon as it can:
    current stream (Horovod: the op      1. take a host buffer from the pool and copy the
    waits for work queued there)            piece into it (D2H, on a copy stream that
    hand the op to the staging thread       waits for "ready"); mark its completion
    return a handle                      2. once that copy completed: enqueue the piece
                                            as one engine op (reduced on the CPU)
    synchronize(handle): wait until      3. once the engine finished it: copy the result
    every piece is back; the output         into the output (H2D, on a second copy stream)
    is then ready for every stream       4. once that copy completed: the buffer goes back
                                            to the pool; the last piece completes the op

A tensor is cut into pieces of about HOROVODLIKE_STAGING_PIECE_BYTES (4 MiB) along its
first dimension (so a shape mismatch between ranks is still caught by the engine). Every
piece of every op is in flight at once, each at its own stage: piece k+1 is copied to
the host while piece k is reduced and piece k-1 is copied back. The pool never makes a
piece wait for a buffer: a bounded pool would let two ranks each hold every buffer for
an op the other has not started yet, and wait forever.

Cost model, for an allreduce of S bytes in n pieces of P bytes (S = nP), with copy
bandwidth B (pinned PCIe ~25 GB/s each way, the two directions on separate copy
engines), reduction time R(S) of the engine, and an engine op overhead o (~30 us):

    staged in one piece:   S/B + R(S) + S/B                 (nothing overlaps)
    staged in n pieces:    P/B + max(S/B, R(S) + n*o) + P/B  (the stages overlap)

so the pipeline hides the copies behind the reduction once P << S, for n*o extra; 4 MiB
keeps n*o under 1% of R for sizes where it matters. The pool turns each piece's buffer
into a free-list lookup instead of a pinned allocation (which locks pages, far slower
than a pop); pinned memory is what makes the copies asynchronous and full speed.
The staging thread polls: it blocks in the engine's wait with a 0.5 ms timeout while
pieces are reduced, and sleeps 0.1 ms between looks at pending CUDA copies.

Fusion: many small tensors of one grouped allreduce (DistributedOptimizer groups) are
packed per dtype and device into one flat tensor first, which is staged as ONE op (a
device-side concatenation instead of one copy and one engine op per tensor); the
optimizer's buckets already are one flat tensor per dtype and device. Single small
tensors are still separate engine ops, which the engine fuses as it fuses CPU ones.

Only the copier below touches CUDA (streams, events, pinned memory through torch's
public API); with HOROVODLIKE_FORCE_STAGING=1 a CPU tensor goes through exactly the
same pieces, pool and thread, with plain copies in place of CUDA ones.

Every rank must stage an op alike: put it on the same kind of device on every rank (a
staged op of several pieces is negotiated under piece names that an unstaged one does
not use), as Horovod requires the same device on every rank.
"""
import collections
import os
import threading
import time

import torch

from horovodlike.common import ops as _ops
from horovodlike.common.exceptions import HorovodInternalError

from ._tensors import env_flag, from_engine

DEFAULT_PIECE_BYTES = 4 << 20
DEFAULT_POOL_BYTES = 512 << 20
_MIN_CLASS = 4096
_REDUCE_WAIT = 0.0005         # the staging thread's wait in the engine, per look
_COPY_POLL = 0.0001           # its sleep between looks at pending CUDA copies


def _env_bytes(name, default):
    text = os.environ.get(name, "")
    if not text.strip():
        return default
    try:
        value = int(float(text))
    except ValueError:
        raise ValueError(f"{name} must be a number of bytes, got {text!r}") from None
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {text!r}")
    return value


def forced():
    """HOROVODLIKE_FORCE_STAGING=1: CPU tensors are staged too (tests the path on CPU)."""
    return env_flag("HOROVODLIKE_FORCE_STAGING")


def wanted(tensor):
    """Whether an op on `tensor` goes through staging."""
    return tensor.device.type == "cuda" or (tensor.device.type == "cpu" and forced())


# ------------------------------------------------------------------ counters

_stats = collections.Counter()
_stats_lock = threading.Lock()


def _count(**kw):
    with _stats_lock:
        _stats.update(kw)


def stats():
    """What staging did in this process: ops, pieces, bytes staged, fused groups, pool
    allocations and reuses. Tests read it to prove the path ran."""
    with _stats_lock:
        return dict(_stats)


# ------------------------------------------------------------------ pool

class _Pool:
    """Host buffers kept for reuse, per power-of-two size class and pinned or not. A
    take never waits (see the module docstring); a buffer given back is kept while the
    pool holds less than HOROVODLIKE_STAGING_POOL_BYTES, freed otherwise."""

    def __init__(self):
        self._free = collections.defaultdict(list)
        self._kept = 0
        self._lock = threading.Lock()

    @staticmethod
    def _class(nbytes):
        return max(_MIN_CLASS, 1 << (max(nbytes, 1) - 1).bit_length())

    def take(self, nbytes, pinned):
        """A buffer of at least nbytes (pinned: page-locked for CUDA copies)."""
        size = self._class(nbytes)
        with self._lock:
            free = self._free[(size, pinned)]
            buf = free.pop() if free else None
            if buf is not None:
                self._kept -= size
        if buf is not None:
            _count(pool_reuses=1)
            return buf
        _count(pool_allocs=1)
        return torch.empty(size, dtype=torch.uint8, pin_memory=pinned)

    def give(self, buf, pinned):
        size = buf.numel()
        with self._lock:
            if self._kept + size <= _env_bytes("HOROVODLIKE_STAGING_POOL_BYTES",
                                               DEFAULT_POOL_BYTES):
                self._free[(size, pinned)].append(buf)
                self._kept += size


_pool = _Pool()


def _host_view(buf, dtype, shape):
    n = 1
    for d in shape:
        n *= d
    return buf[:n * dtype.itemsize].view(dtype).view(shape)


# ------------------------------------------------------------------ copiers

class _Done:
    """The completion mark of a copy that has already happened."""

    @staticmethod
    def query():
        return True


class _HostCopier:
    """CPU tensors forced through staging: plain copies, done when issued."""

    def ready(self):
        return None

    def host_buffer(self, nbytes):
        return _pool.take(nbytes, pinned=False)

    def give_back(self, buf):
        _pool.give(buf, pinned=False)

    def to_host(self, dst, src, ready):
        dst.copy_(src)
        return _Done

    def to_device(self, dst, src, ready):
        dst.copy_(src)
        return _Done

    def empty(self, shape, dtype):
        return torch.empty(shape, dtype=dtype)

    def hand_over(self, tensor):
        pass


class _CudaCopier:
    """One CUDA device's copies, through torch's public CUDA API only: a stream for each
    direction (so D2H and H2D run on both copy engines at once), events as completion
    marks, pinned pool buffers."""

    def __init__(self, device):
        self.device = device
        with torch.cuda.device(device):
            self.d2h = torch.cuda.Stream(device)
            self.h2d = torch.cuda.Stream(device)

    def host_buffer(self, nbytes):
        # Under the device: a pinned allocation made on the staging thread would otherwise
        # open a context on GPU 0 for every process.
        with torch.cuda.device(self.device):
            return _pool.take(nbytes, pinned=True)

    def give_back(self, buf):
        _pool.give(buf, pinned=True)

    def ready(self):
        """An event after every piece of work queued so far on the caller's current
        stream: the staged copies wait for it (Horovod's semantics)."""
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(self.device))
        return ev

    def _copy(self, stream, dst, src, ready, device_tensor):
        with torch.cuda.device(self.device), torch.cuda.stream(stream):
            stream.wait_event(ready)
            # The caching allocator must not hand this memory out again before the copy
            # on the side stream has run.
            device_tensor.record_stream(stream)
            dst.copy_(src, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(stream)
        return ev

    def to_host(self, dst, src, ready):
        return self._copy(self.d2h, dst, src, ready, src)

    def to_device(self, dst, src, ready):
        # Waits for "ready" too: an output allocated on the caller's stream may still be
        # memory that stream's earlier work uses.
        return self._copy(self.h2d, dst, src, ready, dst)

    def empty(self, shape, dtype):
        with torch.cuda.device(self.device), torch.cuda.stream(self.h2d):
            return torch.empty(shape, dtype=dtype, device=self.device)

    def hand_over(self, tensor):
        """An output allocated on the copy stream is used on the caller's stream now."""
        tensor.record_stream(torch.cuda.current_stream(self.device))


_host_copier = _HostCopier()
_cuda_copiers = {}
_copier_lock = threading.Lock()


def _copier(device):
    if device.type == "cpu":
        return _host_copier
    with _copier_lock:
        c = _cuda_copiers.get(device)
        if c is None:
            c = _cuda_copiers[device] = _CudaCopier(device)
        return c


# ------------------------------------------------------------------ ops and pieces

NEW, COPYING_IN, REDUCING, COPYING_OUT, DONE = range(5)


class _Piece:
    """One engine op's worth of a staged op, and the stage it is at."""
    __slots__ = ("op", "src", "fields", "out_bytes", "deliver", "state", "mark", "host_in",
                 "host_out", "handle", "result")

    def __init__(self, op, src, fields, out_bytes, deliver):
        self.op, self.src, self.fields = op, src, fields
        self.out_bytes = out_bytes    # None: output in place in host_in; 0: engine allocates
        self.deliver = deliver        # (piece, engine result) -> (device dst, host src)
        self.state, self.mark, self.handle, self.result = NEW, None, None, None
        self.host_in = self.host_out = None

    def advance(self):
        """Move on as far as possible without waiting; True if anything moved."""
        moved = False
        while True:
            before = self.state
            try:
                self._step()
            except Exception as e:  # noqa: BLE001 - the op reports it at synchronize()
                self.op.fail(e)
                self._release()
                self.state = DONE
            if self.state == before:
                return moved
            moved = True
            if self.state == DONE:
                self.op.piece_done()
                return True

    def _step(self):
        op, copier = self.op, self.op.copier
        if self.state == NEW:
            self.host_in = copier.host_buffer(self.src.numel() * self.src.element_size())
            view = _host_view(self.host_in, self.src.dtype, tuple(self.src.shape))
            self.mark = copier.to_host(view, self.src, op.ready)
            self.src = view
            self.state = COPYING_IN
        elif self.state == COPYING_IN and self.mark.query():
            # Submitted even after an earlier piece failed: the other ranks may have
            # submitted theirs, and the engine completes it (or fails it) for everyone.
            out_ptr = self.src.data_ptr() if self.out_bytes is None else 0
            if self.out_bytes:
                self.host_out = copier.host_buffer(self.out_bytes)
                out_ptr = self.host_out.data_ptr()
            fields = self.fields(self.host_in.data_ptr(), out_ptr)
            self.handle = _ops.submit((self.host_in, self.host_out), lambda res: res, **fields)
            _count(pieces=1, bytes=self.src.numel() * self.src.element_size())
            self.state = REDUCING
        elif self.state == REDUCING and self._reduced():
            self.result = _ops.synchronize(self.handle)
            dst, src = self.deliver(self, self.result)
            self.mark = copier.to_device(dst, src, op.ready) if dst is not None else _Done
            self.state = COPYING_OUT
        elif self.state == COPYING_OUT and self.mark.query():
            self._release()
            self.state = DONE

    def _reduced(self):
        try:
            return _ops.poll(self.handle)
        except ValueError:
            raise HorovodInternalError("horovodlike was shut down while a staged op was in "
                                       "flight") from None

    def _release(self):
        for buf in (self.host_in, self.host_out):
            if buf is not None:
                self.op.copier.give_back(buf)
        self.host_in = self.host_out = self.result = None

    def wait_hint(self):
        """How the staging thread may block for this piece: an engine handle to wait on,
        or None (poll a CUDA copy after a short sleep)."""
        return self.handle if self.state == REDUCING else None


class Handle:
    """What a staged *_async call returns; synchronize() (or calling it) gives the
    output, poll() says whether it is ready."""

    def __init__(self, device, keep, finish):
        self.copier = _copier(device)
        self.keep, self._finish = keep, finish
        self.pieces, self.error = [], None
        self._left = 0
        self._done = threading.Event()
        self._collected = False
        self.ready = None

    def add(self, src, fields, deliver, out_bytes=None):
        self.pieces.append(_Piece(self, src, fields, out_bytes, deliver))

    def start(self):
        """Record where the caller's stream is, and hand the pieces over."""
        self.ready = self.copier.ready()
        self._left = len(self.pieces)
        _count(ops=1)
        if not self.pieces:
            self._done.set()
        else:
            _stager().add(self)
        return self

    def fail(self, e):
        if self.error is None:
            self.error = e

    def piece_done(self):
        self._left -= 1            # only the staging thread changes it
        if self._left == 0:
            self._done.set()

    def poll(self):
        return self._done.is_set()

    def __call__(self):
        if self._collected:
            raise ValueError("unknown or already synchronized handle (a staged op)")
        while not self._done.wait(0.5):     # short waits: Ctrl-C is honoured between them
            pass
        self._collected = True
        if self.error is not None:
            raise self.error
        out = self._finish()
        for t in (out if isinstance(out, (list, tuple)) else (out,)):
            if isinstance(t, torch.Tensor) and t.device.type == "cuda":
                self.copier.hand_over(t)
        return out

    synchronize = __call__


class _Stager(threading.Thread):
    """The staging thread: moves every piece of every staged op through its stages."""

    def __init__(self):
        super().__init__(name="horovodlike-staging", daemon=True)
        self._new = collections.deque()
        self._cv = threading.Condition()

    def add(self, op):
        with self._cv:
            self._new.append(op)
            self._cv.notify()

    def run(self):
        active = []
        while True:
            with self._cv:
                while not self._new and not active:
                    self._cv.wait()
                while self._new:
                    active.extend(self._new.popleft().pieces)
            moved = False
            for piece in active:
                moved |= piece.advance()
            active = [p for p in active if p.state != DONE]
            if not moved and active:
                self._idle(active)

    def _idle(self, active):
        for piece in active:
            h = piece.wait_hint()
            if h is not None:
                try:
                    _ops.wait(h, _REDUCE_WAIT)
                except Exception:  # noqa: BLE001 - advance() reports it
                    pass
                return
        time.sleep(_COPY_POLL)


_stager_lock = threading.Lock()
_stager_thread = None


def _stager():
    global _stager_thread
    with _stager_lock:
        if _stager_thread is None or not _stager_thread.is_alive():
            _stager_thread = _Stager()
            _stager_thread.start()
        return _stager_thread


def _forget_all():
    """A forked child has no staging thread; it starts its own when it needs one."""
    global _stager_thread
    _stager_thread = None


os.register_at_fork(after_in_child=_forget_all)


# ------------------------------------------------------------------ the collectives

def _rows_per_piece(tensor):
    if tensor.dim() == 0 or tensor.shape[0] == 0:
        return 0
    row_bytes = tensor[0].numel() * tensor.element_size()
    piece = _env_bytes("HOROVODLIKE_STAGING_PIECE_BYTES", DEFAULT_PIECE_BYTES)
    return max(1, piece // max(row_bytes, 1))


def _piece_name(name, k, n):
    return name if n == 1 else f"{name}.piece{k}of{n}"


def same_shape(tensor, buf, out, code, req, finish):
    """allreduce / broadcast of `buf` (a contiguous form of `tensor`) into `out`, in
    pieces of rows; finish() gives the output once every piece is back."""
    h = Handle(buf.device, (tensor, buf, out), finish)
    rows = _rows_per_piece(buf)
    bounds = [(0, None)] if rows == 0 else \
        [(a, min(a + rows, buf.shape[0])) for a in range(0, buf.shape[0], rows)]
    n = len(bounds)
    for k, (a, b) in enumerate(bounds):
        src = buf if b is None else buf[a:b]
        dst = out if b is None else out[a:b]
        r = req.renamed(_piece_name(req.name, k, n))

        def fields(in_ptr, out_ptr, r=r, shape=tuple(src.shape)):
            return r.fields(code, shape, in_ptr, out_ptr)

        h.add(src, fields, lambda piece, _res, dst=dst: (dst, piece.src))
    return h.start()


def gathered(tensor, buf, code, req, finish, splits=None):
    """allgather / alltoall: one piece; the engine allocates the output on the host, the
    staging thread copies it into a new tensor on the tensor's device. finish(output,
    result) gives what synchronize() returns."""
    box = {}
    h = Handle(buf.device, (tensor, buf), lambda: finish(box["out"], box["res"]))
    dtype, tail = buf.dtype, tuple(buf.shape[1:])

    def fields(in_ptr, _out_ptr):
        return req.fields(code, buf.shape, in_ptr, splits=splits)

    def deliver(piece, res):
        host = from_engine(res, dtype, tail)
        box["res"] = res
        box["out"] = out = h.copier.empty(tuple(host.shape), dtype)
        return out, host

    h.add(buf, fields, deliver, out_bytes=0)
    return h.start()


def reducescatter(tensor, buf, out, code, req):
    """reducescatter: the input in one piece, this rank's rows into `out`."""
    h = Handle(buf.device, (tensor, buf, out), lambda: out)

    def fields(in_ptr, out_ptr):
        return req.fields(code, buf.shape, in_ptr, out_ptr)

    def deliver(piece, _res):
        return out, _host_view(piece.host_out, out.dtype, tuple(out.shape))

    h.add(buf, fields, deliver, out_bytes=max(out.numel() * out.element_size(), 1))
    return h.start()


def fused_allreduce(tensors, bufs, code, req, inplace, write_back):
    """One staged allreduce for many tensors of one dtype and device: packed into one flat
    tensor (on their device), reduced as one op, unpacked at synchronize(). Returns the
    handle; its output is the list of outputs (the tensors themselves when in place)."""
    flat = torch.cat([b.reshape(-1) for b in bufs])
    _count(fused_groups=1, fused_tensors=len(bufs))

    def finish():
        outs, offset = [], 0
        for t, b in zip(tensors, bufs):
            n = b.numel()
            piece = flat[offset:offset + n].view_as(b)
            offset += n
            if inplace:
                b.copy_(piece)
                outs.append(write_back(t, b))
            else:
                outs.append(piece)
        return outs
    return same_shape(tensors, flat, flat, code, req, finish)
