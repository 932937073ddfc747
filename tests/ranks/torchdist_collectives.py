"""Every torch.distributed collective on backend="horovodlike", for every engine dtype,
on the default group and on a new_group, checked against values computed from rank and
size. argv: "hvd-first" calls hvd.init() before init_process_group (a mixed script);
"store" passes an explicit store; "plain" lets torch's env:// rendezvous run."""
from _torch_common import *  # noqa: F401,F403
import datetime
import sys
import torch.distributed as dist
import horovodlike.torch.distributed  # noqa: F401  (registers the backend)

mode = sys.argv[1] if len(sys.argv) > 1 else "plain"
if mode == "hvd-first":
    thvd.init()
if mode == "store":
    import os
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]) + 7,
                          int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"]) == 0)
    dist.init_process_group("horovodlike", store=store, rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))
else:
    dist.init_process_group("horovodlike", timeout=datetime.timedelta(seconds=60))
thvd.init()          # the engine the backend runs on; a no-op if already running
R, N = dist.get_rank(), dist.get_world_size()
check(thvd.rank() == R and thvd.size() == N, "engine and torch agree on rank and size")

SUB = list(range(0, N, 2)) if N > 2 else [0, 1]
sub = dist.new_group(SUB)
other = dist.new_group([r for r in range(N) if r not in SUB] or [1])
INTS = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]


def val(rank, dtype, k=5):
    x = torch.arange(k, dtype=torch.float64) % 3 + rank + 1
    return x.to(dtype)


def groups():
    yield "world", None, list(range(N))
    if R in SUB:
        yield "sub", sub, SUB


def reduce_ref(members, dtype, op):
    vals = [val(m, dtype).double() for m in members]
    if op == dist.ReduceOp.SUM:
        out = sum(vals)
    elif op == dist.ReduceOp.AVG:
        out = sum(vals) / len(vals)
    elif op == dist.ReduceOp.MIN:
        out = torch.stack(vals).min(0).values
    elif op == dist.ReduceOp.MAX:
        out = torch.stack(vals).max(0).values
    else:
        out = torch.stack(vals).prod(0)
    return out


def tol(dtype):
    return dict(rtol=TORCH_EPS.get(dtype, 0) * 8, atol=TORCH_EPS.get(dtype, 0) * 8)


# ---- all_reduce, every op and dtype, both groups, sync and async
for gname, g, members in groups():
    me = members.index(R)
    for dtype in ALL_TORCH_DTYPES:
        ops = [dist.ReduceOp.SUM, dist.ReduceOp.MIN, dist.ReduceOp.MAX]
        if dtype != torch.bool:
            ops += [dist.ReduceOp.PRODUCT]
        if dtype.is_floating_point:
            ops += [dist.ReduceOp.AVG]
        for op in ops:
            t = val(R, dtype)
            dist.all_reduce(t, op=op, group=g)
            exp = reduce_ref(members, dtype, op)
            if dtype == torch.bool:
                exp = exp.bool()
            t_close(t.double(), exp.to(dtype).double(), f"all_reduce {op} {dtype} {gname}",
                    **tol(dtype))
        if dtype.is_floating_point:
            t = val(R, dtype)
            w = dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5), group=g, async_op=True)
            check(isinstance(w, dist.Work), f"async_op returns a Work ({gname})")
            w.wait()
            t_close(t.double(), (reduce_ref(members, dtype, dist.ReduceOp.SUM) * 0.5)
                    .to(dtype).double(), f"all_reduce PREMUL_SUM {dtype} {gname}", **tol(dtype))
        # broadcast from the last member
        t = val(R, dtype)
        dist.broadcast(t, src=members[-1], group=g)
        t_equal(t, val(members[-1], dtype), f"broadcast {dtype} {gname}")
        # all_gather (list), into tensor, uneven
        outs = [torch.empty(5, dtype=dtype) for _ in members]
        dist.all_gather(outs, val(R, dtype), group=g)
        for i, m in enumerate(members):
            t_equal(outs[i], val(m, dtype), f"all_gather {dtype} {gname} [{i}]")
        out = torch.empty(5 * len(members), dtype=dtype)
        dist.all_gather_into_tensor(out, val(R, dtype), group=g)
        t_equal(out, torch.cat([val(m, dtype) for m in members]),
                f"all_gather_into_tensor {dtype} {gname}")
        outs = [torch.empty(i + 1, dtype=dtype) for i in range(len(members))]
        dist.all_gather(outs, val(R, dtype, me + 1), group=g)
        for i, m in enumerate(members):
            t_equal(outs[i], val(m, dtype, i + 1), f"uneven all_gather {dtype} {gname} [{i}]")
        # reduce_scatter (list and tensor)
        if dtype != torch.bool:
            k = len(members)
            inp = torch.cat([val(R, dtype) for _ in range(k)])
            out = torch.empty(5, dtype=dtype)
            dist.reduce_scatter_tensor(out, inp, group=g)
            exp = reduce_ref(members, dtype, dist.ReduceOp.SUM).to(dtype)
            t_close(out.double(), exp.double(), f"reduce_scatter_tensor {dtype} {gname}",
                    **tol(dtype))
            out = torch.empty(5, dtype=dtype)
            dist.reduce_scatter(out, [val(R, dtype) * 0 + i + R for i in range(k)],
                                op=dist.ReduceOp.MAX, group=g)
            t_equal(out, (val(R, dtype) * 0 + me + members[-1]).to(dtype),
                    f"reduce_scatter MAX {dtype} {gname}")
        # all_to_all_single with splits: member j gets j+1 rows from each
        k = len(members)
        rows = sum(j + 1 for j in range(k))
        inp = (torch.arange(rows, dtype=torch.float64) + 100 * R).to(dtype) \
            if dtype != torch.bool else torch.ones(rows, dtype=dtype)
        out = torch.empty(k * (me + 1), dtype=dtype)
        dist.all_to_all_single(out, inp, output_split_sizes=[me + 1] * k,
                               input_split_sizes=[j + 1 for j in range(k)], group=g)
        start = sum(j + 1 for j in range(me))
        exp = torch.cat([((torch.arange(rows, dtype=torch.float64) + 100 * m)[start:start + me + 1])
                         for m in members]).to(dtype) if dtype != torch.bool else \
            torch.ones(k * (me + 1), dtype=dtype)
        t_equal(out, exp, f"all_to_all_single splits {dtype} {gname}")

    # all_to_all (lists), gather, scatter, reduce (float32)
    k = len(members)
    outs = [torch.empty(2) for _ in range(k)]
    dist.all_to_all(outs, [torch.full((2,), float(10 * R + j)) for j in range(k)], group=g)
    for i, m in enumerate(members):
        t_equal(outs[i], torch.full((2,), float(10 * m + me)), f"all_to_all {gname} [{i}]")
    root = members[-1]
    gl = [torch.empty(3) for _ in range(k)] if R == root else None
    dist.gather(torch.full((3,), float(R)), gl, dst=root, group=g)
    if R == root:
        for i, m in enumerate(members):
            t_equal(gl[i], torch.full((3,), float(m)), f"gather {gname} [{i}]")
    out = torch.empty(3)
    dist.scatter(out, [torch.full((3,), float(i + 7)) for i in range(k)] if R == root else None,
                 src=root, group=g)
    t_equal(out, torch.full((3,), float(me + 7)), f"scatter {gname}")
    t = torch.full((3,), float(R + 1))
    dist.reduce(t, dst=root, group=g)
    if R == root:
        t_equal(t, torch.full((3,), float(sum(m + 1 for m in members))), f"reduce {gname}")
    # coalesced forms
    ts = [torch.full((i + 1,), float(R)) for i in range(3)]
    with dist._coalescing_manager(group=g):
        for t in ts:
            dist.all_reduce(t, group=g)
    for i, t in enumerate(ts):
        t_equal(t, torch.full((i + 1,), float(sum(members))), f"coalesced all_reduce {gname} {i}")
    dist.all_reduce_coalesced([torch.ones(2), torch.ones(3)], group=g)
    outs = [torch.empty(2 * k), torch.empty(3 * k)]
    (g or dist.group.WORLD).all_gather_single_coalesced(
        outs, [torch.full((2,), float(R)), torch.full((3,), float(R))]).wait()
    t_equal(outs[1], torch.cat([torch.full((3,), float(m)) for m in members]),
            f"all_gather_single_coalesced {gname}")
    outs = [torch.empty(2), torch.empty(1)]
    (g or dist.group.WORLD).reduce_scatter_single_coalesced(
        outs, [torch.ones(2 * k), torch.ones(k)]).wait()
    t_equal(outs[0], torch.full((2,), float(k)), f"reduce_scatter_single_coalesced {gname}")
    # objects
    objs = [None] * k
    dist.all_gather_object(objs, {"rank": R}, group=g)
    check(objs == [{"rank": m} for m in members], f"all_gather_object {gname}", str(objs))
    lst = [f"from{root}", 3] if R == root else [None, None]
    dist.broadcast_object_list(lst, src=root, group=g)
    check(lst == [f"from{root}", 3], f"broadcast_object_list {gname}", str(lst))
    dist.barrier(group=g)
    (g or dist.group.WORLD).monitored_barrier(datetime.timedelta(seconds=30))

# ---- p2p: send/recv, isend/irecv, batch_isend_irecv (ring)
nxt, prv = (R + 1) % N, (R - 1) % N
for dtype in ALL_TORCH_DTYPES:
    x = torch.empty(4, dtype=dtype)
    if R % 2 == 0:
        dist.send(val(R, dtype, 4), nxt)
        dist.recv(x, prv)
    else:
        dist.recv(x, prv)
        dist.send(val(R, dtype, 4), nxt)
    t_equal(x, val(prv, dtype, 4), f"send/recv {dtype}")
x = torch.empty(6)
reqs = [dist.isend(torch.full((6,), float(R)), nxt), dist.irecv(x, prv)]
for q in reqs:
    q.wait()
t_equal(x, torch.full((6,), float(prv)), "isend/irecv")
x = torch.empty(5)
ws = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((5,), R + 0.5), nxt),
                             dist.P2POp(dist.irecv, x, prv)])
for q in ws:
    q.wait()
t_equal(x, torch.full((5,), prv + 0.5), "batch_isend_irecv")

# ---- a Work's future is completed without the caller waiting on it
t = torch.ones(1000)
w = dist.all_reduce(t, async_op=True)
fut = w.get_future()
res = fut.wait()
check(isinstance(res, list) and torch.equal(res[0], torch.full((1000,), float(N))),
      "the future carries the reduced tensor")
chained = dist.all_reduce(torch.ones(3), async_op=True).get_future().then(
    lambda f: f.value()[0] * 2)
t_equal(chained.wait(), torch.full((3,), 2.0 * N), "a future's then() runs")

# ---- the same call repeated keeps its engine name (the cached path)
pg = dist.group.WORLD
for _ in range(40):
    dist.all_reduce(torch.ones(8))
check(pg._counts.get(f"{pg._tag}.allreduce.float32[8].Sum") == 40,
      "40 equal calls share one signature", str(pg._counts))

# ---- mixed with hvd.* on the same ranks
check(thvd.allreduce(torch.ones(2), op=thvd.Sum)[0].item() == N, "hvd.allreduce between dist ops")

finish()
dist.destroy_process_group()
