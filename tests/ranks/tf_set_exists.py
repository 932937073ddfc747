"""Rank program of tests/test_tf_sets.py, run by
test_a_process_set_that_does_not_exist_is_refused_when_the_op_is_made (1 rank): an
allreduce on a ProcessSet whose id was set by hand raises ValueError when the op is
made, in a TF1 graph (before any Session runs) and eagerly, as Horovod's
test_horovod_allreduce_process_set_id_error expects; a registered set still works."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)
import tensorflow as tf
import horovodlike.tensorflow as thvd


def main():
    thvd.init(process_sets="dynamic")
    fake = thvd.ProcessSet([0])
    fake.process_set_id = 10             # never given out by this engine
    with tf.Graph().as_default():
        check_raises(ValueError, lambda: thvd.allreduce(tf.ones(4), process_set=fake),
                     "no process set with id 10", what="graph mode: made, not run")
        check_raises(ValueError, lambda: thvd.allgather(tf.ones(4), process_set=fake),
                     "no process set with id 10", what="graph mode allgather")
    check_raises(ValueError, lambda: thvd.allreduce(tf.ones(4), process_set=fake),
                 "no process set with id 10", what="eager")
    impostor = thvd.ProcessSet([0])
    impostor.process_set_id = 0          # id 0 is the global set: these ranks are not it
    if thvd.size() > 1:
        check_raises(ValueError, lambda: thvd.allreduce(tf.ones(4), process_set=impostor),
                     "no process set with id 0", what="id 0 with other ranks")
    real = thvd.add_process_set([0])
    check_equal(thvd.allreduce(tf.ones(4), op=thvd.Sum, process_set=real).numpy(),
                np.ones(4, np.float32) * 1, "a registered set")
    thvd.remove_process_set(real)
    finish()


if __name__ == "__main__":
    main()
