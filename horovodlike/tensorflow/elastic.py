"""hvd.elastic for TensorFlow 2 (Horovod's ``horovod.tensorflow.elastic``): ``run``,
``TensorFlowKerasState`` and ``TensorFlowState``. Eager TensorFlow 2 only (the
states save and restore variables by value; collectives inside ``tf.function`` work).

    state = hvd.elastic.TensorFlowKerasState(model, optimizer, batch=0, epoch=0)
    state.register_reset_callbacks([lambda: optimizer.learning_rate.assign(lr * hvd.size())])

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs): ...  state.commit()

See docs/elastic.md.
"""
import functools

import tensorflow as tf

from horovodlike.common import elastic as _common
from horovodlike.common.basics import rank
from horovodlike.common.elastic import ObjectState, State  # noqa: F401
from horovodlike.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401

from .functions import broadcast_object, broadcast_variables

__all__ = ["TensorFlowKerasState", "TensorFlowState", "run", "State", "ObjectState"]


def run(func):
    """Decorator: run ``func(state, ...)`` and re-run it from a state every rank agrees
    on whenever the job re-forms. A collective that fails inside a ``tf.function``
    (TensorFlow reports it as an UnknownError) counts as HorovodInternalError."""
    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        try:
            return func(state, *args, **kwargs)
        except tf.errors.OpError as e:
            if not isinstance(e, HorovodInternalError) and \
                    "HorovodInternalError" in (e.message or ""):
                raise HorovodInternalError(e.message) from e
            raise
    return _common.run_fn(wrapper, _reset)


def _reset():
    _common.reset()


def _model_built(model):
    return model.built if hasattr(model, "build") else True


def optimizer_variables(optimizer, model=None):
    """A Keras optimizer's variables, building it first (Keras 3 creates its slots on
    the first step; a new worker must have them to receive the others')."""
    if optimizer is None:
        return []
    if model is not None and getattr(optimizer, "built", True) is False:
        optimizer.build(model.trainable_variables)
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


def _snapshot(variables):
    return [tf.identity(tf.convert_to_tensor(v)) for v in variables]


def _assign(variables, values):
    if len(variables) != len(values):
        raise RuntimeError(f"elastic state: {len(variables)} variables now, "
                           f"{len(values)} when it was saved")
    for var, value in zip(variables, values):
        var.assign(value)


class TensorFlowKerasState(ObjectState):
    """The state of a Keras model and its optimizer (Keras 3 on TensorFlow).

    model: a built Keras model. optimizer: defaults to model.optimizer. backend: kept
    for Horovod's signature. Other keyword arguments become synchronized attributes.
    """

    def __init__(self, model, optimizer=None, backend=None, **kwargs):
        self.model = model
        if not _model_built(model):
            raise ValueError("Model must be built first. Run `model.build(input_shape)`.")
        self.optimizer = optimizer or getattr(model, "optimizer", None)
        self.backend = backend
        self._save_model()
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)

    def _variables(self):
        return list(self.model.variables), optimizer_variables(self.optimizer, self.model)

    def save(self):
        self._save_model()
        super().save()

    def restore(self):
        self._load_model()
        super().restore()

    def sync(self):
        model_vars, opt_vars = self._variables()
        broadcast_variables(model_vars + opt_vars, root_rank=0)
        self._save_model()
        super().sync()

    def _save_model(self):
        model_vars, opt_vars = self._variables()
        self._saved_model_state = _snapshot(model_vars)
        self._saved_optimizer_state = _snapshot(opt_vars)

    def _load_model(self):
        model_vars, opt_vars = self._variables()
        _assign(model_vars, self._saved_model_state)
        _assign(opt_vars, self._saved_optimizer_state)


class TensorFlowState(ObjectState):
    """The state of a list of tf.Variables (eager TensorFlow 2).

    variables: the variables to track (required: TensorFlow 2 has no global variables).
    session: TensorFlow 1 only; must be None. Other keyword arguments become
    synchronized attributes.
    """

    def __init__(self, variables=None, session=None, **kwargs):
        if session is not None:
            raise ValueError("TensorFlowState: sessions are TensorFlow 1; horovodlike runs "
                             "eager TensorFlow 2 (pass variables=)")
        if variables is None:
            raise ValueError("TensorFlowState needs variables=[...]: TensorFlow 2 has no "
                             "global variables to default to")
        self.variables = list(variables)
        self.session = None
        self._save_model()
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)

    def save(self):
        self._save_model()
        super().save()

    def restore(self):
        _assign(self.variables, self._values)
        super().restore()

    def sync(self):
        broadcast_variables(self.variables, root_rank=0)
        self._save_model()
        super().sync()

    def _save_model(self):
        self._values = _snapshot(self.variables)
