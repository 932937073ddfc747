"""Rank program of tests/test_p2p.py, run by test_p2p_tensorflow."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)
import tensorflow as tf
import horovodlike.tensorflow as htf


def main():
    htf.init()
    R = htf.rank()
    for i, dt in enumerate([tf.int32, tf.float32, tf.float64, tf.bfloat16, tf.bool]):
        x = tf.cast(tf.reshape(tf.range(12) % 3, (3, 4)), dt)
        if R == 0:
            htf.send(x, 1, name=f"x.{i}")
            htf.send(x, 1, name=f"y.{i}")
        else:
            got = htf.recv(0, name=f"x.{i}")
            check(got.dtype == dt and got.shape == (3, 4) and
                  bool(tf.reduce_all(tf.equal(tf.cast(got, tf.float32), tf.cast(x, tf.float32)))),
                  f"tf recv {dt}")
            v = tf.Variable(tf.zeros((3, 4), dt))
            htf.recv_(v, 0, name=f"y.{i}")
            check(bool(tf.reduce_all(tf.equal(tf.cast(v, tf.float32), tf.cast(x, tf.float32)))),
                  f"tf recv_ {dt}")
    finish()


if __name__ == "__main__":
    main()
