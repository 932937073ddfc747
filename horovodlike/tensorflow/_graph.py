"""Running a batch of collectives from TensorFlow: directly when eager; inside a graph
(a TF1 graph run by a Session, tf.function, Keras' train step) as an enqueue and a wait
that never hold one of TensorFlow's threads while a collective is in flight; and naming
the unnamed ops traced into a graph.

Why no graph can deadlock (docs/tensorflow.md gives the argument in full). A kernel
that enqueued its collectives and then waited for them would hold an inter-op thread
until every rank had reached the same collective; two ranks whose threads pick
independent collectives in different orders can then hold every thread on ops the
other rank never gets to. So a batch is two graph nodes:

- the enqueue, a stateful `tf.numpy_function` on an inter-op thread: it hands every
  tensor to the engine and returns a token at once (the engine only queues, under a
  short lock), so it never waits for another rank;
- the wait, a `tf.numpy_function` inside a one-element `tf.data` pipeline read by
  `Dataset.get_single_element()`: TensorFlow runs that kernel asynchronously, on a
  thread of tf.data's own unbounded pool, and the map function runs on that thread
  (`use_inter_op_parallelism=False`), so the blocking wait holds none of the graph's
  threads.

Every inter-op thread therefore stays free to run every enqueue whose inputs are
ready, on every rank; the engine completes any op that every rank has enqueued
(whatever else is pending); so each wait ends, and by induction on the graph's
dependencies every collective of a step completes, whatever order TensorFlow picks and
however few threads it has. A Session fetching a subset of a graph runs exactly the
collectives it needs: nothing is chained to anything it would not run anyway.
Cost: about the time of one more py-call per batch, not per tensor (a gradient batch
is still one enqueue and one wait, fused by the engine).

Point-to-point messages (p2p.py) are built from the same two nodes (`staged`), with
their wait left out of the order in which a tf.function runs its stateful ops: a
message completes once its two ranks have posted it, and a wait kept in that order
would keep this rank's later posts back (see `staged`).

Unnamed ops get their names when they are traced, as Horovod names graph ops when the
graph is built: numbered per function graph, in trace order, which every rank follows
the same way. The order in which TensorFlow later runs them does not matter, and a rank
that retraces a function (a new input shape, say) numbers the new graph from zero again,
as the others do. Eager calls are numbered when made, by the common counters.

Errors keep Horovod's tf.errors types in both modes (see _errors).

XLA cannot run a py-function: a collective traced under XLA (`jit_compile=True`, or
Keras' `jit_compile="auto"` with a GPU) is refused at trace time with an error that
says what to change, instead of failing obscurely or being dropped.
"""
import functools
import itertools
import re
import warnings
import weakref

import numpy as np
import tensorflow as tf

from horovodlike.common import request

from . import _errors, _kernels
from ._errors import XLANotSupportedError
from ._tensors import np_dtype, to_tf


def _xla_context():
    try:
        from tensorflow.python.framework import ops as tf_ops
        from tensorflow.python.ops import control_flow_util
        return control_flow_util.GraphOrParentsInXlaContext(tf_ops.get_default_graph())
    except (ImportError, AttributeError):       # private helper gone: be permissive
        return False


def entry_point(fn):
    """Mark a public function so that AutoGraph calls it as it is instead of converting
    horovodlike's own Python (it has no tensor-dependent control flow to convert), and
    so that its errors carry Horovod's tf.errors types."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        with _errors.translated():
            return fn(*args, **kwargs)
    return tf.autograph.experimental.do_not_convert(call)


def check_xla(what):
    """Raise XLANotSupportedError when tracing under XLA."""
    if not tf.executing_eagerly() and _xla_context():
        raise XLANotSupportedError(
            f"horovodlike: {what} cannot run inside an XLA-compiled function. horovodlike's "
            f"collectives run on the CPU through a Python call, which XLA cannot compile. "
            f"Pass jit_compile=False to model.compile(...) (Keras turns XLA on by itself "
            f"with jit_compile='auto' when a GPU is visible) or to tf.function(...).")


class _GraphNamer:
    """Numbers for the unnamed ops traced into one function graph (and the cond/while
    branches and nested functions traced inside it), named after the function."""

    def __init__(self, prefix):
        self.prefix = prefix
        self.counters = request.Counters()

    def next(self, kind, sid):
        return f"{self.prefix}.{self.counters.next(kind, sid)}"


_namers = weakref.WeakKeyDictionary()


def namer():
    """How unnamed ops are numbered here: None when eager (request's counters, at call
    time); inside a graph, by the outermost function graph being traced."""
    if tf.executing_eagerly():
        return None
    from tensorflow.python.framework import ops as tf_ops
    g = tf_ops.get_default_graph()
    while hasattr(getattr(g, "outer_graph", None), "outer_graph"):    # a function graph
        g = g.outer_graph
    n = _namers.get(g)
    if n is None:
        # "__backward_f_36": TensorFlow's uid suffixes differ between ranks.
        prefix = re.sub(r"(_\d+)+$", "", getattr(g, "name", None) or "graph")
        n = _namers[g] = _GraphNamer(prefix)
    return n


def run(items, inputs, out_dtypes, out_shapes, what):
    """Run the batch `items` (_kernels.Item) on `inputs`; returns the outputs as
    tensors, eagerly or when the graph runs."""
    if not inputs and not out_dtypes:
        return []
    if tf.executing_eagerly():
        with _errors.translated():
            return [to_tf(a) for a in _kernels.execute(items, [np.asarray(t) for t in inputs])]
    check_xla(what)
    outs, _ = staged(functools.partial(_kernels.submit_all, tuple(items)), inputs,
                     out_dtypes, out_shapes, what)
    return outs


def staged(submit, inputs, out_dtypes, out_shapes, what, independent=False):
    """The enqueue node and the wait node of one batch in a graph (the module's
    docstring). submit(arrays) hands the inputs to the engine without waiting and returns
    (handles, refusal), as _kernels.submit_all does; each handle's output is a tuple.
    Returns (outputs, done): `done` is the op that completes the batch (a TF1 Session
    must run it when the batch has no outputs).

    independent: leave the wait out of the program order in which a tf.function runs
    its stateful ops (TensorFlow's automatic control dependencies), keeping only that
    it runs before the function returns. Collectives keep the order (every rank enqueues
    them in the same order). Point-to-point messages must not: a rank that sends and
    then receives would otherwise not post its recv until its send had completed, and a
    send above the eager threshold completes only once the peer has posted its recv, so
    two ranks that each send a large message before receiving would wait for each other
    (the enqueues stay in program order: posting never waits)."""
    batch = _Batch(submit, [np_dtype(d) for d in out_dtypes])
    token = tf.numpy_function(batch.enqueue, list(inputs), tf.int64, stateful=True,
                              name=f"horovodlike_{what}_enqueue")
    *outs, status = _off_thread(batch.wait, token, list(out_dtypes) + [tf.string],
                                f"horovodlike_{what}_wait")
    done = _errors.check_status(status, what)
    if independent:
        _run_independently(status.op, done)
    with tf.control_dependencies([done]):
        outs = [tf.identity(o) for o in outs]
    for o, s in zip(outs, out_shapes):
        o.set_shape(s)
    return outs, done


def _run_independently(*graph_ops):
    """Mark ops as TensorFlow's automatic control dependencies' "independent" ops: they
    run before the function returns, unordered with its other stateful ops. Outside a
    tf.function (a TF1 graph) nothing orders stateful ops, and nothing is needed."""
    from tensorflow.python.framework import ops as tf_ops
    g = tf_ops.get_default_graph()
    manager = getattr(g, "experimental_acd_manager", None)
    if manager is None:
        if getattr(g, "_add_control_dependencies", False):     # a TensorFlow without it
            warnings.warn("horovodlike: this TensorFlow has no automatic-control-"
                          "dependency manager to leave point-to-point waits out of "
                          "program order; inside a tf.function a rank that sends a large "
                          "message before its recvs now waits for the peer's recv first")
        return
    for op in graph_ops:
        manager.run_independently(op)


# Batches enqueued and not yet waited for: token -> (handles, refusal). A step that
# TensorFlow abandons between the two (another node failed) leaves its entry here; its
# ops still complete, as the other ranks submit theirs, and their names are free again.
_open = {}
_tokens = itertools.count(1)


class _Batch:
    """The two kernels of one batch in a graph. Plain Python that AutoGraph must leave
    alone; one instance per graph node, shared by every run of it."""

    def __init__(self, submit, empty):
        self.submit, self.empty = submit, empty

    @tf.autograph.experimental.do_not_convert
    def enqueue(self, *arrays):
        token = next(_tokens)
        _open[token] = self.submit(arrays)
        return np.int64(token)

    @tf.autograph.experimental.do_not_convert
    def wait(self, token):
        handles, refusal = _open.pop(int(token))
        try:
            outs, error = _kernels.wait_all(handles, refusal), None
        except Exception as e:  # noqa: BLE001 - only a mismatch is returned, see _errors
            if not _errors.is_precondition(e):
                raise
            outs, error = [np.zeros(0, d) for d in self.empty], e
        return outs + [np.array(_errors.status_path(error).encode(), dtype=object)]


def _map_dataset():
    try:      # where the map function runs on the calling thread, as the wait needs
        from tensorflow.python.data.ops.map_op import _MapDataset
        return functools.partial(_MapDataset, use_inter_op_parallelism=False,
                                 preserve_cardinality=True)
    except ImportError:
        return lambda ds, fn: ds.map(fn)


def _off_thread(fn, token, dtypes, name):
    """fn(token) as a stateful py-call that TensorFlow runs on a tf.data thread, not on
    one of the graph's inter-op threads (see the module's docstring)."""
    ds = tf.data.Dataset.from_tensors(token)
    ds = _map_dataset()(ds, lambda t: tuple(tf.numpy_function(fn, [t], dtypes,
                                                              stateful=True, name=name)))
    return list(ds.get_single_element())
