"""Tensor parallelism inside a node (docs/tensor_parallel.md), and the Topology that
lays out data × pipeline × tensor parallelism.

    import horovodlike.torch as hvd
    hvd.init()
    topo = hvd.parallel.Topology(tp=2)                  # tp groups of neighbouring ranks
    model = hvd.parallel.tensor_parallel(model, hvd.parallel.GPT_BLOCK_PLAN,
                                         process_set=topo.tp_set)
    opt = hvd.DistributedOptimizer(opt, model.named_parameters(),
                                   process_set=topo.dp_set)

layers: ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding,
        ParallelMultiheadAttention, vocab_parallel_cross_entropy
_comm:  Megatron's f and g (copy_to_tp, reduce_from_tp) and the gather/scatter pair
plan:   tensor_parallel(model, plan), consolidated_state_dict(model)
gpt:    a GPT-style block and the ready plans
"""
from horovodlike.common.topology import Topology  # noqa: F401

from ._comm import copy_to_tp, gather_from_tp, reduce_from_tp, scatter_to_tp  # noqa: F401
from .gpt import GPT_BLOCK_PLAN, TRANSFORMER_ENCODER_LAYER_PLAN, GPTBlock  # noqa: F401
from .layers import (ColumnParallelLinear, ParallelMultiheadAttention,  # noqa: F401
                     RowParallelLinear, TensorParallelModule, VocabParallelEmbedding,
                     vocab_parallel_cross_entropy)
from .plan import (Attention, Column, Heads, Row, Vocab,  # noqa: F401
                   consolidated_grads, consolidated_state_dict,
                   tensor_parallel)
