"""Rank program of tests/test_torch_tensor_parallel.py, run by
test_tensor_parallel_equivalence_checkpoints_memory_and_errors."""
from torch_tensor_parallel_common import *  # noqa: F401,F403 (init, the shared helpers, torch, thvd, hvd, np)
import math


def main():
    R, N = init()
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


if __name__ == "__main__":
    main()
