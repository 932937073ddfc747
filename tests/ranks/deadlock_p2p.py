"""Rank program of tests/test_misuse_hangs.py, run by
test_point_to_point_cycles_end_the_job_within_seconds: argv is the case, the deadline
in seconds, and the texts the error must hold. Each case is a cycle through a send or a
recv that no rank can break; each rank records what its op raised and how long it took.
  recv_allreduce  rank 0 waits in recv 'x' from rank 1, rank 1 in allreduce 'y'
  recv_recv       each rank waits in a recv from the other
  send_send       each rank waits in a send above the eager threshold (it waits for
                  its recv, as MPI_Send does) before posting its recv"""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)


def main():
    CASE, DEADLINE, EXPECT = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
    hvd.init()
    R = hvd.rank()
    x = np.ones(3, dtype=np.float32)
    big = np.ones(1 << 20, dtype=np.float32)         # 4 MiB: above the eager threshold

    def cycle():
        if CASE == "recv_allreduce":
            if R == 0:
                hvd.recv(1, name="x")
            else:
                hvd.allreduce(x, name="y")
        elif CASE == "recv_recv":
            hvd.recv(1 - R, name="a" if R == 0 else "b")
        elif CASE == "send_send":
            hvd.send(big, 1 - R, name="a" if R == 0 else "b")
            hvd.recv(1 - R, name="b" if R == 0 else "a")

    check_deadlock_verdict(cycle, DEADLINE, EXPECT)
    finish_alone()


if __name__ == "__main__":
    main()
