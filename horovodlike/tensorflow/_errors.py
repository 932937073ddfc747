"""The tf.errors types Horovod's TensorFlow ops raise, eagerly and inside graphs.

Horovod's kernels turn its statuses into TensorFlow's: a cross-rank mismatch is a
`tf.errors.FailedPreconditionError`, a bad argument an `InvalidArgumentError`, anything
else an `UnknownError`; scripts catch those. Ours raise the same types. Eagerly (and at
trace time) each error is of a class that derives from the tf.errors type AND from the
Python type the rest of horovodlike raises (ValueError, TypeError,
TensorMismatchError, HorovodInternalError, NotImplementedError), so code written
against either keeps working.

Inside a graph the collectives run in a py-function, and TensorFlow maps an exception
raised there by its Python type only: ValueError and TypeError become
InvalidArgumentError, NotImplementedError UnimplementedError, anything else
UnknownError. No Python type maps to FailedPreconditionError, so a mismatch is not
raised from the py-function: it returns the message instead (`status_path`), and the
graph writes an empty string to a file at that path right after the call, before any
output is used. The path names a file under /dev/null, which is not a directory, so
the write fails with FailedPreconditionError and the message (TensorFlow's status for
"not a directory"); on success the graph writes nothing to /dev/null itself, one
open() per batch. (A write, because it is stateful: Grappler would prune a read whose
result nobody uses.)
"""
import contextlib

import tensorflow as tf

from horovodlike.common import exceptions as _common


class _Dual:
    """Construction both as a tf.errors type (node_def, op, message) and with only a
    message. The signature stays TensorFlow's, which AutoGraph needs to re-raise the
    error under its own type."""

    def __init__(self, node_def, op=None, message=None, *args):
        if op is None and message is None and isinstance(node_def, str):
            node_def, message = None, node_def
        super().__init__(node_def, op, message, *args)


class InvalidArgumentError(_Dual, tf.errors.InvalidArgumentError, ValueError):
    """A bad argument (also a ValueError)."""


class InvalidArgumentTypeError(_Dual, tf.errors.InvalidArgumentError, TypeError):
    """An argument of the wrong type (also a TypeError)."""


class TensorMismatchError(_Dual, tf.errors.FailedPreconditionError,
                          _common.TensorMismatchError):
    """Ranks submitted the same tensor with different dtype, shape, op or root."""


class HorovodInternalError(_Dual, tf.errors.UnknownError, _common.HorovodInternalError):
    """The job cannot go on as it is (a rank was lost, the engine shut down)."""


class UnimplementedError(_Dual, tf.errors.UnimplementedError, NotImplementedError):
    """Something horovodlike does not implement (Adasum, say)."""


class XLANotSupportedError(ValueError):
    """A horovodlike collective was traced inside an XLA-compiled function."""
    # AutoGraph re-raises an error from converted code under its own type only when the
    # constructor is the plain one; otherwise users would get a StagingError.
    __init__ = Exception.__init__


# Most specific first.
_MAP = ((_common.TensorMismatchError, TensorMismatchError),
        (_common.HorovodInternalError, HorovodInternalError),
        (NotImplementedError, UnimplementedError),
        (TypeError, InvalidArgumentTypeError),
        (ValueError, InvalidArgumentError))


def translate(error):
    """The tf.errors-typed twin of a horovodlike error (the error itself when it already
    is a tf.errors type, or is not one of ours to translate)."""
    if isinstance(error, (tf.errors.OpError, XLANotSupportedError)):
        return error
    for source, target in _MAP:
        if isinstance(error, source):
            new = target(str(error))
            new.__cause__ = error.__cause__
            return new.with_traceback(error.__traceback__)
    return error


@contextlib.contextmanager
def translated():
    """Re-raise horovodlike's errors as their tf.errors twins."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - translate() leaves other errors as they are
        new = translate(e)
        if new is e:
            raise
        raise new from None


# ------------------------------------------------------------------ inside graphs

OK_PATH = "/dev/null"


def status_path(error):
    """What the py-function returns for the graph to read: OK_PATH, or a path whose
    read fails with FailedPreconditionError carrying the error's message."""
    if error is None:
        return OK_PATH
    text = str(error).replace("\0", " ")
    return f"{OK_PATH}/\n{type(error).__name__}: {text}\n"


def is_precondition(error):
    return isinstance(error, _common.TensorMismatchError)


def check_status(path, what):
    """The graph op that raises FailedPreconditionError when `path` is not OK_PATH
    (it can only create a file if /dev/null were a directory, which it never is)."""
    return tf.io.write_file(path, "", name="horovodlike_" + what + "_status")
