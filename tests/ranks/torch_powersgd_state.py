"""Rank program of tests/test_torch_powersgd.py, run by
test_powersgd_state_round_trips_and_bf16."""
from torch_powersgd_common import *  # noqa: F401,F403 (init, the shared helpers, torch, thvd, hvd, np)
from horovodlike.torch.elastic import TorchState


def main():
    R, P = init()
    def run(model, opt, steps):
        for step in steps:
            mlp_step(model, opt, step)
        return flat_params(model)


    # ------------------------------------------------ state_dict round trip (through bytes)
    model = mlp(3)
    psgd = thvd.PowerSGD(rank=2, start_iter=1)
    opt = make_opt(model, psgd)
    run(model, opt, range(3))
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    sd = opt.state_dict()["powersgd"]
    check(sd["iter"] == 3 and set(sd["errors"]) == set(sd["qs"]) and sd["errors"],
          "state_dict has PowerSGD's state", str({k: (v if k == "iter" else sorted(v))
                                                  for k, v in sd.items() if k in ("iter", "qs")}))
    first = run(model, opt, range(3, 6))
    buf.seek(0)
    saved = torch.load(buf, weights_only=False)
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    check(psgd.iter == 3, "iter restored", str(psgd.iter))
    t_equal(run(model, opt, range(3, 6)), first, "replay after load_state_dict")

    # A fresh optimizer loading the checkpoint continues the same way.
    model2 = mlp(99)
    psgd2 = thvd.PowerSGD(rank=2, start_iter=1)
    opt2 = make_opt(model2, psgd2)
    model2.load_state_dict(saved["model"])
    opt2.load_state_dict(saved["opt"])
    t_equal(run(model2, opt2, range(3, 6)), first, "fresh optimizer from the checkpoint")

    # A state_dict held in memory (no torch.save) stays what it was: reduce() updates
    # the error buffers in place, so state_dict() hands out copies of them.
    held = opt2.state_dict()["powersgd"]["errors"]
    snapshot = {k: v.clone() for k, v in held.items()}
    run(model2, opt2, range(6, 8))
    for k, v in held.items():
        t_equal(v, snapshot[k], f"held state_dict's error buffer {k} unchanged by later steps")

    # ------------------------------------------------ elastic TorchState save / restore
    model = mlp(4)
    psgd = thvd.PowerSGD(rank=2, start_iter=1)
    opt = make_opt(model, psgd)
    run(model, opt, range(3))
    state = TorchState(model, opt, epoch=0)
    state.save()
    first = run(model, opt, range(3, 6))
    state.restore()
    check(psgd.iter == 3, "elastic restore: iter", str(psgd.iter))
    t_equal(run(model, opt, range(3, 6)), first, "elastic replay after restore")
    # sync (what a re-formed job runs): every rank takes rank 0's Q's and step count, and
    # keeps its own residuals.
    mine = {k: v.clone() for k, v in psgd.errors.items()}
    if R != 0:
        psgd.qs = {k: torch.zeros_like(v) for k, v in psgd.qs.items()}
        psgd.iter = 0
    state.sync()
    check(psgd.iter == 6, "elastic sync: iter from rank 0", str(psgd.iter))
    for k, q in psgd.qs.items():
        same_on_every_rank(q, f"elastic sync: Q {k} from rank 0")
        t_equal(psgd.errors[k], mine[k], f"elastic sync: rank {R} keeps its residual {k}")
    same_on_every_rank(run(model, opt, range(6, 8)), "identical after sync")

    # ------------------------------------------------ bf16
    x = torch.randn(100, dtype=torch.float64) * 1000
    c, ctx = thvd.Compression.bf16.compress(x)
    check(c.dtype == torch.bfloat16 and ctx == torch.float64, "bf16 compress", str(c.dtype))
    t_equal(thvd.Compression.bf16.decompress(c, ctx), x.to(torch.bfloat16).double(),
            "bf16 round trip")
    for t in (torch.ones(3, dtype=torch.float16), torch.ones(3, dtype=torch.bfloat16),
              torch.arange(3)):
        c, ctx = thvd.Compression.bf16.compress(t)
        check(c is t and ctx is None, f"bf16 leaves {t.dtype} alone")
    model = Params(SHAPES, dtype=torch.float32)
    opt = thvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                    named_parameters=model.named_parameters(),
                                    compression=thvd.Compression.bf16)
    opt.zero_grad()
    model.backward_with([grad_of(s, 0, R, torch.float32) for s in SHAPES])
    opt.synchronize()
    for p, s in zip(model.ps, SHAPES):
        # Each rank's gradient is rounded to bf16, summed in bf16 and cast back.
        exp = sum(grad_of(s, 0, r, torch.float32).to(torch.bfloat16).double()
                  for r in range(P)) / P
        check(p.grad.dtype == torch.float32, "bf16: gradient dtype kept")
        t_close(p.grad, exp.float(), f"bf16 allreduce {s}", rtol=2 ** -7, atol=2 ** -7)
        bad = (p.grad.to(torch.bfloat16).float() != p.grad).sum().item()
        check(bad == 0, f"bf16 allreduce {s}: values are bf16 values", f"{bad} are not")

    # ------------------------------------------------ bad input
    def raises(fn, exc, text, what):
        try:
            fn()
        except exc as e:
            check(text in str(e), what, str(e))
        else:
            fail(what, f"no {exc.__name__}")


    m = mlp(5)
    raises(lambda: make_opt(m, thvd.PowerSGD(), op=thvd.Sum), ValueError, "op=hvd.Average",
           "op=Sum refused")
    raises(lambda: make_opt(m, thvd.PowerSGD), ValueError, "needs an instance", "class refused")
    shared = thvd.PowerSGD()
    make_opt(m, shared)
    raises(lambda: make_opt(m, shared), ValueError, "already belongs", "shared object refused")
    raises(lambda: thvd.PowerSGD(rank=0), ValueError, "rank must be", "rank=0 refused")
    raises(lambda: thvd.PowerSGD(start_iter=-1), ValueError, "start_iter", "start_iter<0 refused")
    raises(lambda: thvd.PowerSGD(min_compression_rate=float("nan")), ValueError,
           "min_compression_rate", "nan rate refused")
    raises(lambda: thvd.PowerSGD().compress(torch.ones(2)), NotImplementedError,
           "horovodlike.tensorflow", "per-tensor use refused")
    raises(lambda: opt2.load_state_dict({**opt2.state_dict(), "powersgd": {"iter": 1}}),
           ValueError, "keys iter, qs, errors", "bad PowerSGD state refused")
    finish()


if __name__ == "__main__":
    main()
