"""Rank program of tests/test_engine_hostile.py (its Job class starts it): one engine
rank, T_RANK of T_SIZE, set up from the T_* variables, beside ranks the test plays."""
import os
import sys
import time
import numpy as np
from horovodlike.common import engine


def main():
    rank, size, d = int(os.environ["T_RANK"]), int(os.environ["T_SIZE"]), os.environ["T_DIR"]
    key = bytes.fromhex(os.environ.get("T_KEY", ""))
    iters, idle = int(os.environ.get("T_ITERS", "3")), float(os.environ.get("T_IDLE", "0"))
    elems = int(os.environ.get("T_ELEMS", "1000"))
    addr = os.environ.get("T_ADDR", "127.0.0.1")     # where this rank listens and is reached
    blob = engine.prepare(os.environ["T_HOST"], addr, addr, key)
    with open(f"{d}/blob.{rank}.tmp", "wb") as f:
        f.write(blob)
    os.rename(f"{d}/blob.{rank}.tmp", f"{d}/blob.{rank}")
    print("blob", blob.hex(), flush=True)
    blobs = []
    for r in range(size):
        while not os.path.exists(f"{d}/blob.{r}"):
            time.sleep(0.01)
        with open(f"{d}/blob.{r}", "rb") as f:
            blobs.append(f.read())
    time.sleep(float(os.environ.get("T_PRESTART_SLEEP", "0")))
    t = time.monotonic()
    try:
        engine.start(rank, size, blobs)
    except Exception as e:
        print("start-failed", type(e).__name__, e, flush=True)
        sys.exit(3)
    print(f"started {time.monotonic() - t:.3f}", flush=True)
    x = np.ones(elems, np.float32)
    flood = int(os.environ.get("T_FLOOD", "0"))
    if flood:
        # Many ops with long names, none waited for: the announcements to rank 0 outgrow
        # every socket buffer, so the engine thread blocks sending them.
        hs = [engine.enqueue(engine.ALLREDUCE, f"{i:06d}" + "n" * 2000, engine.DTYPES["float32"],
                             x.shape, x.ctypes.data, x.ctypes.data) for i in range(flood)]
        print("flooded", flush=True)
        errors = set()
        for h in hs:
            try:
                while not engine.wait(h, 1.0):
                    pass
                engine.release(h)
            except Exception as e:
                errors.add(f"{type(e).__name__} {e}")
        print("flood-ended", sorted(errors), flush=True)
        engine.shutdown()
        print("done", flush=True)
        sys.exit(0)
    try:
        if os.environ.get("T_P2P_RECV"):                # a recv from rank 1 (the test)
            h = engine.enqueue(engine.RECV, os.environ["T_P2P_RECV"], root_rank=1)
            print("waiting-recv", flush=True)
            while not engine.wait(h, 1.0):
                pass
            engine.release(h)
        for i in range(iters):
            h = engine.enqueue(engine.ALLREDUCE, f"x{i % 2}", engine.DTYPES["float32"], x.shape,
                               x.ctypes.data, x.ctypes.data)
            while not engine.wait(h, 1.0):
                pass
            engine.release(h)
            print(f"op {i} {x[0]}", flush=True)
            x[:] = 1
        until = time.monotonic() + idle
        while time.monotonic() < until and engine.is_running():
            time.sleep(0.05)
        h = engine.enqueue(engine.BARRIER, "end")
        while not engine.wait(h, 1.0):
            pass
        engine.release(h)
    except Exception as e:
        print("op-failed", type(e).__name__, e, flush=True)
        sys.exit(0)
    engine.shutdown()
    print("done", flush=True)


if __name__ == "__main__":
    main()
