"""Gradient compression for slow links in horovodlike.torch's DistributedOptimizer:
Compression.bf16 and hvd.PowerSGD, on real ranks.

Every rank can regenerate every rank's gradients (seeded by step and rank), so it checks
the compressed results against the exact average it computes itself.
"""
import importlib.util

import pytest

from harness import rank_program, run_ranks
from test_torch_support import run_torch

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(300)


ALGORITHM = rank_program("torch_powersgd_algorithm")

STATE = rank_program("torch_powersgd_state")

DIGITS = rank_program("torch_powersgd_digits")


def test_powersgd_algorithm_on_real_ranks():
    """Full-rank exactness, error feedback, warm-up, bit-identity,
    backward_passes_per_step and process sets, at 3 ranks."""
    run_torch(ALGORITHM, 3, timeout=180, env={"HOROVOD_DYNAMIC_PROCESS_SETS": "1"})


def test_powersgd_state_round_trips_and_bf16():
    """state_dict and elastic TorchState round trips, elastic sync, bf16, bad input."""
    run_torch(STATE, 2, timeout=180)


def test_powersgd_digits_accuracy_within_one_point():
    pytest.importorskip("sklearn")
    res = run_torch(DIGITS, 2, timeout=180)
    print([l for l in res.stdout.splitlines() if "accuracy" in l])


TF_REFUSAL = rank_program("torch_powersgd_tf_refusal")


def test_tensorflow_bf16_compressor_and_powersgd_refusal():
    tf = pytest.importorskip("tensorflow")
    from tf_support import TF_ENV
    run_ranks(TF_REFUSAL, 1, "python", env=TF_ENV, timeout=120).assert_ok()
    from horovodlike.tensorflow.compression import Compression
    x = tf.constant([1.0, 1.0 + 2 ** -10, 3e38], dtype=tf.float32)
    c, ctx = Compression.bf16.compress(x)
    assert c.dtype == tf.bfloat16 and ctx == tf.float32
    out = Compression.bf16.decompress(c, ctx)
    assert out.dtype == tf.float32
    assert out.numpy().tolist() == tf.cast(tf.cast(x, tf.bfloat16), tf.float32).numpy().tolist()
    assert out.numpy()[1] == 1.0             # 8 significant bits
    h = tf.constant([1.0], dtype=tf.float16)
    assert Compression.bf16.compress(h) == (h, None)
