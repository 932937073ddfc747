"""Rank program of tests/test_torch_staging.py, run by
test_large_tensor_is_pipelined_in_pieces_and_pool_is_bounded."""
from _torch_common import *  # noqa: F401,F403 (torch, thvd, hvd, np, the check helpers)


def main():
    from horovodlike.torch import _staging
    hvd.init()
    R, P = thvd.rank(), thvd.size()
    x = torch.arange(1 << 20, dtype=torch.float32).reshape(1024, 1024) + R
    for i in range(3):
        y = thvd.allreduce(x, op=thvd.Sum, name="big")
        t_equal(y, torch.arange(1 << 20, dtype=torch.float32).reshape(1024, 1024) * P
                + sum(range(P)), f"staged 4 MiB allreduce {i}")
    st = _staging.stats()
    check(st.get("pieces") == 3 * 64, "64 pieces per op", f"{st}")
    check(st.get("pool_allocs", 0) <= 64 + 4, "pool reused across ops", f"{st}")
    finish()


if __name__ == "__main__":
    main()
