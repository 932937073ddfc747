"""Rank program of tests/test_torch_process_sets_join.py, run by
test_process_sets_with_ranks_doing_different_things."""
from _torch_common import *  # noqa: F401,F403 (torch, thvd, hvd, np, the check helpers)
import torch.nn as nn


def main():
    STATIC = os.environ.get("HVDTEST_STATIC") == "1"
    P_ENV = int(os.environ.get("HOROVOD_SIZE") or os.environ.get("OMPI_COMM_WORLD_SIZE") or 1)
    EVEN = [r for r in range(P_ENV) if r % 2 == 0]
    ODD = [r for r in range(P_ENV) if r % 2 == 1]
    if STATIC:
        even_set, odd_set = thvd.ProcessSet(EVEN), thvd.ProcessSet(ODD)
        thvd.init(process_sets=[even_set, odd_set])
    else:
        thvd.init(process_sets="dynamic")
        even_set = thvd.add_process_set(EVEN)
        odd_set = thvd.add_process_set(thvd.ProcessSet(ODD))
    R, P = thvd.rank(), thvd.size()
    mine, other = (even_set, odd_set) if R % 2 == 0 else (odd_set, even_set)
    members = EVEN if R % 2 == 0 else ODD
    n, idx = len(members), members.index(R)
    check(mine.included() and not other.included(), "included()")
    check(mine.size() == n and mine.rank() == idx, "size()/rank() of the set",
          f"{mine.size()} {mine.rank()}")

    # Collectives in each set, at the same time, under the same names.
    x = torch.full((3,), float(R))
    t_equal(thvd.allreduce(x, op=thvd.Sum, name="work", process_set=mine),
            torch.full((3,), float(sum(members))), "allreduce Sum in the set")
    t_close(thvd.allreduce(x, name="work.avg", process_set=mine),
            torch.full((3,), sum(members) / n), "allreduce Average divides by the set size")
    t_equal(thvd.allgather(torch.full((R + 1, 2), R), process_set=mine),
            torch.cat([torch.full((r + 1, 2), r) for r in members]), "allgather in the set")
    for root in members:
        t_equal(thvd.broadcast(x, root, process_set=mine), torch.full((3,), float(root)),
                f"broadcast in the set from global rank {root}")
        y = x.clone()
        thvd.broadcast_(y, root_rank=root, process_set=mine)
        t_equal(y, torch.full((3,), float(root)), f"broadcast_ in the set from {root}")
    out, rs = thvd.alltoall(torch.tensor([10 * R + j for j in range(n)]), splits=[1] * n,
                            process_set=mine)
    t_equal(out, torch.tensor([10 * s + idx for s in members]), "alltoall in the set")
    t_equal(rs, torch.ones(n, dtype=torch.int32), "alltoall received splits in the set")
    rows = 2 * n + 1
    share = rows // n + (1 if idx < rows % n else 0)
    start = sum(rows // n + (1 if j < rows % n else 0) for j in range(idx))
    full = torch.arange(float(rows)).reshape(rows, 1)
    t_equal(thvd.reducescatter(full * (R + 1), op=thvd.Sum, process_set=mine),
            (full * sum(r + 1 for r in members))[start:start + share], "reducescatter in the set")
    outs = thvd.grouped_allreduce([x, x.to(torch.int32)], op=thvd.Max, process_set=mine)
    t_equal(outs[1], torch.full((3,), max(members), dtype=torch.int32), "grouped_allreduce in set")
    thvd.barrier(process_set=mine)

    # Even ranks reduce while odd ranks gather, under one name.
    if R % 2 == 0:
        got = thvd.allreduce(torch.ones(2), op=thvd.Sum, name="different", process_set=mine)
        t_equal(got, torch.full((2,), float(n)), "even set allreduces while odd gathers")
    else:
        got = thvd.allgather(torch.ones(1, 2), name="different", process_set=mine)
        t_equal(got, torch.ones(n, 2), "odd set gathers while even allreduces")

    # Global collectives interleave with set collectives.
    t_equal(thvd.allreduce(torch.ones(1), op=thvd.Sum, name="global"), torch.full((1,), float(P)),
            "global allreduce between set collectives")

    # Autograd in a set: allgather's backward uses this rank's index in the set.
    g_in = torch.full((R + 1,), float(R), requires_grad=True)
    g = thvd.allgather(g_in, process_set=mine)
    weights = torch.arange(float(g.numel()))
    (g * weights).sum().backward()
    offset = sum(r + 1 for r in members[:idx])
    t_equal(g_in.grad, weights[offset:offset + R + 1], "allgather backward in the set")

    # Objects in a set.
    check(thvd.broadcast_object(R if R == members[-1] else None, root_rank=members[-1],
                                process_set=mine) == members[-1], "broadcast_object in the set")
    check(thvd.allgather_object(R * 10, process_set=mine) == [r * 10 for r in members],
          "allgather_object in the set")

    # Training in each set: identical within the set, each set on its own data.
    torch.manual_seed(R)
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    thvd.broadcast_parameters(model.state_dict(), root_rank=members[0], process_set=mine)
    opt = thvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                    process_set=mine)
    for step in range(3):
        opt.zero_grad()
        model(torch.full((4, 3), float(R + step))).pow(2).sum().backward()
        opt.step()
    same_on_every_rank(flat_params(model), "DistributedOptimizer in a set", process_set=mine)

    # A rank outside a set cannot use it.
    if other.size() > 0 and P > 1:
        check_raises(ValueError, lambda: thvd.allreduce(torch.ones(1), process_set=other),
                     "member", what="allreduce on a set this rank is not in")
    if not STATIC:
        check(thvd.remove_process_set(odd_set) in (True, None), "remove_process_set")
        thvd.remove_process_set(even_set)
        check_raises(ValueError, lambda: thvd.allreduce(torch.ones(1), process_set=mine),
                     what="allreduce on a removed set")
        third = thvd.add_process_set(list(range(P)))
        t_equal(thvd.allreduce(torch.ones(1), op=thvd.Sum, process_set=third),
                torch.full((1,), float(P)), "a set added after removals")
    finish()


if __name__ == "__main__":
    main()
