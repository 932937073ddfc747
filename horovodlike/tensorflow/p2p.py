"""Point-to-point messages for TensorFlow: send, recv and recv_, eagerly and inside
graphs (tf.function, Keras' traced steps, a TF1 Session).

A thin binding over the engine's p2p channel (engine/p2p/p2p.c): a message is matched by
(source, destination, name) between the two ranks alone; up to
HOROVODLIKE_P2P_EAGER_BYTES a send completes once its bytes have left, above it once
the peer has posted the matching recv (rendezvous, as MPI_Send).

Eagerly a call posts its message and waits for it, as the numpy API does. Inside a graph
each call is the two nodes every graph collective is (_graph.staged): an enqueue that
posts the message and never waits, and a wait that TensorFlow runs on a tf.data thread,
so a blocked wait holds none of the graph's inter-op threads. One difference from the
collectives: the wait is left out of the program order that a tf.function imposes on
its stateful nodes (`independent`). With it in that order, a rank whose function sends
and then receives would post its recv only once its send had completed, and a large
send completes only when the peer's recv is posted: two ranks that each send a large
message before receiving would wait for each other forever. Only the posts keep program
order, so every message a step posts is posted whatever TensorFlow runs first and
however few threads it has; the engine delivers any message whose send and recv are
both posted; so by induction over the graph's dependencies every wait ends (the
argument of docs/tensorflow.md, "Why no graph can deadlock", with "every rank
enqueued it" replaced by "both ranks posted it").

What a graph needs that eager code does not:
- the recv's dtype (`dtype=`), which TensorFlow must know when it traces the op;
  `shape=` sets the static shape. The message must match them: the engine (recv_ and a
  recv of a fully known shape receive into a buffer of that dtype and shape) or this
  module (a partly known shape) fails the recv naming both ranks, the name and the
  field, as a tf.errors.FailedPreconditionError.
- names that agree across ranks when none is given: each function graph numbers its
  unnamed sends and recvs when they are traced, per (source, destination) pair, in trace
  order, as "p2p.noname.graph.<k>", whatever the function is called (the sender and the
  receiver usually run different functions). The k-th unnamed send to a rank traced into
  one function pairs with the k-th unnamed recv from this rank traced into the function
  the peer runs at the same time; eager unnamed messages are numbered apart, at call
  time, and never pair with a graph's.

Not differentiable: a tape treats a recv's output as a constant and sees no path through
a send (docs/tensorflow.md, "Point-to-point messages"). XLA cannot run them.

Cost in a graph, per message: the two py-calls and the one-element tf.data pipeline of
one graph collective (docs/tensorflow.md, "How it runs"); no copy on the send side (the
engine reads TensorFlow's buffer, kept alive until the send completes); a recv of a
fully known shape lands in a 64-byte aligned buffer that TensorFlow adopts without a
copy, otherwise in the engine's buffer, which TensorFlow copies once.
"""
import numpy as np
import tensorflow as tf

from horovodlike.common import basics, engine, ops, request
from horovodlike.common.exceptions import TensorMismatchError
from horovodlike.common.process_sets import global_process_set

from . import _graph, _tensors


class _GraphNumbers:
    """request.p2p's namer inside a graph: the per-pair numbers of one function graph,
    without the function's name (see the module's docstring)."""

    def __init__(self, counters):
        self.counters = counters

    def next(self, kind, pair):
        return f"graph.{self.counters.next(kind, pair)}"


def _request(kind, peer, name, process_set, what=None):
    graph = _graph.namer()
    return request.p2p(kind, peer, name, process_set, what,
                       namer=_GraphNumbers(graph.counters) if graph is not None else None)


def _dense(tensor, what):
    t = _tensors.as_tensor(tensor, what)
    _tensors.check_dtype(t, what)
    return t


# ------------------------------------------------------------------ send

def _post_send(req, x):
    """Post a send of the array x (kept alive until the send completes)."""
    x = np.require(x, x.dtype, "C")             # a 0-d array stays 0-d
    code = ops.dtype_code(x.dtype, "send")
    return ops.submit((x,), lambda _: (), **req.fields(code, x.shape, engine.address(x)))


@_graph.entry_point
def send(tensor, dst, name=None, process_set=global_process_set):
    """Send `tensor` to global rank `dst`, matched by (this rank, dst, name).

    Eagerly it returns once the message has left this rank (up to
    HOROVODLIKE_P2P_EAGER_BYTES) or once `dst` has posted the matching recv (larger
    messages). Inside a graph it returns the op that completes the send: a tf.function
    runs it by itself before returning, unordered with the function's recvs (so a
    function may send and receive in any order); a TF1 Session must run it. Unnamed
    sends in a graph are numbered per traced function (the module's docstring): name
    those in `tf.cond` branches or functions run from several threads."""
    t = _dense(tensor, "send")
    req = _request("send", dst, name, process_set)
    if tf.executing_eagerly():
        ops.synchronize(_post_send(req, np.asarray(t)))
        return None
    _graph.check_xla("send")
    _, done = _graph.staged(lambda arrays: _posted(lambda: _post_send(req, arrays[0])),
                            [t], [], [], "send", independent=True)
    return done


def _posted(post):
    """What a graph's enqueue returns: (handles, refusal), see _graph.staged."""
    try:
        return [post()], None
    except Exception as e:  # noqa: BLE001 - raised by the wait, as _kernels.submit_all does
        return [], e


# ------------------------------------------------------------------ recv

def _mismatch(req, field, theirs, mine):
    me = basics.rank()
    return TensorMismatchError(
        f"recv '{req.name}' on rank {me} from rank {req.root_rank}: the message and the "
        f"declared {field} differ: rank {req.root_rank} sent {theirs}, rank {me} declared "
        f"{mine}")


def _shape_text(shape):
    return str(tuple("?" if d is None else d for d in shape)).replace("'", "")


def _check_message(req, res, dtype, shape):
    """The message behind res against the declared tf dtype and static shape (None:
    any shape); raises TensorMismatchError naming both ranks, the name and the field."""
    got_dtype, got_shape, _ = res.message()
    if got_dtype != dtype.name:
        raise _mismatch(req, "dtype", got_dtype, dtype.name)
    if shape is not None and not tf.TensorShape(shape).is_compatible_with(got_shape):
        raise _mismatch(req, "shape", _shape_text(got_shape), _shape_text(shape))


def _from_message(res, np_dtype):
    _, shape, _ = res.message()
    if not res.nbytes:
        return np.empty(shape, np_dtype)
    return np.frombuffer(res.buffer(), np_dtype).reshape(shape)


def _post_recv(req, dtype, shape, exact=True):
    """Post a recv of a message of the tf dtype `dtype` (None: whatever comes) and static
    shape `shape` (None: any; a tuple with None for unknown dimensions). A fully known
    shape receives into a 64-byte aligned buffer, which the engine checks the message
    against (dtype and size); the shape's dimensions are checked here unless not
    `exact` (recv_, which like the engine's recv_ takes any shape of the right size)."""
    if dtype is None:
        return ops.submit_recv(req, lambda res: (_from_message(res, _np_dtype_of(res)),))
    np_dtype = _tensors.np_dtype(dtype)
    if shape is not None and None not in shape:
        buf = _tensors.aligned_empty(shape, np_dtype)

        def into(res):
            if exact:
                _check_message(req, res, dtype, shape)
            return (buf,)
        return ops.submit_recv_into(req, ops.dtype_code(np_dtype, "recv"), buf.shape,
                                    engine.address(buf), (buf,), into)

    def new(res):
        _check_message(req, res, dtype, shape)
        return (_from_message(res, np_dtype),)
    return ops.submit_recv(req, new)


def _np_dtype_of(res):
    name = res.message()[0]
    return _tensors.np_dtype(tf.as_dtype(name))


def _declared(dtype, shape, what):
    """(tf dtype or None, static shape tuple or None) from recv's arguments."""
    if dtype is not None:
        try:
            dtype = tf.as_dtype(dtype).base_dtype
        except TypeError:
            raise _tensors.UnsupportedTensorError(f"{what}: dtype={dtype!r} is not a dtype") from None
        if dtype not in _tensors.ENGINE_DTYPES:
            raise _tensors.UnsupportedTensorError(
                f"{what}: dtype {dtype.name} is not supported; supported dtypes are "
                f"{_tensors.supported_names()}")
    if shape is not None:
        shape = _tensors.static_shape(shape)
    return dtype, shape


@_graph.entry_point
def recv(src, name=None, process_set=global_process_set, dtype=None, shape=None):
    """The message `name` from global rank `src`, as a new tensor.

    Eagerly its dtype and shape are the message's; `dtype=` and `shape=` (a shape with
    None for dimensions that may vary), when given, are checked against the message.
    Inside a graph `dtype=` is required (TensorFlow needs the output's dtype when it
    traces the op) and `shape=` sets the output's static shape. A message of another
    dtype or shape fails the recv naming both ranks, the name and the field
    (tf.errors.FailedPreconditionError). Unnamed recvs in a graph are numbered per
    traced function (see send)."""
    dtype, shape = _declared(dtype, shape, "recv")
    if tf.executing_eagerly():
        req = _request("recv", src, name, process_set)
        (out,) = ops.synchronize(_post_recv(req, dtype, shape))
        return _tensors.to_tf(out)
    if dtype is None:
        raise ValueError("recv inside a tf.function (or any graph) needs dtype=: "
                         "TensorFlow must know the output's dtype when it traces the op; "
                         "pass the dtype the sender sends (and shape= to set the static "
                         "shape)")
    req = _request("recv", src, name, process_set)
    _graph.check_xla("recv")
    (out,), _ = _graph.staged(lambda _: _posted(lambda: _post_recv(req, dtype, shape)),
                              [], [dtype], [shape], "recv", independent=True)
    return out


@_graph.entry_point
def recv_(variable, src, name=None, process_set=global_process_set):
    """Receive into a tf.Variable: the message must have the variable's dtype and size,
    or the recv fails naming both ranks, the name and the field (the variable is then
    left as it was). Eagerly it returns the variable once assigned; inside a graph, the
    assignment (a tf.function runs it by itself; a TF1 Session must run it)."""
    if not isinstance(variable, tf.Variable):
        raise _tensors.UnsupportedTensorError(
            f"recv_ receives into a tf.Variable, got {type(variable).__name__}")
    dtype = _tensors.check_dtype(variable, "recv_")
    shape = _tensors.static_shape(variable.shape)
    if shape is None or None in shape:
        raise ValueError(f"recv_: the variable's shape {variable.shape} is not fully "
                         f"known; recv_ receives into a buffer of the variable's size")
    req = _request("recv", src, name, process_set, what="recv_")
    if tf.executing_eagerly():
        (out,) = ops.synchronize(_post_recv(req, dtype, shape, exact=False))
        variable.assign(_tensors.to_tf(out))
        return variable
    _graph.check_xla("recv_")
    (out,), _ = _graph.staged(lambda _: _posted(lambda: _post_recv(req, dtype, shape, False)),
                              [], [dtype], [shape], "recv_", independent=True)
    return variable.assign(out)
