"""Rank program of tests/test_runner.py, run by test_store_exchange_across_ranks: each rank
sets a 256 KiB value in horovodlikerun's store and reads every rank's back."""
import os
from horovodlike.common.store import StoreClient


def main():
    rank, size = int(os.environ["HOROVOD_RANK"]), int(os.environ["HOROVOD_SIZE"])
    job = os.environ["HOROVODLIKE_JOB_ID"]
    with StoreClient(os.environ["HOROVODLIKE_STORE_ADDR"], timeout=30) as c:
        c.set(f"{job}/r{rank}", f"v{rank}".encode() * (1 << 17))
        got = [c.get(f"{job}/r{r}") for r in range(size)]
        assert all(g == f"v{r}".encode() * (1 << 17) for r, g in enumerate(got))
        c.add(f"{job}/done")
        print("ok", [g[:2].decode() for g in got])


if __name__ == "__main__":
    main()
