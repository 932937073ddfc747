"""Rank program of tests/test_negotiate_shm.py, run by
test_repeated_barriers_are_agreed_in_the_segment."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)


def main():
    hvd.init(process_sets="dynamic")
    r, n = hvd.rank(), hvd.size()
    evens = hvd.add_process_set([q for q in range(n) if q % 2 == 0])
    for i in range(300):
        late = i % 100 == 50                     # from the segment: the first is rank 0's
        if r == 0 and late:
            time.sleep(0.3)
        t = time.monotonic()
        hvd.barrier()
        waited = time.monotonic() - t
        if r != 0 and late and waited < 0.2:
            fail(f"barrier {i}", f"passed after {waited:.3f} s, before rank 0 arrived")
        if r in evens.ranks:
            hvd.barrier(process_set=evens)
        s = hvd.allreduce(np.full(1, float(i)), op=hvd.Sum, name="s")
        check_equal(s, np.full(1, float(i * n)), f"allreduce after barrier {i}")
    finish()


if __name__ == "__main__":
    main()
