"""The distributed optimizers' argument rules (horovodlike/common/arguments.py) hold in
every binding: the same bad argument raises the same error type with the same text in
torch's DistributedOptimizer and ShardedDistributedOptimizer, TensorFlow's
DistributedGradientTape and DistributedOptimizer (a tf.compat.v1 optimizer and a Keras
one), and horovodlike.keras's DistributedOptimizer.

Every construction runs in ONE process of one rank (this file, run as a script with
--child; importing TensorFlow and torch once costs most of its time). It prints one JSON
line per (case, binding); the tests below compare them with the contract.
"""
import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

if __name__ != "__main__":
    from harness import run_ranks
    from tf_support import TF_ENV

    if importlib.util.find_spec("pytest_timeout") is not None:
        pytestmark = pytest.mark.timeout(240)

ALL = ("torch", "sharded", "tape", "keras", "tf_keras", "tf_legacy")
NO_SHARDED = tuple(b for b in ALL if b != "sharded")    # it takes no such argument
NO_TAPE = tuple(b for b in ALL if b != "tape")          # a tape takes no passes

GROUPS = "must be a positive int or a list of lists of trainable parameters, got"
POWERSGD_HERE = ("compression=PowerSGD(...) is implemented for horovodlike.torch's "
                 "DistributedOptimizer only; use hvd.Compression.fp16 or "
                 "hvd.Compression.bf16 here")

# (case id, {argument: value} (made in the child: "PARAM0" is the binding's first
#  parameter, "POWERSGD" torch's PowerSGD(rank=1), "Sum" hvd.Sum, "'x'" the str x),
#  the bindings that take the argument, the error type, its exact text)
CASES = [
    ("predivide=0", {"gradient_predivide_factor": 0}, NO_SHARDED, "ValueError",
     "gradient_predivide_factor must be a positive finite number, got 0"),
    ("predivide=-1.5", {"gradient_predivide_factor": -1.5}, NO_SHARDED, "ValueError",
     "gradient_predivide_factor must be a positive finite number, got -1.5"),
    ("predivide=nan", {"gradient_predivide_factor": math.nan}, NO_SHARDED, "ValueError",
     "gradient_predivide_factor must be a positive finite number, got nan"),
    ("predivide='2'", {"gradient_predivide_factor": "'2'"}, NO_SHARDED, "ValueError",
     "gradient_predivide_factor must be a positive finite number, got '2'"),
    ("predivide with Sum", {"gradient_predivide_factor": 2.0, "op": "Sum"}, NO_SHARDED,
     "ValueError", "gradient_predivide_factor not supported with op != Average "
     "(gradient_predivide_factor=2.0, op=hvd.Sum)"),
    ("groups=0", {"groups": 0}, NO_SHARDED, "ValueError", f"groups {GROUPS} 0"),
    ("groups=-2", {"groups": -2}, NO_SHARDED, "ValueError", f"groups {GROUPS} -2"),
    ("groups='2'", {"groups": "'2'"}, NO_SHARDED, "ValueError", f"groups {GROUPS} '2'"),
    ("groups=True", {"groups": True}, NO_SHARDED, "ValueError",
     f"groups {GROUPS} True"),
    ("groups of non-parameters", {"groups": [["PARAM0"], [1.5]]}, NO_SHARDED, "ValueError",
     "groups must consist of trainable parameters; item 0 of group 1 is 1.5"),
    ("groups repeat a parameter", {"groups": [["PARAM0"], ["PARAM0"]]}, NO_SHARDED,
     "ValueError", "a parameter can only appear once in groups; item 0 of group 1 "
     "appeared before"),
    ("num_groups=-1", {"num_groups": -1}, NO_SHARDED, "ValueError",
     f"num_groups {GROUPS} -1"),
    ("backward_passes_per_step=0", {"backward_passes_per_step": 0}, NO_TAPE, "ValueError",
     "backward_passes_per_step must be a positive int, got 0"),
    ("backward_passes_per_step=1.5", {"backward_passes_per_step": 1.5}, NO_TAPE,
     "ValueError", "backward_passes_per_step must be a positive int, got 1.5"),
    ("set_backward_passes_per_step(0)", {"SET_PASSES": 0}, ("torch", "sharded"),
     "ValueError", "backward_passes_per_step must be a positive int, got 0"),
    ("op=Adasum", {"op": "Adasum"}, ALL, "NotImplementedError",
     "op=hvd.Adasum is not implemented in horovodlike; use op=hvd.Average (the default) "
     "or op=hvd.Sum"),
    ("op='sum'", {"op": "'sum'"}, ALL, "ValueError",
     "op='sum' is an unknown reduction op; use one of hvd.Average, hvd.Sum, hvd.Min, "
     "hvd.Max, hvd.Product"),
    # Keras and the sharded optimizer reduce with Average or Sum only (Horovod's Keras
    # too); torch's DistributedOptimizer and the tape take Min/Max/Product.
    ("op=Min", {"op": "Min"}, ("sharded", "keras", "tf_keras"), "ValueError",
     "op currently only supports Average and Sum, got op=hvd.Min"),
    ("compression='fp16'", {"compression": "'fp16'"}, ALL, "ValueError",
     "compression must be a compressor such as hvd.Compression.none, "
     "hvd.Compression.fp16 or hvd.Compression.bf16, got 'fp16'"),
    ("compression=PowerSGD class", {"compression": "POWERSGD_CLASS"}, ALL, "ValueError",
     "compression=PowerSGD needs an instance: compression=hvd.PowerSGD(...)"),
    ("compression=PowerSGD(...) outside torch's DistributedOptimizer",
     {"compression": "POWERSGD"}, tuple(b for b in ALL if b != "torch"),
     "NotImplementedError", POWERSGD_HERE),
    ("sparse_as_dense='yes'", {"sparse_as_dense": "'yes'"}, NO_SHARDED, "ValueError",
     "sparse_as_dense must be True or False, got 'yes'"),
]


# ------------------------------------------------------------------ the child

def _child():
    import os
    import warnings
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    warnings.simplefilter("ignore", DeprecationWarning)
    import tensorflow as tf
    import torch

    import horovodlike.keras as hk
    import horovodlike.tensorflow as htf
    import horovodlike.torch as thvd
    from horovodlike.torch.sharded import ShardedDistributedOptimizer

    thvd.init()
    htf.init()
    assert thvd.size() == 1

    def torch_params():
        model = torch.nn.Linear(3, 2)
        return model, list(model.parameters())

    def tf_vars():
        return [tf.Variable(tf.ones([2])), tf.Variable(tf.ones([3]))]

    def keras_opt():
        import keras
        return keras.optimizers.SGD(0.1)

    def value(v, params, module):
        if isinstance(v, list):
            return [value(x, params, module) for x in v]
        if v == "PARAM0":
            return params[0]
        if v == "POWERSGD":
            return thvd.PowerSGD(rank=1)
        if v == "POWERSGD_CLASS":
            return thvd.PowerSGD
        if isinstance(v, str) and v.startswith("'"):
            return v.strip("'")
        if isinstance(v, str):
            return getattr(module, v)          # an op: hvd.Sum, hvd.Adasum, ...
        return v

    def build(binding, kwargs):
        if binding in ("torch", "sharded"):
            model, params = torch_params()
            kw = {k: value(v, params, thvd) for k, v in kwargs.items()}
            passes = kw.pop("SET_PASSES", None)     # set_backward_passes_per_step later
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            wrap = thvd.DistributedOptimizer if binding == "torch" else \
                ShardedDistributedOptimizer
            opt = wrap(opt, model.named_parameters(), **kw)
            if passes is not None:
                opt.set_backward_passes_per_step(passes)
            return opt
        params = tf_vars()
        kw = {k: value(v, params, htf) for k, v in kwargs.items()}
        if binding == "tape":
            return htf.DistributedGradientTape(tf.GradientTape(), **kw)
        if binding == "keras":
            return hk.DistributedOptimizer(keras_opt(), **kw)
        if binding == "tf_keras":
            return htf.DistributedOptimizer(keras_opt(), **kw)
        return htf.DistributedOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(0.1), **kw)

    for case, kwargs, bindings, _, _ in CASES:
        for binding in bindings:
            try:
                build(binding, kwargs)
                got = None
            except Exception as e:  # noqa: BLE001 - what is raised is what we report
                got = [type(e).__name__, str(e)]
            print("RESULT " + json.dumps({"case": case, "binding": binding, "got": got}),
                  flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--child"]:
        _child()
        sys.exit(0)


# ------------------------------------------------------------------ the tests

@pytest.fixture(scope="module")
def results():
    res = run_ranks(Path(__file__), np=1, launcher="python", args=["--child"],
                    env=dict(TF_ENV), timeout=180)
    out = {}
    for line in res.stdout.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[len("RESULT "):])
            out[(r["case"], r["binding"])] = r["got"]
    assert res.returncode == 0, res.describe()
    return out


@pytest.mark.parametrize("case,kwargs,binding,kind,text", [
    pytest.param(case, kwargs, binding, kind, text, id=f"{case}-{binding}")
    for case, kwargs, bindings, kind, text in CASES for binding in bindings])
def test_same_error_in_every_binding(results, case, kwargs, binding, kind, text):
    assert (case, binding) in results, f"the child reported nothing for {case} / {binding}"
    got = results[(case, binding)]
    assert got is not None, f"{binding} accepted {kwargs}"
    assert got == [kind, text], f"{binding} with {kwargs}"


def test_bindings_agree_case_by_case(results):
    """Whatever the contract's wording, every binding that takes an argument raises the
    same for it."""
    for case, _, bindings, _, _ in CASES:
        seen = {b: results.get((case, b)) for b in bindings}
        assert len({json.dumps(v) for v in seen.values()}) == 1, f"{case}: {seen}"
