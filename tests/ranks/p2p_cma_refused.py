"""Rank program of tests/test_p2p.py, run by test_a_refused_read_falls_back_to_the_ring:
the kernel refuses the receiver's process_vm_readv of the sender (both ranks without
CAP_SYS_PTRACE, so that the ptrace rules apply to them as to any user's processes, and
the sender made not dumpable once the receiver has attached its ring and mailbox), so
the large message goes through the ring."""
import ctypes
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, finish)

LIBC = ctypes.CDLL(None, use_errno=True)
CAP_SYS_PTRACE, PR_SET_DUMPABLE = 19, 4


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def drop_ptrace_capability():
    """This thread, and the threads it starts later (the engine's), lose CAP_SYS_PTRACE."""
    h, d = _CapHeader(0x20080522, 0), (_CapData * 2)()
    assert LIBC.capget(ctypes.byref(h), d) == 0, os.strerror(ctypes.get_errno())
    d[0].effective &= ~(1 << CAP_SYS_PTRACE)
    d[0].permitted &= ~(1 << CAP_SYS_PTRACE)
    assert LIBC.capset(ctypes.byref(h), d) == 0, os.strerror(ctypes.get_errno())


def main():
    drop_ptrace_capability()
    hvd.init()
    R = hvd.rank()
    big = np.arange(1 << 17, dtype=np.float64)          # 1 MiB: rendezvous
    if R == 0:
        # the ring and both mailboxes are set up (and attached) while this is dumpable
        hvd.send(big, 1, name="first")
        hvd.recv(1, name="ack")
        hvd.send(np.arange(4.0), 1, name="second")       # past the switch to the mailbox
        assert LIBC.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
        hvd.send(big + 1, 1, name="refused")
        hvd.send(big + 2, 1, name="refused")             # CMA is off for this peer now
    else:
        assert (hvd.recv(0, name="first") == big).all()
        hvd.send(np.arange(2.0), 0, name="ack")
        hvd.recv(0, name="second")
        got = np.zeros_like(big)
        for k in (1, 2):
            hvd.recv_(got, 0, name="refused")
            assert (got == big + k).all(), k
    finish()


if __name__ == "__main__":
    main()
