"""Four Keras 2 spellings that Horovod's own TF2 scripts and tests use and Keras 3
dropped, so that such a script runs with only its import changed:

  * ``opt.variables()``: Keras 3 made ``variables`` a property (a list). It now returns
    a list that may also be called, giving itself.
  * ``model.compile(..., experimental_run_tf_function=False)``: the argument is
    accepted and ignored (Keras 3 always runs the optimizer inside its train step).
  * a model's variables used as tf.Variables (they were in Keras 2): a Keras 3 variable
    gets ``ref()``, a hashable reference whose ``deref()`` gives it back, as
    tf.Variable.ref() does, and a TF1 Session can fetch it (``sess.run(var)``).
  * ``keras.layers.BatchNormalization(..., fused=...)``: accepted and ignored (Keras 3
    has no fused kernel to choose), with a DeprecationWarning.

Nothing else changes for Keras 3 code. Set HOROVODLIKE_KERAS2_COMPAT=0 to leave Keras
untouched.
"""
import functools
import inspect
import os
import warnings

from tensorflow.python.util import object_identity


class CallableList(list):
    """A list that returns itself when called (Keras 2's optimizer.variables())."""

    def __call__(self):
        return self


def _owner(cls, name):
    return next(c for c in cls.__mro__ if name in c.__dict__)


def install():
    if os.environ.get("HOROVODLIKE_KERAS2_COMPAT", "1") in ("0", "false", "False"):
        return
    import keras

    owner = _owner(keras.optimizers.Optimizer, "variables")
    prop = owner.__dict__["variables"]
    if isinstance(prop, property) and not getattr(prop.fget, "_horovodlike", False):
        original = prop.fget

        def variables(self):
            return CallableList(original(self))
        variables._horovodlike = True
        variables.__doc__ = original.__doc__
        setattr(owner, "variables", property(variables, prop.fset, prop.fdel, prop.__doc__))

    owner = _owner(keras.Model, "compile")
    compile_ = owner.__dict__["compile"]
    if not getattr(compile_, "_horovodlike", False):
        @functools.wraps(compile_)
        def compile(self, *args, experimental_run_tf_function=None, **kwargs):
            if experimental_run_tf_function is not None:
                warnings.warn("experimental_run_tf_function is a Keras 2 argument; Keras 3 "
                              "ignores it (horovodlike accepts it for Horovod scripts)",
                              DeprecationWarning, stacklevel=2)
            return compile_(self, *args, **kwargs)
        compile._horovodlike = True
        setattr(owner, "compile", compile)

    variable = keras.Variable
    if not hasattr(variable, "ref"):
        def ref(self):
            """A hashable reference to this variable (tf.Variable.ref(), Keras 2)."""
            return object_identity.Reference(self)
        ref._horovodlike = True
        variable.ref = ref
    if not hasattr(variable, "_as_graph_element"):
        def _as_graph_element(self):
            # What Session.run fetches: the tf.Variable inside (TensorFlow backend).
            inner = getattr(self, "value", None)
            convert = getattr(inner, "_as_graph_element", None)
            return convert() if convert else None
        variable._as_graph_element = _as_graph_element

    owner = keras.layers.BatchNormalization
    init = owner.__dict__["__init__"]
    if not getattr(init, "_horovodlike", False):
        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            if "fused" in kwargs:
                kwargs.pop("fused")
                warnings.warn("BatchNormalization(fused=...) is a Keras 2 argument; Keras 3 "
                              "ignores it (horovodlike accepts it for Horovod scripts)",
                              DeprecationWarning, stacklevel=2)
            init(self, *args, **kwargs)
        # Keras reads the constructor's arguments (for get_config) through both
        # inspect.signature and getfullargspec: both must see the original's.
        del __init__.__wrapped__
        __init__.__signature__ = inspect.signature(init)
        __init__._horovodlike = True
        owner.__init__ = __init__
