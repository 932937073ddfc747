"""Rank program of tests/test_engine_inject.py: one op (HVDTEST_OP) under an injected
failure, printing the shared-memory segment it maps, OP_OK, NOERROR or the error."""
import os
import sys
import numpy as np
import horovodlike as hvd


def mapped_segments():
    """The engine's shared-memory segments this process maps (unlinked once every local
    rank has attached, so the kernel lists them as deleted)."""
    with open("/proc/self/maps") as f:
        return sorted({line.split(None, 5)[5].strip().removesuffix(" (deleted)")
                       for line in f if "/dev/shm/hvdl-" in line})


def main():
    op = os.environ["HVDTEST_OP"]
    try:
        hvd.init()
        for path in mapped_segments():
            print("SEGMENT", path, flush=True)
        r = hvd.rank()
        if op == "big_allreduce":
            hvd.allreduce(np.ones(1 << 20, np.float32), name="big")
        elif op == "small_allreduce":
            hvd.allreduce(np.ones(16, np.float32), name="small")
        elif op == "fused":
            # The six must reach rank 0's coordinator together, whatever the scheduling: an
            # idle engine announces a request at once, so rank 0 first puts a gate in flight
            # that the others join only once rank 0 says (a file) that its six are queued
            # behind it; they then travel in one frame, after everyone else's, and become
            # ready (and fuse) together.
            import time
            posted = os.path.join(os.environ["HVDTEST_DIR"], "rank0-posted")
            six = lambda: [hvd.allreduce_async(np.ones(1000, np.float32), name=f"f{i}") for i in range(6)]
            gate = lambda: hvd.allreduce_async(np.ones(1, np.float32), name="gate")
            if r == 0:
                hs = [gate()] + six()
                open(posted, "w").close()
            else:
                hs = six()
                while not os.path.exists(posted):
                    time.sleep(0.01)
                hs.append(gate())
            for h in hs:
                hvd.synchronize(h)
        elif op == "allgather":
            hvd.allgather(np.ones((r + 1, 3), np.float32), name="gather")
        elif op == "reducescatter":
            hvd.reducescatter(np.ones((6, 2), np.float32), name="scatter")
        elif op == "repeated":               # cached after the first: agreed in the segment
            for i in range(6):
                hvd.allreduce(np.ones(16, np.float32), name="again")
        elif op == "stalled":                # rank 1 stays away from a cached name: rank 0's
            hvd.allreduce(np.ones(16, np.float32), name="again")    # stall scan takes its word over
            hvd.allreduce(np.ones(16, np.float32), name="elsewhere" if r == 1 else "again")
        elif op == "changed":                # rank 1's request is no longer its cached one: it
            hvd.allreduce(np.ones(16, np.float32), name="again")    # reaches rank 0 as a frame, and
            hvd.allreduce(np.ones(17 if r == 1 else 16, np.float32), name="again")  # rank 0 takes the word
        print("OP_OK", flush=True)
        for i in range(3):                       # whatever was missed above fails here
            hvd.allreduce(np.ones(1 << 18, np.float32), name=f"more{i}")
        print("NOERROR", flush=True)
    except Exception as e:
        print(f"ERR {type(e).__name__}: {e}", flush=True)


if __name__ == "__main__":
    main()
