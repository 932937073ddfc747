"""Rank program of tests/test_negotiate_shm.py, run by
test_more_entries_at_once_than_the_log_holds."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)


def main():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    N = 4500                  # ids past 4096 go through rank 0, one response each
    def enqueue():
        return [hvd.allreduce_async(np.full(3, r + k, np.float32 if k % 2 else np.float64),
                                    op=hvd.Sum, name=f"t{k}") for k in range(N)]
    def check_all(hs, tag):
        for k, h in enumerate(hs):
            out = hvd.synchronize(h)
            if out[0] != sum(q + k for q in range(n)):
                fail(f"{tag} t{k}", str(out))
    check_all(enqueue(), "first")      # through rank 0: every name gets its cache id
    # Rank 1 posts everything first. Rank 0 holds a gate in flight (rank 1 joins it
    # only once rank 0 has enqueued all N), so its loop is never idle and announces all
    # N in one cycle: it completes 4095 ids at once and then plans 404 responses, more
    # entries than the log holds.
    if r == 1:
        hs = enqueue()
        arrive("rank1-enqueued")
        wait_for("rank0-enqueued")
        gate = hvd.allreduce_async(np.ones(1), op=hvd.Sum, name="gate")
    else:
        wait_for("rank1-enqueued")
        gate = hvd.allreduce_async(np.ones(1), op=hvd.Sum, name="gate")
        hs = enqueue()
        arrive("rank0-enqueued")
    check_all(hs, "second")
    check_equal(hvd.synchronize(gate), np.full(1, float(n)), "gate")
    finish()


if __name__ == "__main__":
    main()
