"""What a collective call means, decided once for every binding.

A binding (numpy, torch, TensorFlow) turns its tensor into a buffer and allocates the
output. Everything else about a call is decided here, and comes back as a validated
`Request`:

- the engine name. `name=x` becomes "<kind>.x"; an unnamed op is numbered per op kind
  and per process set ("allreduce.noname.3"), so ranks that run different unnamed ops
  inside their own sets still agree on the numbers of the global ones, and per thread
  (see `Counters`), so unnamed ops from several threads cannot pair wrongly. An op on a set
  other than the global one carries the set's id ("...@set2"): every set negotiates
  apart. A binding may number unnamed ops its own way by passing a `namer` (TensorFlow
  numbers the ops traced into a graph per graph, when they are traced).
- the reduction op: Horovod's op=/average= pair. Adasum is refused here, for every
  binding.
- the root of a broadcast: a GLOBAL rank, also with a process set (as in Horovod and in
  the engine), which must be a member of the set.
- alltoall splits, the rows a reducescatter leaves on this rank, the pre/post scale
  factors, the process set, and that this rank is a member of it.

Every check runs before a name is taken: a refused call must not use up an unnamed op's
number, or this rank's later unnamed ops would stop matching the other ranks'.

A call that repeats one already made (same name, op, scales, process set, and the same
tensor facts its binding names) takes a cached fast path: see `allreduce_key`.

This module also holds the two helpers every binding needs around requests:
`wait_all` (wait for every handle of a group, then raise the first error) and
`split_list` (Horovod's split of a list into n nearly equal parts).
"""
import dataclasses
import itertools
import operator
import threading
import warnings
from typing import Optional, Tuple

from . import basics, engine, process_sets
from .process_sets import ProcessSet, global_process_set, set_id

Average, Sum, Adasum, Min, Max, Product = (engine.AVERAGE, engine.SUM, engine.ADASUM,
                                           engine.MIN, engine.MAX, engine.PRODUCT)
OP_NAMES = {Average: "Average", Sum: "Sum", Min: "Min", Max: "Max", Product: "Product",
            Adasum: "Adasum"}

KINDS = {"allreduce": engine.ALLREDUCE, "allgather": engine.ALLGATHER,
         "broadcast": engine.BROADCAST, "alltoall": engine.ALLTOALL,
         "reducescatter": engine.REDUCESCATTER, "barrier": engine.BARRIER,
         "join": engine.JOIN, "send": engine.SEND, "recv": engine.RECV}


# ------------------------------------------------------------------ names

class Counters:
    """Numbers for unnamed ops, one sequence per (op kind, process set).

    per_thread: one sequence per thread as well. Unnamed ops pair across ranks by their
    number, so ops submitted from several threads at once would take numbers in
    whatever order the threads happen to run on each rank, and pair with the wrong
    tensors of other ranks. The main thread's ops keep the plain numbers; another
    thread's carry its name ("allreduce.noname.3@thread:loader"), so they pair with the
    ops of the same-named thread of every rank (threads made in the same order get the
    same default names). Two live threads of one name cannot be told apart: their
    unnamed ops are refused with an error saying so."""

    def __init__(self, per_thread=False):
        self._next = {}
        self._owner = {}           # thread name -> the live thread numbering under it
        self._per_thread = per_thread
        self._lock = threading.Lock()

    def next(self, kind, sid):
        tag = self._thread_tag(kind) if self._per_thread else ""
        with self._lock:
            c = self._next.setdefault((kind, sid, tag), itertools.count())
            n = str(next(c))
        return f"{n}@thread:{tag}" if tag else n

    def _thread_tag(self, kind):
        me = threading.current_thread()
        if me is threading.main_thread():
            return ""
        with self._lock:
            owner = self._owner.get(me.name)
            if owner is not None and owner is not me and owner.is_alive():
                raise ValueError(
                    f"unnamed {kind} from thread {me.name!r}: another live thread of that "
                    f"name also submits unnamed ops. Ranks pair unnamed ops of other "
                    f"threads by thread name and number, so give the threads distinct "
                    f"names (threading.Thread(name=...)) or pass name= to the op")
            self._owner[me.name] = me
        return me.name

    def reset(self):
        """Number from 0 again (every member of a new elastic round does)."""
        with self._lock:
            self._next.clear()
            self._owner.clear()


counters = Counters(per_thread=True)   # the process-wide numbering (eager calls)


def engine_name(kind, name, sid, namer=None):
    """The name the engine negotiates an op under (see the module docstring)."""
    if name is None:
        base = f"{kind}.noname.{(namer or counters).next(kind, sid)}"
    else:
        base = f"{kind}.{name}"
    return base if sid == 0 else f"{base}@set{sid}"


def member_names(base, n):
    """Names for the n members of a group op named `base`."""
    return [f"{base}.{i}" for i in range(n)]


# ------------------------------------------------------------------ arguments

def resolve_set(process_set):
    """(ProcessSet, engine id) for a process_set= argument; None means the global set."""
    ps = global_process_set if process_set is None else process_set
    if not isinstance(ps, ProcessSet):
        raise TypeError(f"process_set must be a hvd.ProcessSet, got {type(ps).__name__}")
    return ps, set_id(ps)


def member_index(ps, what):
    """This rank's index in the set; a clear error when it is not a member."""
    i = ps.rank()
    if i is None:
        raise ValueError(f"{what}: rank {basics.rank()} is not a member of {ps!r}")
    return i


def reduce_op(op, average=None, what="allreduce", sum_or_average=False):
    """Horovod's op=/average= pair as an engine reduce op: op wins, average= is the
    deprecated spelling, the default is Average. Adasum is not implemented.
    what=None: messages without the caller's name (the optimizers' argument rules,
    whose messages are the same in every binding)."""
    prefix = f"{what}: " if what else ""
    if op is not None and average is not None:
        raise ValueError(f"{prefix}pass op= or average=, not both")
    if average is not None:
        warnings.warn("average= is deprecated; use op=hvd.Average or op=hvd.Sum",
                      DeprecationWarning, stacklevel=4)
        op = Average if average else Sum
    op = Average if op is None else op
    if isinstance(op, bool) or not isinstance(op, int) or op not in OP_NAMES:
        raise ValueError(f"{prefix}op={op!r} is an unknown reduction op; use one of "
                         f"hvd.Average, hvd.Sum, hvd.Min, hvd.Max, hvd.Product")
    if op == Adasum:
        raise NotImplementedError(f"{prefix}op=hvd.Adasum is not implemented in "
                                  f"horovodlike; use op=hvd.Average (the default) or "
                                  f"op=hvd.Sum")
    if sum_or_average and op not in (Average, Sum):
        raise ValueError(f"{what} supports op=hvd.Average and op=hvd.Sum only, got "
                         f"hvd.{OP_NAMES[op]}")
    return op


def scale(value, what, which):
    """A pre/post scale factor as a float."""
    if isinstance(value, bool):
        raise TypeError(f"{what}: {which} must be a number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{what}: {which} must be a number, got {value!r}") from None


def _as_int(value, what, which):
    try:
        if isinstance(value, (bool, float)):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what}: {which} must be an int, got {value!r}") from None


def root(ps, root_rank, what):
    """root_rank as the engine takes it: a global rank, and a member of the set."""
    r = _as_int(root_rank, what, "root_rank")
    if set_id(ps) == 0:
        if not 0 <= r < basics.size():
            raise ValueError(f"{what}: root_rank {r} is not a rank of the job "
                             f"(size {basics.size()})")
    elif r not in ps.ranks:
        raise ValueError(f"{what}: root_rank {r} is not a member of {ps!r}; root_rank is a "
                         f"global rank, also with a process set")
    return r


def splits_list(splits, rows, n, what):
    """alltoall splits as a list of n non-negative ints adding up to `rows` (the
    tensor's first dimension; None when not known yet, which skips that check).
    splits=None splits the rows evenly."""
    if splits is None:
        if rows is None:
            return None
        if rows % n:
            raise ValueError(f"{what}: the first dimension ({rows}) cannot be split evenly "
                             f"over {n} ranks; pass splits=")
        return [rows // n] * n
    if hasattr(splits, "reshape") and hasattr(splits, "tolist"):   # numpy, torch
        values = splits.reshape(-1).tolist()
    else:
        try:
            values = list(splits)
        except TypeError:
            raise TypeError(f"{what}: splits must be a list or tensor of integers, got "
                            f"{type(splits).__name__}") from None
    out = []
    for v in values:
        if isinstance(v, (bool, float)) or not hasattr(v, "__index__"):
            # ValueError, as Horovod raises it (scripts catch that type).
            raise ValueError(f"{what}: splits must be integers, got {v!r}")
        out.append(operator.index(v))
    if len(out) != n:
        raise ValueError(f"{what}: {len(out)} splits given for a process set of {n} ranks; "
                         f"give one split per rank")
    if any(v < 0 for v in out):
        raise ValueError(f"{what}: splits must not be negative, got {out}")
    if rows is not None and sum(out) != rows:
        raise ValueError(f"{what}: splits add up to {sum(out)} rows but the tensor's first "
                         f"dimension is {rows}")
    return out


def reducescatter_rows(first_dim, process_set=None):
    """Rows of a reducescatter's output on this rank: the set's ranks in order take
    first_dim // n rows, and the lower ones one more for the remainder."""
    ps, _ = resolve_set(process_set)
    n, i = ps.size(), member_index(ps, "reducescatter")
    return first_dim // n + (1 if i < first_dim % n else 0)


def need_dims(ndim, what, verb):
    """ndim: the tensor's number of dimensions (a list of them for a group; None when
    not known yet)."""
    if isinstance(ndim, (list, tuple)):
        for n in ndim:
            need_dims(n, what, verb)
    elif ndim is not None and ndim == 0:
        raise ValueError(f"{what} needs a tensor with at least one dimension to {verb}; "
                         f"got a scalar (reshape it to [1])")


# ------------------------------------------------------------------ requests

@dataclasses.dataclass(frozen=True)
class Request:
    """One validated collective call, short of its buffers."""
    kind: str
    name: str
    process_set: ProcessSet
    set_id: int
    set_size: int
    index: Optional[int]              # this rank's index in the set
    reduce_op: int = engine.SUM
    prescale: float = 1.0
    postscale: float = 1.0
    root_rank: int = 0                # a global rank
    splits: Optional[Tuple[int, ...]] = None
    splits_given: bool = False

    @property
    def is_root(self):
        return basics.rank() == self.root_rank

    def rows(self, first_dim):
        """Rows of this rank's reducescatter output (reducescatter_rows)."""
        return reducescatter_rows(first_dim, self.process_set)

    def alltoall_splits(self, rows, splits=None):
        """The splits to send for a tensor of `rows` rows: those given at build time,
        `splits` given now (a graph's run time), or an even split; checked."""
        if splits is None and self.splits is not None:
            splits = self.splits
        return splits_list(splits, rows, self.set_size, self.kind)

    def fields(self, dtype=0, shape=(), input_ptr=0, output_ptr=0, splits=None,
               recv_into=False):
        """Keyword arguments for engine.enqueue (ops.submit)."""
        f = dict(op=KINDS[self.kind], name=self.name, dtype=dtype, shape=tuple(shape),
                 input_ptr=input_ptr, output_ptr=output_ptr, reduce_op=self.reduce_op,
                 root_rank=self.root_rank, prescale=self.prescale,
                 postscale=self.postscale, process_set=self.set_id, splits=splits)
        if recv_into:
            f["recv_into"] = True
        return f

    def renamed(self, name):
        return dataclasses.replace(self, name=name)


def _request(kind, what, name, process_set, namer, members=None, fixed=False, **fields):
    """fixed: the op's kind is its whole name (with the set's id), unnamed or not."""
    ps, sid = resolve_set(process_set)
    index = member_index(ps, what) if sid else basics.rank()
    if "root_rank" in fields:
        fields["root_rank"] = root(ps, fields["root_rank"], what)
    if fixed:
        base = kind if sid == 0 else f"{kind}@set{sid}"
    else:
        base = engine_name(("grouped_" + kind) if members is not None else kind, name, sid, namer)
    req = Request(kind, base, ps, sid, ps.size(), index, **fields)
    if members is None:
        return req
    return [req.renamed(n) for n in member_names(base, members)]


def allreduce(name=None, op=None, average=None, prescale_factor=1.0, postscale_factor=1.0,
              process_set=None, what="allreduce", namer=None, members=None):
    """An allreduce (members=n: n requests of one group, named together)."""
    op = reduce_op(op, average, what)
    pre = scale(prescale_factor, what, "prescale_factor")
    post = scale(postscale_factor, what, "postscale_factor")
    return _request("allreduce", what, name, process_set, namer, members, reduce_op=op,
                    prescale=pre, postscale=post)


# ------------------------------------------------------------------ the cached fast path
#
# Cost model: at 1 rank a 4 KiB allreduce spends most of its 10-15 us in Python, and of
# that most in deciding, again, what a call that repeats the last one means: the op and
# scale checks, the set lookup, the name, a frozen Request, the fields dict, and the
# engine's twenty cffi fields (docs/benchmarks.md, "Small ops, the next cut"). A
# training loop makes the same named calls on tensors of the same kind every step. So
# a named allreduce whose arguments were all accepted once keeps its filled-in engine
# request (engine.Prepared) under a key of everything the checks looked at; the next
# call with an equal key only checks what the key cannot hold (the tensor is still
# contiguous, its binding's per-call facts) and enqueues.
#
# What the key must hold so that the fast path never accepts a call the slow path
# refuses, nor gives it another meaning:
# - the name, only when it is a str (True == 1 would alias two names), and no average=
#   (the slow path warns that it is deprecated on every call);
# - op, only an int or None (True == 1 again), and each scale with its type (the slow
#   path refuses a bool) and, for zero, its sign (0.0 == -0.0 but scales differently);
# - the process set by identity and current id: equal sets compare equal by their
#   ranks, but an unregistered copy must still be refused. Ids change only through
#   process_sets, whose `changes` count empties every cache;
# - the tensor facts the binding passes (dtype with byte order, shape, device...).
# Unnamed ops are never cached: each call takes a new number.

PREPARED_MAX = 1024     # a loop naming each call anew (f"grad.{step}") must not grow this


class _Prepared(threading.local):
    """This thread's cache (an engine.Prepared belongs to one thread)."""

    def __init__(self):
        self.entries = {}
        self.changes = None


_prepared = _Prepared()


def _scale_key(v):
    return (type(v), v if v else str(v))


def allreduce_key(name, op, average, prescale_factor, postscale_factor, process_set,
                  facts):
    """The cache key of an allreduce call, or None when it cannot be cached.
    facts: a hashable tuple of the tensor's facts that the binding's checks read."""
    if type(name) is not str or average is not None or not (op is None or type(op) is int):
        return None
    if type(prescale_factor) not in (float, int) or type(postscale_factor) not in (float, int):
        return None
    ps = _set_key(process_set)
    if ps is False:
        return None
    return (name, op, _scale_key(prescale_factor), _scale_key(postscale_factor), ps, facts)


def _set_key(process_set):
    """A process_set= argument in a cache key: None (the global set), (identity, id), or
    False when it cannot be cached."""
    if process_set is None:
        return None
    if type(process_set) is ProcessSet:
        return (id(process_set), process_set.process_set_id)
    return False


def cached(key):
    """The value remembered under key on this thread, or None."""
    c = _prepared
    if c.changes != process_sets.changes:
        c.entries.clear()
        c.changes = process_sets.changes
    return c.entries.get(key)


def generation():
    """Read before the slow path's checks, passed to remember() after them."""
    return process_sets.changes


def remember(key, value, seen):
    """Keep value under key, unless process sets changed since `seen` (generation()
    read before the checks that value stands for)."""
    c = _prepared
    if seen != process_sets.changes or c.changes != seen:
        return
    if len(c.entries) >= PREPARED_MAX:
        c.entries.clear()
    c.entries[key] = value


def p2p_key(kind, name, peer, process_set, facts):
    """The cache key of a named send or recv_ (kind) to or from peer, or None when it
    cannot be cached. What it holds, as allreduce_key: the name only as a str (unnamed
    ops take a new number every call), the peer only as an int (True == 1), the set by
    identity and id, and the array's facts (dtype with its byte order, shape); the
    checks of request.p2p depend on nothing else."""
    ps = None if process_set is None else _set_key(process_set)
    if type(name) is not str or type(peer) is not int or ps is False:
        return None
    return (kind, name, peer, ps, facts)


def prepare(req, code, shape, recv_into=False):
    """An engine.Prepared for a validated Request on a tensor of this dtype code and
    shape (raises the same errors engine.enqueue would)."""
    f = req.fields(code, shape)
    return engine.Prepared(f["op"], f["name"], code, f["shape"], f["reduce_op"],
                           f["root_rank"], f["prescale"], f["postscale"], f["process_set"],
                           recv_into=recv_into)


def allgather(name=None, process_set=None, ndim=None, what="allgather", namer=None,
              members=None):
    need_dims(ndim, what, "concatenate on")
    return _request("allgather", what, name, process_set, namer, members)


def broadcast(root_rank, name=None, process_set=None, what="broadcast", namer=None,
              members=None):
    return _request("broadcast", what, name, process_set, namer, members,
                    root_rank=root_rank)


def alltoall(splits=None, rows=None, name=None, process_set=None, ndim=None, what="alltoall",
             namer=None):
    """An alltoall. Splits known now are checked now (against `rows` when known);
    splits that only exist at run time are checked by Request.alltoall_splits."""
    need_dims(ndim, what, "split on")
    ps, _ = resolve_set(process_set)
    given = splits is not None
    checked = splits_list(splits, rows, ps.size(), what)
    return _request("alltoall", what, name, process_set, namer,
                    splits=None if checked is None else tuple(checked), splits_given=given)


def reducescatter(name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                  process_set=None, ndim=None, what="reducescatter", namer=None, members=None):
    need_dims(ndim, what, "scatter on")
    op = reduce_op(op, None, what, sum_or_average=True)
    pre = scale(prescale_factor, what, "prescale_factor")
    post = scale(postscale_factor, what, "postscale_factor")
    return _request("reducescatter", what, name, process_set, namer, members, reduce_op=op,
                    prescale=pre, postscale=post)


def p2p(kind, peer, name=None, process_set=None, what=None, namer=None):
    """A send (peer = the destination) or recv (peer = the source): peer is a GLOBAL
    rank, as every rank argument is; with a process set, this rank and the peer must both
    be members. Only the two ranks take part, and they match by (source, destination,
    name): a named message is "p2p.<name>"; unnamed ones are numbered per pair and
    direction ("p2p.noname.<k>" is the k-th unnamed send from src to dst, and the k-th
    unnamed recv from src on dst), so they match when both sides post them in the same
    order. A binding may number them its own way (namer.next("p2p", (src, dst)))."""
    what = what or kind
    ps, sid = resolve_set(process_set)
    member_index(ps, what)
    peer = _as_int(peer, what, "dst" if kind == "send" else "src")
    me, size = basics.rank(), basics.size()
    role = "destination" if kind == "send" else "source"
    if not 0 <= peer < size:
        raise ValueError(f"{what}: {role} rank {peer} is not a rank of the job (size {size})")
    if peer == me:
        raise ValueError(f"{what}: rank {me} cannot {'send to' if kind == 'send' else 'receive from'} "
                         f"itself")
    if sid and peer not in ps.ranks:
        raise ValueError(f"{what}: {role} rank {peer} is not a member of {ps!r}; ranks are "
                         f"global, also with a process set")
    if name is None:
        pair = (me, peer) if kind == "send" else (peer, me)
        base = f"p2p.noname.{(namer or counters).next('p2p', pair)}"
    else:
        base = f"p2p.{name}"
    return Request(kind, base, ps, sid, ps.size(), ps.rank(), root_rank=peer)


def barrier(process_set=None, namer=None):
    """An eager barrier has one name per set ("barrier", "barrier@set2"), as Horovod's
    have (BARRIER_TENSOR_NAME): the call blocks, so a rank has one in flight per set, and
    a name that repeats is agreed from the response cache (on one node in the
    shared-memory segment) instead of through rank 0 every time. A graph numbers its
    barriers (namer): one graph may hold several that run at once."""
    return _request("barrier", "barrier", None, process_set, namer, fixed=namer is None)


def join():
    """join is negotiated under one fixed name on every rank."""
    ps, _ = resolve_set(None)
    return Request("join", "join", ps, 0, ps.size(), basics.rank())


# ------------------------------------------------------------------ groups

def wait_all(handles, synchronize):
    """synchronize() every handle, in order, even after one fails (so none is left
    behind); then raise the first error, or return the outputs."""
    outputs, error = [], None
    for h in handles:
        try:
            outputs.append(synchronize(h))
        except Exception as e:  # noqa: BLE001 - wait for every member, then raise
            error = error or e
    if error is not None:
        raise error
    return outputs


def split_list(items, n):
    """Horovod's split_list: n contiguous parts of nearly equal length (the first
    len % n parts one longer)."""
    k, m = divmod(len(items), n)
    return [items[i * k + min(i, m):(i + 1) * k + min(i + 1, m)] for i in range(n)]
