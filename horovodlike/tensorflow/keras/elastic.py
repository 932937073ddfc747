"""hvd.elastic for Keras 3 (Horovod's ``horovod.tensorflow.keras.elastic``): ``KerasState``,
the three callbacks, and ``run``.

    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    callbacks = [hvd.elastic.CommitStateCallback(state),
                 hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.UpdateEpochStateCallback(state)]

    @hvd.elastic.run
    def train(state):
        model.fit(dataset, steps_per_epoch=..., epochs=epochs - state.epoch,
                  callbacks=callbacks)

See docs/elastic.md (the first epoch after a reset is not shortened under Keras 3).
"""
import keras

from horovodlike.tensorflow.elastic import (ObjectState, State,  # noqa: F401
                                            TensorFlowKerasState, run)

__all__ = ["KerasState", "CommitStateCallback", "UpdateBatchStateCallback",
           "UpdateEpochStateCallback", "run", "State", "ObjectState"]


class KerasState(TensorFlowKerasState):
    """The state of a Keras model and optimizer (default: the model's)."""

    def __init__(self, model, optimizer=None, **kwargs):
        super().__init__(model, optimizer=optimizer, backend=keras.backend, **kwargs)


class CommitStateCallback(keras.callbacks.Callback):
    """Commit `state` every `batches_per_commit` batches and at the end of each epoch."""

    def __init__(self, state, batches_per_commit=1):
        super().__init__()
        self.backend = keras.backend
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs=None):
        # every rank starts counting again after a reset
        self.batches_remaining = self.batches_per_commit

    def on_train_batch_end(self, batch, logs=None):
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch, logs=None):
        self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keep ``state.batch`` at the number of the last finished batch; 0 after an epoch.

    Horovod also shortened the first epoch after a reset by rewriting
    ``params['steps']``; Keras 3 fixes an epoch's steps when fit() starts, so that epoch
    runs its full steps here (docs/elastic.md)."""

    def __init__(self, state):
        super().__init__()
        self.backend = keras.backend
        self.state = state
        self.steps_per_epoch = None

    def on_train_begin(self, logs=None):
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        if self.params.get("steps") and self.steps_per_epoch is None:
            self.steps_per_epoch = self.params.get("steps")

    def on_train_batch_end(self, batch, logs=None):
        self.state.batch = batch

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keep ``state.epoch`` at the number of epochs finished over every fit() of the
    job (Keras counts from 0 again in each fit after a reset)."""

    def __init__(self, state):
        super().__init__()
        self.backend = keras.backend
        self.state = state
        self.initial_epoch = self.state.epoch

    def on_train_begin(self, logs=None):
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch, logs=None):
        self.state.epoch = self.initial_epoch + epoch + 1
