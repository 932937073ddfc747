"""Rank program of tests/test_failures.py, run by
test_launcher_names_the_rank_stopped_at_start_up,
test_rank_stopped_at_start_up_is_named_by_every_survivor."""
import os
import signal
import sys
from horovodlike.common import engine


def main():
    victim = int(os.environ["HVDTEST_VICTIM"])
    _start = engine.start

    def start(rank, size, blobs):
        if rank == victim:
            print(f"stopping {rank}", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        return _start(rank, size, blobs)

    engine.start = start
    import horovodlike as hvd
    try:
        hvd.init()
    except Exception as e:
        print(f"init failed on rank {os.environ['HOROVOD_RANK']}: {e}", flush=True)
        sys.exit(3)
    print("init passed", flush=True)


if __name__ == "__main__":
    main()
