"""Rank program of tests/test_data_paths.py, run by
test_process_sets_on_a_node_and_across_fake_nodes."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)


def main():
    hvd.init(process_sets="dynamic")
    r, n = hvd.rank(), hvd.size()
    node = hvd.add_process_set([0, 1])        # one fake node's ranks: the shm path
    across = hvd.add_process_set([1, 2])      # straddles the fake nodes: TCP
    for ps, members in ((node, [0, 1]), (across, [1, 2])):
        if r not in members:
            continue
        x = np.arange(50001, dtype=np.float32) + r
        exp = sum(np.arange(50001, dtype=np.float64) + q for q in members)
        check_close(hvd.allreduce(x, op=hvd.Sum, name="s", process_set=ps), exp.astype(np.float32),
                    f"{members} sum",
                    rtol=1e-6, atol=0)
        check_equal(hvd.broadcast(np.full(9, r), root_rank=members[1], name="b", process_set=ps),
                    np.full(9, members[1]), f"{members} broadcast (root is a global rank)")
        check_equal(hvd.allgather(np.full((r, 2), r), name="g", process_set=ps),
                    np.concatenate([np.full((q, 2), q) for q in members]), f"{members} allgather")
    x = np.ones(70001, np.float32)
    check_equal(hvd.allreduce(x, op=hvd.Sum, name="global"), np.full(70001, float(n), np.float32), "global")
    finish()


if __name__ == "__main__":
    main()
