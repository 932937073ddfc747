"""Rank program of tests/test_torch_sharded.py, run by
test_hybrid_shards_inside_fake_nodes, test_sharded_matches_distributed_optimizer."""
from torch_sharded_common import *  # noqa: F401,F403 (init, the shared helpers, torch, thvd, hvd, np)


def main():
    R, P = init()
    if os.environ.get("HVDTEST_LOCAL_SHARDS") == "1":
        check(thvd.local_size() == 2 and thvd.size() == 4, "two fake nodes of two ranks")
    STEPS = 4
    for label, make in OPTIMIZERS.items():
        ref_model = fresh()
        ref_opt = thvd.DistributedOptimizer(make(groups(ref_model, 0.1)),
                                            named_parameters=ref_model.named_parameters())
        for step in range(STEPS):
            train_step(ref_model, ref_opt, step)
        ref = params_of(ref_model)
        ref_state = ref_opt.state_dict()
        check(not torch.equal(ref[0], params_of(fresh())[0]), f"{label}: training moved weights")
        for S in shard_sizes():
            for stage in (1, 2):
                what = f"{label} S={S} stage={stage}"
                model = fresh()
                opt = thvd.ShardedDistributedOptimizer(
                    make(groups(model, 0.1)), named_parameters=model.named_parameters(),
                    stage=stage, shard_size=S, bucket_cap_mb=CAP)
                thvd.broadcast_optimizer_state(opt, root_rank=0)
                check(len(opt._buckets) > 2, f"{what}: several buckets", str(len(opt._buckets)))
                for step in range(STEPS):
                    train_step(model, opt, step)
                    if stage == 2:
                        check(all(p.grad is None for p in model.parameters()),
                              f"{what}: stage 2 keeps no full gradients")
                compare(model, ref, what)
                identical_in(model, opt, what)
                check(model.frozen.grad is None and torch.equal(model.frozen.detach(),
                                                                torch.ones(2)),
                      f"{what}: the frozen parameter is untouched")
                # optimizer state: 1/S of the elements here, all of them over the group
                full = sum(v.numel() for s in ref_opt.state.values() for k, v in s.items()
                           if k != "step")
                mine = torch.tensor([sum(v.numel() for s in opt._inner.state.values()
                                         for k, v in s.items() if k != "step")])
                total = thvd.allreduce(mine, op=thvd.Sum, process_set=opt.partition_set) \
                    if opt.partition_set is not None else mine
                check(int(total) == full, f"{what}: state elements over the partition group",
                      f"{int(total)} != {full}")
                check(int(mine) <= full // S + 64, f"{what}: ~1/S of the state here",
                      f"{int(mine)} of {full}")
                cons = opt.consolidated_state_dict(root_rank=P - 1)
                check((cons is not None) == (R == P - 1), f"{what}: consolidated on root only")
                if R == P - 1:
                    check(sorted(cons["state"]) == sorted(ref_state["state"]),
                          f"{what}: consolidated state covers the parameters",
                          f"{sorted(cons['state'])} vs {sorted(ref_state['state'])}")
                    for j, s in ref_state["state"].items():
                        for k, v in s.items():
                            got = cons["state"].get(j, {}).get(k)
                            if isinstance(v, torch.Tensor):
                                t_close(got if isinstance(got, torch.Tensor) else torch.zeros(0),
                                        v, f"{what}: consolidated state[{j}][{k!r}]",
                                        rtol=1e-4, atol=1e-6)
                    check([{k: v for k, v in g.items()} for g in cons["param_groups"]]
                          == ref_state["param_groups"], f"{what}: consolidated param_groups")

    # Options, each against DistributedOptimizer with the same options (Adam, S = P).
    for label, kw, passes, clip, tol in [
            ("backward_passes_per_step=2", dict(backward_passes_per_step=2), 2, None, 1e-6),
            ("fp16 compression", dict(compression=thvd.Compression.fp16), 1, None, 2e-3),
            ("op=Sum", dict(op=thvd.Sum), 1, None, 1e-6),
            ("clip 2-norm", {}, 1, (0.05, 2.0), 1e-6),
            ("clip inf-norm", {}, 1, (0.02, float("inf")), 1e-6)]:
        for stage in (1, 2):
            what = f"{label} stage={stage}"
            ref_model, model = fresh(), fresh()
            ref_opt = thvd.DistributedOptimizer(OPTIMIZERS["Adam"](groups(ref_model, 0.1)),
                                                named_parameters=ref_model.named_parameters(),
                                                **kw)
            opt = thvd.ShardedDistributedOptimizer(
                OPTIMIZERS["Adam"](groups(model, 0.1)), named_parameters=model.named_parameters(),
                stage=stage, bucket_cap_mb=CAP, shard_size=shard_sizes()[-1], **kw)
            for step in range(3):
                n_ref = train_step(ref_model, ref_opt, step, passes, clip)
                n = train_step(model, opt, step, passes, clip)
                if clip is not None:
                    t_close(n.reshape(1).float(), n_ref.reshape(1).float(),
                            f"{what}: total norm step {step}", rtol=1e-5, atol=1e-7)
                    check(float(n_ref) > clip[0], f"{what}: the norm is over the threshold")
                if clip is not None and stage == 1:
                    for p, q in zip(model.parameters(), ref_model.parameters()):
                        if q.grad is not None and p.requires_grad:
                            t_close(p.grad, q.grad, f"{what}: stage 1 p.grad after clipping",
                                    rtol=1e-5, atol=1e-7)
            compare(model, params_of(ref_model), what, rtol=tol, atol=tol)
            identical_in(model, opt, what)

    # Checkpoints: shards saved with one shard size load into another (a list of one
    # partition group's state_dict()s, or the consolidated dict), and training goes on
    # exactly as without the round trip.
    S_old = shard_sizes()[0]
    base = fresh()
    opt = thvd.ShardedDistributedOptimizer(OPTIMIZERS["Adam"](groups(base, 0.1)),
                                           named_parameters=base.named_parameters(),
                                           shard_size=S_old, bucket_cap_mb=CAP)
    for step in range(2):
        train_step(base, opt, step)
    torch.save(opt.state_dict(), f"{TMP}/shard.{R}.pt")
    cons = opt.consolidated_state_dict(root_rank=0)
    if R == 0:
        torch.save(cons, f"{TMP}/full.pt")
    thvd.barrier()
    shards = [torch.load(f"{TMP}/shard.{r}.pt") for r in range(S_old)]
    full = torch.load(f"{TMP}/full.pt")
    for S_new in shard_sizes():
        for label, loaded in [("a list of shards", shards), ("the consolidated dict", full)]:
            what = f"load {label} S={S_old}->{S_new}"
            model = copy.deepcopy(base)
            opt2 = thvd.ShardedDistributedOptimizer(
                OPTIMIZERS["Adam"](groups(model, 0.1)), named_parameters=model.named_parameters(),
                shard_size=S_new, bucket_cap_mb=CAP * 3)
            opt2.load_state_dict(loaded)
            for step in range(2, 4):
                train_step(model, opt2, step)
            if label == "a list of shards":
                check(sorted(opt2.state_dict()["state"]) == list(range(len(opt2._pieces))),
                      f"{what}: every piece has state")
            expect = copy.deepcopy(base)
            o3 = thvd.ShardedDistributedOptimizer(
                OPTIMIZERS["Adam"](groups(expect, 0.1)), named_parameters=expect.named_parameters(),
                shard_size=S_old, bucket_cap_mb=CAP)
            o3.load_state_dict(opt.state_dict())          # its own layout: loaded as it is
            for step in range(2, 4):
                train_step(expect, o3, step)
            compare(model, params_of(expect), what)
    if P > 1:
        other = torch.load(f"{TMP}/shard.{(R + 1) % S_old}.pt") if S_old > 1 else None
        if other is not None:
            check_raises(ValueError, lambda: opt.load_state_dict(other), "shard_size=",
                         "pass the list", what="loading another member's shard")
        check_raises(ValueError, lambda: opt.load_state_dict(shards[:-1] if S_old > 1 else []),
                     what="an incomplete list of shards")

    # broadcast_optimizer_state: rank 0's hyperparameters, and each shard from its replica in
    # rank 0's partition group.
    model = fresh()
    opt = thvd.ShardedDistributedOptimizer(OPTIMIZERS["Adam"](groups(model, 0.1)),
                                           named_parameters=model.named_parameters(),
                                           shard_size=shard_sizes()[-1], bucket_cap_mb=CAP)
    ref_model = fresh()
    ref_opt = thvd.DistributedOptimizer(OPTIMIZERS["Adam"](groups(ref_model, 0.1)),
                                        named_parameters=ref_model.named_parameters())
    for step in range(2):
        train_step(model, opt, step)
        train_step(ref_model, ref_opt, step)
    if R == 0:
        opt.param_groups[0]["lr"] = 0.02
        ref_opt.param_groups[0]["lr"] = 0.02
    elif R >= opt.shard_size:           # not rank 0's partition group: spoil this shard
        for s in opt._inner.state.values():
            for k, v in s.items():
                if k != "step":
                    v.mul_(3)
    thvd.broadcast_optimizer_state(opt, root_rank=0)
    thvd.broadcast_optimizer_state(ref_opt, root_rank=0)
    check(opt.param_groups[0]["lr"] == 0.02, "broadcast_optimizer_state: lr from rank 0")
    for step in range(2, 4):
        train_step(model, opt, step)
        train_step(ref_model, ref_opt, step)
    compare(model, params_of(ref_model), "after broadcast_optimizer_state")
    finish()


if __name__ == "__main__":
    main()
