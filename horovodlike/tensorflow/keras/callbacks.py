"""Keras 3 callbacks with Horovod's names and arguments."""

import keras
import numpy as np

from horovodlike.common import basics

from .. import functions, mpi_ops


def _is_variable(v):
    import tensorflow as tf
    return isinstance(v, (tf.Variable, keras.Variable))


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Broadcast the model's and the optimizer's variables from root_rank, once, so that
    every rank starts from the same state (random initialisation or a checkpoint).

    Unlike Horovod (which broadcasts after the first batch, when Keras 2 had created the
    optimizer's slots), this builds the optimizer and broadcasts at `on_train_begin`,
    before the first step. A model that is still unbuilt then (no input shape known)
    is broadcast after the first batch instead, as Horovod does."""

    def __init__(self, root_rank, device='', local_variables=None):
        """local_variables: variables each rank keeps as they are (Horovod's argument):
        one variable or a collection of them."""
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        self.broadcast_done = False
        if local_variables is None:
            local_variables = []
        elif _is_variable(local_variables):
            local_variables = [local_variables]
        else:
            local_variables = list(local_variables)
        if not all(_is_variable(v) for v in local_variables):
            raise ValueError("All local variables must be of tf.Variable type.")
        self._local_ids = {id(v) for v in local_variables}

    def _broadcast(self):
        model = self.model
        opt = getattr(model, "optimizer", None)
        variables = list(model.variables)
        if opt is not None:
            if not opt.built:
                opt.build(model.trainable_variables)
            variables += list(opt.variables)
        variables = [v for v in variables if id(v) not in self._local_ids]
        functions.broadcast_variables(variables, root_rank=self.root_rank)
        self.broadcast_done = True

    def on_train_begin(self, logs=None):
        if not self.broadcast_done and self.model.built:
            self._broadcast()

    def on_train_batch_end(self, batch, logs=None):
        if not self.broadcast_done:
            self._broadcast()


class MetricAverageCallback(keras.callbacks.Callback):
    """Average the epoch's logged metrics over ranks (one grouped allreduce), in place,
    so that callbacks after it (ReduceLROnPlateau, checkpoints, History) see averages.
    Put it before those callbacks."""

    def __init__(self, device=''):
        super().__init__()
        self.device = device

    def _average(self, logs):
        if not logs:
            return
        keys = [k for k in sorted(logs) if isinstance(logs[k], (int, float, np.number,
                                                                  np.ndarray))
                or hasattr(logs[k], "numpy")]
        if not keys:
            return
        values = np.array([float(np.asarray(logs[k])) for k in keys], np.float64)
        avg = mpi_ops.allreduce(values, op=mpi_ops.Average, name="MetricAverageCallback")
        for k, v in zip(keys, np.asarray(avg).tolist()):
            logs[k] = v

    def on_epoch_end(self, epoch, logs=None):
        self._average(logs)


def _lr_value(optimizer):
    return float(np.asarray(keras.ops.convert_to_numpy(optimizer.learning_rate)))


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Set lr = initial_lr * multiplier(epoch) between start_epoch and end_epoch, at the
    start of each epoch (staircase) or of each batch (epoch then has a fractional part).
    multiplier may be a number (exponential decay from start_epoch) or a function."""

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None):
        super().__init__()
        if initial_lr is None:
            raise ValueError("Parameter `initial_lr` is required")
        self.initial_lr = initial_lr
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = None
        self.restore_momentum = None
        if not callable(multiplier):
            self.multiplier = lambda epoch: multiplier ** (epoch - start_epoch)
        else:
            self.multiplier = multiplier

    def _autodetect_steps_per_epoch(self):
        steps = (self.params or {}).get("steps")
        if steps:
            return steps
        raise ValueError(f"Could not autodetect the number of steps per epoch; pass "
                         f"steps_per_epoch to {type(self).__name__}() (or steps_per_epoch "
                         f"to fit())")

    def _momentum_variable(self):
        m = getattr(self.model.optimizer, "momentum", None)
        return m if hasattr(m, "assign") else None

    def _adjust_learning_rate(self, epoch):
        opt = self.model.optimizer
        old_lr = _lr_value(opt)
        new_lr = self.initial_lr * self.multiplier(epoch)
        opt.learning_rate = new_lr
        # Keras 3 keeps momentum as a Python float baked into the traced step, so the
        # correction only applies to optimizers that hold it in a variable.
        mom = self._momentum_variable()
        if self.momentum_correction and mom is not None and old_lr:
            self.restore_momentum = float(np.asarray(mom))
            mom.assign(self.restore_momentum * new_lr / old_lr)

    def _restore_momentum_if_needed(self):
        if self.restore_momentum is not None:
            self._momentum_variable().assign(self.restore_momentum)
            self.restore_momentum = None

    def on_train_begin(self, logs=None):
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self._autodetect_steps_per_epoch()

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if (self.current_epoch < self.start_epoch or
                (self.end_epoch is not None and self.current_epoch >= self.end_epoch)):
            return
        if self.staircase and batch == 0:
            self._adjust_learning_rate(self.current_epoch)
        elif not self.staircase:
            self._adjust_learning_rate(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_train_batch_end(self, batch, logs=None):
        self._restore_momentum_if_needed()

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = _lr_value(self.model.optimizer)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Gradual warm-up: lr goes from initial_lr / size to initial_lr over warmup_epochs
    (Goyal et al., "Accurate, Large Minibatch SGD")."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True,
                 steps_per_epoch=None, verbose=0):
        def multiplier(epoch):
            epoch += 1. / self.steps_per_epoch
            size = basics.size()
            return 1. / size * (epoch * (size - 1) / warmup_epochs + 1)
        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and basics.rank() == 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                  f"{_lr_value(self.model.optimizer):g}.")


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """ModelCheckpoint that keeps the best model only, with Horovod's signature. Horovod's
    Spark estimator supplies the file; here it is `filepath` (a keyword after Horovod's
    arguments), by default best.keras, or best.weights.h5 with save_weights_only."""

    def __init__(self, monitor='val_loss', verbose=0, save_weights_only=False, mode='auto',
                 save_freq='epoch', filepath=None):
        if filepath is None:
            filepath = "best.weights.h5" if save_weights_only else "best.keras"
        super().__init__(filepath=filepath, monitor=monitor, verbose=verbose,
                         save_best_only=True, save_weights_only=save_weights_only, mode=mode,
                         save_freq=save_freq)


