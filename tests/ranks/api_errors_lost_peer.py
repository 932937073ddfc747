"""Rank program of tests/test_api_errors.py, run by
test_lost_peer_raises_horovod_internal_error."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)
from _common import _FAILURES


def main():
    hvd.init()
    R, P = hvd.rank(), hvd.size()
    x = np.ones(4, dtype=np.float32)
    check_equal(hvd.allreduce(x, op=hvd.Sum, name="before"), x * P, "allreduce before the loss")
    if R == P - 1:
        # Wait until the others have their copy of "before" (what happens to an op that a
        # rank crashes in the middle of is not the point here), then vanish: no atexit, no
        # goodbye.
        wait_for(*[f"before-done.{r}" for r in range(P - 1)])
        print("HVDTEST-OK (leaving without shutdown)", flush=True)
        os._exit(0)
    arrive(f"before-done.{R}")
    t0 = time.monotonic()
    e = check_raises(hvd.HorovodInternalError, lambda: hvd.allreduce(x, name="after"),
                     f"rank {P - 1}", "lost", what="allreduce after a peer vanished")
    check(time.monotonic() - t0 < 30, "loss detection", f"took {time.monotonic() - t0:.1f} s")
    check(isinstance(e, RuntimeError), "HorovodInternalError is a RuntimeError")
    check_raises(hvd.HorovodInternalError, lambda: hvd.allreduce(x, name="later"),
                 what="later ops keep failing")
    if _FAILURES:
        sys.stderr.write("\n".join(_FAILURES) + "\n")
        sys.exit(1)
    print("HVDTEST-OK", flush=True)


if __name__ == "__main__":
    main()
