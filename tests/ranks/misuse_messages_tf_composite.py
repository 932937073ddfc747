"""Rank program of tests/test_misuse_messages.py, run by
test_tf_ragged_and_sparse_tensors_get_a_clear_error."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)
import tensorflow as tf
import horovodlike.tensorflow as hvdtf


def main():
    hvdtf.init()
    ragged = tf.ragged.constant([[1.0], [2.0, 3.0]])
    sparse = tf.sparse.SparseTensor([[0, 0]], [1.0], [2, 2])
    for op, call in (("allreduce", lambda t: hvdtf.allreduce(t)),
                     ("allgather", lambda t: hvdtf.allgather(t)),
                     ("broadcast", lambda t: hvdtf.broadcast(t, 0))):
        check_raises(TypeError, lambda: call(ragged),
                     f"{op}: tf.RaggedTensor is not supported; use a dense tensor", what=f"{op} ragged")
        check_raises(TypeError, lambda: call(sparse),
                     f"{op}: tf.SparseTensor is not supported; use a dense tensor", what=f"{op} sparse")
    finish()


if __name__ == "__main__":
    main()
