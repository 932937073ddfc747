"""Rank program of tests/test_misuse_messages.py, run by
test_start_timeout_names_the_flag_and_calls_a_late_rank_late."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)


def main():
    if os.environ["HOROVOD_RANK"] == "1":
        time.sleep(30)           # a rank far slower to start than --start-timeout allows
    try:
        hvd.init()
        fail("init with a late rank", "returned")
    except RuntimeError as e:
        for needle in ("rank 1 is late: it did not reach hvd.init() within 3 s",
                       "horovodlikerun --start-timeout"):
            check(needle in str(e), "the start timeout message", f"{str(e)!r} lacks {needle!r}")
        check("was lost" not in str(e), "a late rank is not called lost", str(e))
        print(f"RuntimeError: {e}", file=sys.stderr, flush=True)   # as an uncaught one would
        finish_alone()
        sys.exit(1)              # the job failed: the launcher says why


if __name__ == "__main__":
    main()
