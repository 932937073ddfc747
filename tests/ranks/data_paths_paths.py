"""Rank program of tests/test_data_paths.py, run by
test_allreduce_algorithms_across_fake_nodes, test_eight_oversubscribed_ranks,
test_every_path_matches_numpy."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)


def main():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    sizes = [0, 1, n - 1, 3, 1023, 4097, 70001, 300007]
    for size in sizes:
        for dt in (np.float32, np.float64, np.int32, np.float16, np.uint8):
            x = ((np.arange(size) % 7) + r).astype(dt)
            exp = sum(((np.arange(size) % 7) + q).astype(np.float64) for q in range(n))
            got = hvd.allreduce(x, op=hvd.Sum, name=f"sum.{size}.{np.dtype(dt).name}")
            check_close(got, exp.astype(dt), f"sum {size} {np.dtype(dt).name}",
                        rtol=1e-2 if dt == np.float16 else 1e-6, atol=0)
        # Average: the shm path scales each reduced share inside the algorithm
        for dt in (np.float32, np.float64, np.int32):
            x = ((np.arange(size) % 7) + r).astype(dt)
            exp = sum(((np.arange(size) % 7) + q).astype(np.float64) for q in range(n))
            want = np.trunc(exp * (1.0 / n)) if dt == np.int32 else exp / n
            got = hvd.allreduce(x, op=hvd.Average, name=f"avg.{size}.{np.dtype(dt).name}")
            check_close(got, want.astype(dt), f"average {size} {np.dtype(dt).name}", rtol=1e-6, atol=0)
        x = (np.arange(size) * (r + 1)).astype(np.int64)
        check_equal(hvd.allreduce(x, op=hvd.Max, name=f"max.{size}"), np.arange(size) * n, f"max {size}")
        check_equal(hvd.allreduce(x, op=hvd.Min, name=f"min.{size}"), np.arange(size), f"min {size}")
        b = hvd.broadcast(np.full(size, r, np.int16), root_rank=n - 1, name=f"bc.{size}")
        check_equal(b, np.full(size, n - 1, np.int16), f"broadcast {size}")
        g = hvd.allgather(np.full((size // 1000 + r, 3), r, np.float32), name=f"ag.{size}")
        exp = np.concatenate([np.full((size // 1000 + q, 3), q, np.float32) for q in range(n)])
        check_equal(g, exp, f"allgather {size}")
    for rows in (0, 1, n + 1, 30001):
        x = np.arange(rows * 3, dtype=np.float64).reshape(rows, 3) + r
        exp = sum(np.arange(rows * 3, dtype=np.float64).reshape(rows, 3) + q for q in range(n))
        share = [rows // n + (q < rows % n) for q in range(n)]
        lo = sum(share[:r])
        check_equal(hvd.reducescatter(x, op=hvd.Sum, name=f"rs.{rows}"), exp[lo:lo + share[r]],
                    f"reducescatter {rows}")
        check_close(hvd.reducescatter(x, op=hvd.Average, name=f"rsavg.{rows}"),
                    exp[lo:lo + share[r]] / n, f"reducescatter average {rows}", rtol=1e-12, atol=0)
        splits = [((r + j) % 3) * (rows // 3 + 1) for j in range(n)]
        x = np.concatenate([np.full((splits[j], 2), r * 1000 + j, np.int32) for j in range(n)])
        out, got = hvd.alltoall(x, splits=splits, name=f"a2a.{rows}")
        want = [((q + r) % 3) * (rows // 3 + 1) for q in range(n)]
        check_equal(np.asarray(got), np.array(want, np.int32), f"alltoall splits {rows}")
        check_equal(out, np.concatenate([np.full((want[q], 2), q * 1000 + r, np.int32)
                                         for q in range(n)]), f"alltoall {rows}")
    # many tensors fused into one buffer
    hs = [hvd.allreduce_async(np.full(1000 + i, i + r, np.float64), op=hvd.Sum, name=f"f{i}")
          for i in range(40)]
    for i, h in enumerate(hs):
        check_equal(hvd.synchronize(h), np.full(1000 + i, n * i + n * (n - 1) / 2), f"fused {i}")
    hs = [hvd.allreduce_async(np.full(1000 + i, i + r, np.float64), op=hvd.Average, name=f"fa{i}")
          for i in range(40)]
    for i, h in enumerate(hs):
        check_close(hvd.synchronize(h), np.full(1000 + i, i + (n - 1) / 2), f"fused average {i}",
                    rtol=1e-12, atol=0)
    finish()


if __name__ == "__main__":
    main()
