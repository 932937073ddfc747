"""A GPT-style transformer block, and the plan that splits it across a tensor-parallel
set (Megatron's layout):

    attn.qkv   Column(fused=3)  q, k and v each split by heads: rank r holds heads
                                r·H/t .. (r+1)·H/t of all three
    attn.proj  Row              the heads' outputs summed over the set (g)
    attn       Heads("n_head")  each rank runs its H/t heads
    mlp.fc1    Column           4h/t hidden units per rank
    mlp.fc2    Row              summed over the set (g)

The layer norms are replicated. Per block: one allreduce of b·s·h in the attention and
one in the MLP forward, and the same two in backward (f), nothing else.

The attention takes its head count from `n_head` and every width from the tensors, which
is what lets Heads() split it; a block of your own follows GPT_BLOCK_PLAN when it does
the same and names its modules alike.
"""
import torch.nn as nn
import torch.nn.functional as F

from .plan import Column, Heads

GPT_BLOCK_PLAN = {"*attn.qkv": Column(fused=3), "*attn.proj": "row", "*attn": Heads("n_head"),
                  "*mlp.fc1": "column", "*mlp.fc2": "row"}

TRANSFORMER_ENCODER_LAYER_PLAN = {"*self_attn": "attention", "*linear1": "column",
                                  "*linear2": "row"}


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model, n_head, bias=True, dtype=None):
        super().__init__()
        if d_model % n_head:
            raise ValueError(f"d_model {d_model} is not divisible by n_head {n_head}")
        self.n_head = n_head
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias, dtype=dtype)
        self.proj = nn.Linear(d_model, d_model, bias=bias, dtype=dtype)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (t.unflatten(-1, (self.n_head, -1)).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).flatten(-2))


class MLP(nn.Module):
    def __init__(self, d_model, d_ff, bias=True, dtype=None):
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff, bias=bias, dtype=dtype)
        self.fc2 = nn.Linear(d_ff, d_model, bias=bias, dtype=dtype)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class GPTBlock(nn.Module):
    """Pre-norm block: x + attn(ln_1(x)), then + mlp(ln_2(x)). Input [batch, seq, d_model]."""

    def __init__(self, d_model, n_head, d_ff=None, bias=True, dtype=None):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model, dtype=dtype)
        self.attn = CausalSelfAttention(d_model, n_head, bias, dtype)
        self.ln_2 = nn.LayerNorm(d_model, dtype=dtype)
        self.mlp = MLP(d_model, d_ff or 4 * d_model, bias, dtype)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))
