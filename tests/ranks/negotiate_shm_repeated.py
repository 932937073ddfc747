"""Rank program of tests/test_negotiate_shm.py, run by
test_repeated_requests_are_agreed_in_the_segment."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)


def main():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    iters = int(os.environ["ITERS"])
    x = np.arange(1000, dtype=np.float32) + r
    exp = sum(np.arange(1000, dtype=np.float32) + q for q in range(n))
    for i in range(iters):                       # more entries than the log's ring holds
        out = hvd.allreduce(x, op=hvd.Sum, name="a")
        if i % 500 == 0:
            check_equal(out, exp, f"sum {i}")
    fused = int(os.environ.get("FUSED", "40"))
    for it in range(4):                          # fused: FUSED tensors announced together
        hs = [hvd.allreduce_async(np.full(33, float(r + k), np.float32), op=hvd.Average, name=f"g{k}")
              for k in range(fused)]
        for k, h in enumerate(hs):
            check_close(hvd.synchronize(h), np.full(33, (n - 1) / 2 + k, np.float32), f"avg {it}.{k}",
                        rtol=1e-6, atol=1e-6)
        rows = hvd.allgather(np.full((r + 1, 2), r, np.int64), name="ag")
        check_equal(rows, np.concatenate([np.full((q + 1, 2), q, np.int64) for q in range(n)]), f"ag {it}")
        check_equal(hvd.broadcast(np.full(5, r), root_rank=n - 1, name="b"), np.full(5, n - 1), f"bc {it}")
    big = hvd.allreduce(np.full(1 << 18, float(r), np.float32), op=hvd.Sum, name="big")   # two-shot
    check_equal(big, np.full(1 << 18, float(sum(range(n))), np.float32), "big")
    finish()


if __name__ == "__main__":
    main()
