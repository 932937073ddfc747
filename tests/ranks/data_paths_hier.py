"""Rank program of tests/test_data_paths.py's test_hierarchical_pieces_match_numpy: the
pipelined hierarchical allreduce and the hierarchical reducescatter on fake nodes, at sizes from below one piece to many
pieces (odd sizes, several dtypes), against numpy. The data differs at every position
and on every rank, so a piece reduced, sent or put back in the wrong place shows.
argv[1]: ranks per node. With two nodes, float sums must equal numpy's bit for bit in
the algorithm's order, ((node 0's ranks in order) + (node 1's ranks in order)); with
more nodes the ranks must agree bit for bit and be close to numpy."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)


def node_order_sum(xs, per_node, dt):
    """Each node's ranks summed in rank order in dt, then the node sums (two nodes)."""
    nodes = []
    for lo in range(0, len(xs), per_node):
        acc = xs[lo].copy()
        for x in xs[lo + 1:lo + per_node]:
            acc = (acc + x).astype(dt)
        nodes.append(acc)
    return (nodes[0] + nodes[1]).astype(dt)


def main():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    per_node = int(sys.argv[1])
    nnodes = n // per_node
    # 4096 floats = one piece at HOROVODLIKE_SHM_CHUNK_BYTES=4096 and 2 ranks per node
    sizes = [int(s) for s in os.environ.get("HIER_SIZES", "1,4095,4096,4097,12293,100003").split(",")]
    for size in sizes:
        for dt in (np.float32, np.float64):
            xs = [np.random.default_rng(1000 * size + q).standard_normal(size).astype(dt)
                  for q in range(n)]
            got = hvd.allreduce(xs[r], op=hvd.Sum, name=f"rand.{size}.{np.dtype(dt).name}")
            if nnodes == 2:
                check_equal(got, node_order_sum(xs, per_node, dt),
                            f"random {size} {np.dtype(dt).name}, in the algorithm's order")
            else:
                check_close(got, sum(x.astype(np.float64) for x in xs).astype(dt),
                            f"random {size} {np.dtype(dt).name}", rtol=1e-5, atol=1e-5)
            every = hvd.allgather(got[None, :], name=f"agree.{size}.{np.dtype(dt).name}")
            for q in range(n):
                check_equal(every[q], got, f"rank {q}'s result of random {size} is rank {r}'s")
        # exact integers in every dtype: position- and rank-dependent values
        for dt, mod in ((np.int32, 1 << 20), (np.int64, 1 << 40), (np.float16, 256),
                        (np.uint8, 16), (np.float32, 1 << 20)):
            xs = [((np.arange(size, dtype=np.int64) * (q + 3) + 11 * q) % mod).astype(dt)
                  for q in range(n)]
            exp = sum(x.astype(np.int64) for x in xs)
            got = hvd.allreduce(xs[r], op=hvd.Sum, name=f"int.{size}.{np.dtype(dt).name}")
            check_equal(got, exp.astype(dt), f"sum {size} {np.dtype(dt).name}")
        x = ((np.arange(size, dtype=np.int64) * 7919 + 104729 * r) % 1000003)
        check_equal(hvd.allreduce(x, op=hvd.Max, name=f"max.{size}"),
                    np.max([(np.arange(size, dtype=np.int64) * 7919 + 104729 * q) % 1000003
                            for q in range(n)], axis=0), f"max {size}")
        xs = [np.random.default_rng(7 * size + q).standard_normal(size) for q in range(n)]
        check_close(hvd.allreduce(xs[r], op=hvd.Average, name=f"avg.{size}"),
                    sum(xs) / n, f"average {size}", rtol=1e-12, atol=1e-12)
    # reducescatter across nodes (hierarchical): every rank's rows, odd row counts
    for rows in (0, 1, n - 1, n + 1, 1001, 30011):
        share = [rows // n + (q < rows % n) for q in range(n)]
        lo = sum(share[:r])
        for dt in (np.float64, np.int32, np.float32):
            xs = [((np.arange(rows * 3, dtype=np.int64).reshape(rows, 3) * (q + 2) + q) % 4099)
                  .astype(dt) for q in range(n)]
            exp = sum(x.astype(np.int64) for x in xs).astype(dt)
            check_equal(hvd.reducescatter(xs[r], op=hvd.Sum, name=f"rs.{rows}.{np.dtype(dt).name}"),
                        exp[lo:lo + share[r]], f"reducescatter {rows} {np.dtype(dt).name}")
        x = np.arange(rows * 2, dtype=np.float64).reshape(rows, 2) + r
        exp = sum(np.arange(rows * 2, dtype=np.float64).reshape(rows, 2) + q for q in range(n))
        check_close(hvd.reducescatter(x, op=hvd.Average, name=f"rsavg.{rows}"),
                    exp[lo:lo + share[r]] / n, f"reducescatter average {rows}", rtol=1e-12, atol=0)
        check_close(hvd.reducescatter(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0,
                                      name=f"rsscale.{rows}"),
                    exp[lo:lo + share[r]] * 1.5, f"reducescatter scaled {rows}", rtol=1e-12, atol=0)
    # a fused response (several tensors in one buffer) spanning many pieces
    hs = [hvd.allreduce_async(np.arange(3001 + i, dtype=np.float64) * (r + 1), op=hvd.Sum,
                              name=f"fused.{i}") for i in range(12)]
    for i, h in enumerate(hs):
        check_equal(hvd.synchronize(h), np.arange(3001 + i, dtype=np.float64) * (n * (n + 1) // 2),
                    f"fused {i}")
    finish()


if __name__ == "__main__":
    main()
