"""Runs another torch rank program (argv[1], the rest of argv its own) and, just before
its finish(), checks that its ops really went through the staging pipeline, in pieces:
at least argv[2] staged ops; with argv[3] == "1" (allreduce and broadcast, which are cut
into pieces of rows) also several pieces per op and fused groups."""
from _torch_common import *  # noqa: F401,F403 (torch, thvd, hvd, np, the check helpers)
import runpy


def check_staged(min_ops, pieces):
    from horovodlike.torch import _staging
    st = _staging.stats()
    check(st.get("ops", 0) >= min_ops, "staged ops", f"{st}")
    check(st.get("pool_reuses", 0) > 0, "pool buffers are reused", f"{st}")
    if pieces:
        check(st.get("pieces", 0) > st.get("ops", 0), "several pieces per op", f"{st}")
        check(st.get("fused_groups", 0) > 0, "grouped ops fused", f"{st}")


def main():
    program, min_ops, pieces = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
    before_finish(lambda: check_staged(min_ops, pieces))
    sys.argv = [program, *sys.argv[4:]]
    runpy.run_path(program, run_name="__main__")


if __name__ == "__main__":
    main()
