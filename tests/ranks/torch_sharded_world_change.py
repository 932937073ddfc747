"""Rank program of tests/test_torch_sharded.py, run by
test_checkpoint_round_trip_across_a_change_of_world_size."""
from torch_sharded_common import *  # noqa: F401,F403 (init, the shared helpers, torch, thvd, hvd, np)


def main():
    R, P = init()
    # Phase "save" (4 ranks, 2 partition groups) then phase "load" (2 ranks, 1 group); both
    # compare against a single-process replay of the whole run with plain Adam.
    PHASE = os.environ["HVDTEST_PHASE"]
    OLD_P = 4


    def reference(steps):
        model = Net(100)
        opt = OPTIMIZERS["Adam"](groups(model, 0.1))
        for step in range(steps):
            ranks = OLD_P if step < 3 else 2
            opt.zero_grad()
            loss = sum(F.cross_entropy(model(batch(10 * step, r)[0]), batch(10 * step, r)[1])
                       for r in range(ranks)) / ranks
            loss.backward()
            model.unused.grad = torch.zeros(4)    # Horovod: a gradient no rank computed is 0
            opt.step()
        return params_of(model)


    if PHASE == "save":
        model = fresh(100)
        opt = thvd.ShardedDistributedOptimizer(OPTIMIZERS["Adam"](groups(model, 0.1)),
                                               named_parameters=model.named_parameters(),
                                               shard_size=2, bucket_cap_mb=CAP)
        for step in range(3):
            train_step(model, opt, step)
        compare(model, reference(3), "before the checkpoint", rtol=1e-5, atol=1e-6)
        torch.save(opt.state_dict(), f"{TMP}/shard.{R}.pt")
        cons = opt.consolidated_state_dict(root_rank=0)
        if R == 0:
            torch.save(cons, f"{TMP}/full.pt")
            torch.save(model.state_dict(), f"{TMP}/model.pt")
    else:
        for label, load in [("shards of a 4-rank job", lambda: [torch.load(f"{TMP}/shard.{r}.pt")
                                                               for r in range(2)]),
                            ("the other partition group's shards",
                             lambda: [torch.load(f"{TMP}/shard.{r}.pt") for r in (2, 3)]),
                            ("a consolidated dict", lambda: torch.load(f"{TMP}/full.pt"))]:
            for S in (2, 1):
                model = Net(0)
                model.load_state_dict(torch.load(f"{TMP}/model.pt"))
                opt = thvd.ShardedDistributedOptimizer(OPTIMIZERS["Adam"](groups(model, 0.1)),
                                                       named_parameters=model.named_parameters(),
                                                       shard_size=S, bucket_cap_mb=CAP * 2)
                opt.load_state_dict(load())
                for step in range(3, 6):
                    train_step(model, opt, step)
                compare(model, reference(6), f"resumed from {label} with shard_size={S}",
                        rtol=1e-5, atol=1e-6)
        shard = torch.load(f"{TMP}/shard.{R}.pt")
        check_raises(ValueError, lambda: opt.load_state_dict(shard), "shard_size=2 of 4",
                     "pass the list", what="one shard of another world size")
        check_raises(ValueError, lambda: opt.load_state_dict([shard]), "every member",
                     what="a list missing a member")
    finish()


if __name__ == "__main__":
    main()
