"""Tensor parallelism (horovodlike.torch.parallel) and the Topology, on real ranks.

One launch of 4 ranks after a plain hvd.init() (no dynamic sets) checks, for tp = 2
(two groups side by side, the other axis data parallel) and tp = 4:
- the layout and sets of Topology for several shapes and both orders;
- a GPT-style block and nn.TransformerEncoderLayer (batch_first and not, a padding
  mask) in float64: output, loss and every gradient equal the single-process model's
  within 1e-10, and the parameters after 3 AdamW steps;
- the GPT block with sequence parallelism (input and output split along the sequence):
  output slices, loss and every gradient;
- a small LM with VocabParallelEmbedding, a column-parallel head and
  vocab_parallel_cross_entropy against nn.Embedding / nn.Linear / F.cross_entropy;
- fresh layers: with the same seed, the full weight is the unsharded layer's;
- checkpoints: full -> sharded (load_state_dict) -> full (consolidated_state_dict) is
  bit-identical, and a sharded state dict loads back as it is;
- memory: the sharded parameters and their gradients are 1/tp of the unsharded ones
  (the row-parallel biases, replicated as in Megatron, are counted apart);
- the plan's errors, each naming the module and the reason.
A second launch trains tp 2 × dp 2 with DistributedOptimizer and with
ShardedDistributedOptimizer over the Topology's dp_set against the global batch. The
example trains at tp 2 × dp 2. One launch of 8 ranks checks Topology's pp 2 × dp 2 × tp 2
layout with a collective over every set, then trains on it: a GPT block per pipeline
stage split over tp_set, 1F1B over pipe_set, DistributedOptimizer over dp_set, against
the whole model in one process on the global batch: the losses of every step and every
parameter after 3 AdamW steps within 1e-10 in float64 (measured: losses within 5e-16,
parameters within 4e-12; AdamW's division by sqrt(v) amplifies the summation-order
differences of small gradients, hence the margin).
"""
import importlib.util

import pytest

from harness import rank_program
from test_torch_support import run_torch

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(300)


TP_BODY = rank_program("torch_tensor_parallel_tp_body")

DP_BODY = rank_program("torch_tensor_parallel_dp_body")


def test_tensor_parallel_equivalence_checkpoints_memory_and_errors():
    run_torch(TP_BODY, 4, timeout=240)


def test_tensor_parallel_with_data_parallel_optimizers():
    run_torch(DP_BODY, 4, timeout=150)


def test_example_trains_tp2_dp2():
    from harness import REPO, run_ranks
    res = run_ranks(REPO / "examples" / "pytorch_tensor_parallel_gpt.py", 4,
                    args=["--steps", "12"], timeout=150)
    assert res.returncode == 0, res.describe()
    out = "\n".join(res.rank_lines()[0])
    losses = [float(l.split()[-1]) for l in res.rank_lines()[0] if l.startswith("step")]
    assert len(losses) >= 3 and losses[-1] < 0.5 * losses[0], out
    assert "tp=2 dp=2" in out and "unsharded model from the consolidated state" in out, out


EIGHT_RANKS = rank_program("torch_tensor_parallel_eight_ranks")


def test_pp2_tp2_dp2_at_8_ranks_layout_and_training():
    run_torch(EIGHT_RANKS, 8, timeout=180)
