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

COMMON = r'''
import copy
import torch.nn as nn
import torch.nn.functional as F
P = thvd.parallel
thvd.init()
R, N = thvd.rank(), thvd.size()
torch.set_default_dtype(torch.float64)
TOL = 1e-10


def close(got, exp, what):
    t_close(got, exp, what, rtol=0, atol=TOL)


def ref_and_tp(make, plan, ps, seed=0):
    torch.manual_seed(seed)
    ref = make()
    tp = P.tensor_parallel(copy.deepcopy(ref), plan, process_set=ps)
    return ref, tp


def compare_grads(ref, tp, what):
    full = P.consolidated_grads(tp)
    for n, p in ref.named_parameters():
        if p.grad is None:
            check(full.get(n) is None, f"{what} grad {n}", "has a gradient, reference none")
        elif full.get(n) is None:
            fail(f"{what} grad {n}", "missing")
        else:
            close(full[n], p.grad, f"{what} grad {n}")


def compare_params(ref, tp, what, exact=False):
    full = P.consolidated_state_dict(tp)
    ref_sd = ref.state_dict()
    check(set(full) == set(ref_sd), f"{what} keys", f"{sorted(full)} vs {sorted(ref_sd)}")
    for k, v in ref_sd.items():
        if k in full:
            if exact:
                check(full[k].dtype == v.dtype and torch.equal(full[k], v), f"{what} {k}",
                      "not bit-identical")
            else:
                close(full[k], v, f"{what} {k}")
'''

TP_BODY = COMMON + r'''
# ---------------------------------------------------------------- topology layout
for kw, exp in [
        (dict(tp=2), dict(tp=[[0, 1], [2, 3]], dp=[[0, 2], [1, 3]])),
        (dict(tp=4), dict(tp=[[0, 1, 2, 3]], dp=[[0], [1], [2], [3]])),
        (dict(pp=2, tp=2), dict(tp=[[0, 1], [2, 3]], pipe=[[0, 2], [1, 3]],
                                dp=[[0], [1], [2], [3]], stage=[[0, 1], [2, 3]])),
        (dict(pp=2), dict(dp=[[0, 1], [2, 3]], pipe=[[0, 2], [1, 3]],
                          stage=[[0, 1], [2, 3]])),
        (dict(pp=2, order="pp-inner"), dict(dp=[[0, 2], [1, 3]], pipe=[[0, 1], [2, 3]],
                                            stage=[[0, 2], [1, 3]])),
        (dict(pp=4), dict(pipe=[[0, 1, 2, 3]], tied=[[0, 3]]))]:
    topo = P.Topology(**kw)
    for kind, groups in exp.items():
        ps = topo.tied_set((0, topo.pp - 1)) if kind == "tied" else \
            getattr(topo, kind + "_set")
        mine = [g for g in groups if R in g]
        if kind == "tied" and not mine:
            check(ps is None, f"Topology({kw}) tied_set", f"{ps} on rank {R}")
            continue
        check(ps is not None and list(ps.ranks or range(N)) == mine[0],
              f"Topology({kw}).{kind}_set", f"got {ps}, expected {mine[0]}")
    s, d, t = topo.coords(R)
    check((s, d, t) == (topo.stage(), topo.replica(), topo.tp_rank)
          and topo.global_rank(s, d, t) == R, f"Topology({kw}) coords", repr(topo))
    check(topo.first_stage == (s == 0) and topo.last_stage == (s == topo.pp - 1),
          f"Topology({kw}) first/last", repr(topo))
    if topo.pp > 1:
        pipe = list(topo.pipe_set.ranks or range(N))
        i = pipe.index(R)
        check(topo.prev_rank == (pipe[i - 1] if i else None)
              and topo.next_rank == (pipe[i + 1] if i + 1 < len(pipe) else None),
              f"Topology({kw}) prev/next", f"{topo.prev_rank} {topo.next_rank} in {pipe}")
check_raises(ValueError, lambda: P.Topology(tp=3), "not divisible", what="Topology tp=3")
check_raises(ValueError, lambda: P.Topology(tp=2, dp=4), "must equal the job size",
             what="Topology dp=4")
check_raises(ValueError, lambda: P.Topology(order="x"), "order", what="Topology order")

# ---------------------------------------------------------------- equivalence
for TP in (2, 4):
    ps = P.Topology(tp=TP).tp_set
    g = torch.Generator().manual_seed(7)          # the same data on every rank
    cases = [
        ("gpt", lambda: P.GPTBlock(32, 4, dtype=torch.float64), P.GPT_BLOCK_PLAN,
         lambda m, x: m(x), torch.randn(3, 6, 32, generator=g)),
        ("encoder", lambda: nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0,
                                                       batch_first=True),
         P.TRANSFORMER_ENCODER_LAYER_PLAN, lambda m, x: m(x, src_key_padding_mask=PAD),
         torch.randn(3, 6, 32, generator=g)),
        ("encoder seq-first", lambda: nn.TransformerEncoder(nn.TransformerEncoderLayer(
            32, 4, 64, dropout=0.0, norm_first=True), 2, enable_nested_tensor=False),
         P.TRANSFORMER_ENCODER_LAYER_PLAN,
         lambda m, x: m(x, mask=nn.Transformer.generate_square_subsequent_mask(6)),
         torch.randn(6, 3, 32, generator=g)),
    ]
    PAD = torch.zeros(3, 6, dtype=torch.bool)
    PAD[1, 4:] = True
    for name, make, plan, run, x in cases:
        what = f"tp={TP} {name}"
        ref, tp = ref_and_tp(make, plan, ps)
        target = torch.randn(x.shape, generator=g)
        opt_r = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
        opt_t = torch.optim.AdamW(tp.parameters(), lr=1e-2, weight_decay=0.1)
        for step in range(3):
            opt_r.zero_grad()
            opt_t.zero_grad()
            out_r, out_t = run(ref, x), run(tp, x)
            loss_r, loss_t = F.mse_loss(out_r, target), F.mse_loss(out_t, target)
            loss_r.backward()
            loss_t.backward()
            if step == 0:
                close(out_t, out_r, f"{what} forward")
                close(loss_t, loss_r, f"{what} loss")
                compare_grads(ref, tp, what)
            opt_r.step()
            opt_t.step()
        compare_params(ref, tp, f"{what} after 3 AdamW steps")
        # eval mode takes the encoder's other path; it must still agree
        ref.eval()
        tp.eval()
        with torch.no_grad():
            close(run(tp, x), run(ref, x), f"{what} eval forward")

        # memory: sharded parameters and gradients are 1/tp of the unsharded ones
        sharded = replicated = full = 0
        for mod in tp.modules():
            if isinstance(mod, P.TensorParallelModule):
                for pname, p in mod.named_parameters(recurse=False):
                    if pname in mod.tp_spec:
                        sharded += p.numel() * p.element_size()
                        full += math.prod(mod.full_shape(pname)) * p.element_size()
                        check(p.grad is not None and p.grad.numel() == p.numel(),
                              f"{what} grad bytes {pname}", "not the shard's size")
                    else:
                        replicated += p.numel()
        check(sharded * TP == full and full > 0, f"{what} parameter bytes",
              f"{sharded} per rank, {full} unsharded, tp={TP}")
        ref_bytes = sum(p.numel() * p.element_size() for n, p in ref.named_parameters()
                        if not any(k in n for k in ("ln", "norm")))
        check(full + replicated * 8 == ref_bytes, f"{what} layers cover the reference",
              f"{full} + {replicated * 8} vs {ref_bytes}")

        # checkpoint: full -> sharded -> full, bit-identical; sharded loads as it is
        full_sd = {k: v.clone() for k, v in ref.state_dict().items()}
        torch.manual_seed(99)
        _, fresh = ref_and_tp(make, plan, ps, seed=99)
        fresh.load_state_dict(full_sd)
        compare_params(ref, fresh, f"{what} checkpoint round trip", exact=True)
        local = copy.deepcopy(fresh.state_dict())
        _, again = ref_and_tp(make, plan, ps, seed=5)
        again.load_state_dict(local)
        compare_params(ref, again, f"{what} sharded checkpoint", exact=True)

    # ------------------------------------------------------------ vocab-parallel LM
    V, D = 16 * TP, 32

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(V, D)
            self.block = P.GPTBlock(D, 4)
            self.head = nn.Linear(D, V)

        def forward(self, ids):
            return self.head(self.block(self.emb(ids)))

    torch.manual_seed(3)
    ref = LM()
    tp = P.tensor_parallel(copy.deepcopy(ref), dict(P.GPT_BLOCK_PLAN, emb="vocab",
                                                    head="column"), process_set=ps)
    ids = torch.randint(0, V, (2, 5), generator=g)
    y = torch.randint(0, V, (2, 5), generator=g)
    loss_r = F.cross_entropy(ref(ids).flatten(0, 1), y.flatten())
    logits = tp(ids)
    check(logits.shape[-1] == V // TP, f"tp={TP} LM logits stay sharded", str(logits.shape))
    loss_t = P.vocab_parallel_cross_entropy(logits, y, process_set=ps)
    close(loss_t, loss_r, f"tp={TP} vocab-parallel loss")
    loss_r.backward()
    loss_t.backward()
    compare_grads(ref, tp, f"tp={TP} LM")
    none = P.vocab_parallel_cross_entropy(logits.detach(), y, process_set=ps,
                                          reduction="none")
    close(none, F.cross_entropy(ref(ids).flatten(0, 1), y.flatten(),
                                reduction="none").view(2, 5), f"tp={TP} loss per token")

    # ------------------------------------------------------------ sequence parallelism
    ref, sp = ref_and_tp(lambda: P.GPTBlock(32, 4), P.GPT_BLOCK_SEQUENCE_PARALLEL_PLAN, ps)
    x = torch.randn(2, 2 * TP, 32, generator=g)
    target = torch.randn(x.shape, generator=g)
    me = ps.rank()
    out_r = ref(x)
    loss_r = F.mse_loss(out_r, target)
    loss_r.backward()
    out_s = sp(x.chunk(TP, 1)[me])                 # this rank's slice of the sequence
    close(out_s, out_r.chunk(TP, 1)[me], f"tp={TP} sequence-parallel forward")
    part = F.mse_loss(out_s, target.chunk(TP, 1)[me], reduction="sum") / target.numel()
    part.backward()
    close(thvd.allreduce(part.detach(), op=thvd.Sum, process_set=ps), loss_r,
          f"tp={TP} sequence-parallel loss")
    P.allreduce_sequence_parallel_grads(sp, ps)
    compare_grads(ref, sp, f"tp={TP} sequence-parallel")

    # ------------------------------------------------------------ fresh layers
    for cls, args, base in [(P.ColumnParallelLinear, (8, 4 * TP), nn.Linear),
                            (P.RowParallelLinear, (4 * TP, 8), nn.Linear),
                            (P.VocabParallelEmbedding, (4 * TP, 8), nn.Embedding)]:
        torch.manual_seed(11)
        layer = cls(*args, process_set=ps)
        after = torch.rand(1)
        torch.manual_seed(11)
        plain = base(*args)
        check(torch.equal(after, torch.rand(1)), f"tp={TP} {cls.__name__} RNG advance")
        got = P.consolidated_state_dict(layer)
        for k, v in plain.state_dict().items():
            check(torch.equal(got[k], v), f"tp={TP} {cls.__name__} init {k}")
    x = torch.randn(2, 4 * TP, generator=g)
    col = P.ColumnParallelLinear(4 * TP, 6 * TP, gather_output=True, fused=3, process_set=ps)
    full = P.consolidated_state_dict(col)
    close(col(x), F.linear(x, full["weight"], full["bias"]), f"tp={TP} fused gather_output")
    row = P.RowParallelLinear(4 * TP, 5, input_is_parallel=False, process_set=ps)
    full = P.consolidated_state_dict(row)
    close(row(x), F.linear(x, full["weight"], full["bias"]), f"tp={TP} row full input")

# ---------------------------------------------------------------- plan errors
ps = P.Topology(tp=4).tp_set
check_raises(ValueError, lambda: P.tensor_parallel(P.GPTBlock(24, 6), P.GPT_BLOCK_PLAN, ps),
             "attn", "6 heads", "not divisible", "4", what="heads not divisible")
check_raises(ValueError, lambda: P.tensor_parallel(
    nn.TransformerEncoderLayer(24, 6, 32), P.TRANSFORMER_ENCODER_LAYER_PLAN, ps),
    "self_attn", "6 heads", what="encoder heads not divisible")
seq = nn.Sequential(nn.Linear(8, 6), nn.LayerNorm(6), nn.Linear(6, 8))
check_raises(ValueError, lambda: P.tensor_parallel(seq, {"0": "column"}, ps),
             "0: out_features 6 is not divisible", what="dimension not divisible")
check_raises(ValueError, lambda: P.tensor_parallel(seq, {"2": "row"}, ps),
             "2: in_features 6 is not divisible", what="row dimension not divisible")
check_raises(TypeError, lambda: P.tensor_parallel(seq, {"1": "column"}, ps),
             "1:", "nn.Linear", "LayerNorm", what="unsupported module type")
check_raises(ValueError, lambda: P.tensor_parallel(seq, {"fc": "row"}, ps),
             "matched no module", "fc", what="unmatched entry")
check_raises(ValueError, lambda: P.tensor_parallel(seq, {"*": "row", "2": "row"}, ps),
             "more than one plan entry", what="two entries")
check_raises(ValueError, lambda: P.tensor_parallel(seq, {"0": "diagonal"}, ps),
             "diagonal", what="unknown kind")
check_raises(ValueError, lambda: P.tensor_parallel(nn.Sequential(nn.Embedding(8, 4,
             padding_idx=0)), {"0": "vocab"}, ps), "0:", "padding_idx", what="padding_idx")
check(isinstance(seq[0], nn.Linear) and isinstance(seq[2], nn.Linear),
      "a refused plan changes nothing")
check_raises(ValueError, lambda: P.vocab_parallel_cross_entropy(
    torch.randn(2, 4), torch.tensor([1, -100]), process_set=ps), "[0, 16)", "-100",
    what="cross entropy target out of range")
mha = P.ParallelMultiheadAttention(nn.MultiheadAttention(8, 4), ps)
check_raises(NotImplementedError, lambda: mha(*(torch.randn(2, 1, 8),) * 3), "need_weights",
             what="need_weights")
finish()
'''

DP_BODY = COMMON + r'''
topo = P.Topology(tp=2)
assert N == 4


def batch(step, replica):
    g = torch.Generator().manual_seed(100 * step + replica)
    return torch.randn(2, 5, 16, generator=g), torch.randn(2, 5, 16, generator=g)


for kind in ("DistributedOptimizer", "ShardedDistributedOptimizer"):
    ref, tp = ref_and_tp(lambda: P.GPTBlock(16, 2), P.GPT_BLOCK_PLAN, topo.tp_set)
    opt_r = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    inner = torch.optim.AdamW(tp.parameters(), lr=1e-2)
    if kind == "DistributedOptimizer":
        opt_t = thvd.DistributedOptimizer(inner, tp.named_parameters(),
                                          process_set=topo.dp_set)
    else:
        opt_t = thvd.ShardedDistributedOptimizer(inner, tp.named_parameters(),
                                                 process_set=topo.dp_set)
    for step in range(3):
        xs, ys = zip(*(batch(step, d) for d in range(topo.dp)))
        opt_r.zero_grad()
        F.mse_loss(ref(torch.cat(xs)), torch.cat(ys)).backward()
        opt_r.step()
        opt_t.zero_grad()
        x, y = batch(step, topo.replica())
        F.mse_loss(tp(x), y).backward()
        opt_t.step()
    compare_params(ref, tp, f"tp2×dp2 {kind}")
    for n, p in tp.named_parameters():
        same_on_every_rank(p, f"{kind} {n} equal over dp", topo.dp_set)
finish()
'''


def test_tensor_parallel_equivalence_checkpoints_memory_and_errors():
    run_torch("import math\n" + TP_BODY, 4, timeout=240)


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
