"""Rank program of tests/test_p2p.py, run by
test_a_dead_or_stopped_peer_fails_the_waiting_op_naming_it,
test_stall_inspector_names_a_send_the_peer_does_not_read."""
import os
import sys
import time
import numpy as np
import horovodlike as hvd


def struck(pid, deadline):
    """Wait until the test has stopped or killed process pid (its state in /proc)."""
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in "TtZX":
                    return
        except FileNotFoundError:
            return
        time.sleep(0.01)
    raise TimeoutError(f"process {pid} was not struck")


def main():
    hvd.init()
    R = hvd.rank()
    # socket-*: as recv and send, on a pair without a mailbox (the test's environment)
    how = os.environ["T_WAITS_IN"].replace("socket-", "")
    # ring-*: a 128 MiB message through a small ring (4096 pieces), under way when the
    # test strikes: rank 1 sending it (ring-recv) or receiving it (ring-send). cma-*: an
    # 8 MiB message announced through the live mailbox with its address, rank 0 reading
    # it from stopped or killed rank 1 (cma-recv), or waiting for rank 1 to read it
    # (cma-send)
    huge = np.ones(16 << 20) if how.startswith("ring") else np.ones(1 << 20)
    handshake = how in ("mailbox-recv", "cma-recv", "cma-send")
    # one-call-*: rank 0's recv_ of "cached" is a repeated call, so the one that waits
    # for the message never sent is one engine call (hvdl_run), numpy's or torch's
    cached = how.startswith("one-call")
    if cached and how.endswith("torch"):
        import torch
        import horovodlike.torch as api
        buf = torch.zeros(4, dtype=torch.float64)
    else:
        api, buf = hvd, np.zeros(4)
    if R == 1:
        hvd.send(np.array([os.getpid()]), 0, name="first")
        if cached:
            api.send(buf + 1, 0, name="cached")
        if handshake:                   # once rank 0 has answered, "second" is past the switch
            hvd.recv(0, name="ack")
            hvd.send(np.arange(4.0), 0, name="second")
        if how in ("ring-recv", "cma-recv"):
            hvd.send_async(huge, 0, name="huge")
        elif how == "ring-send":
            hvd.recv_async_(huge, 0, name="huge")
        print("ready", flush=True)
        time.sleep(300)                     # the test kills or stops this rank here
    else:
        pid = int(hvd.recv(1, name="first")[0])
        if cached:
            api.recv_(buf, 1, name="cached")
        if handshake:                   # its mailbox answer went out before the ack
            hvd.send(np.arange(2.0), 1, name="ack")
            hvd.recv(1, name="second")
        print("ready", flush=True)
        if how == "cma-recv":
            struck(pid, time.monotonic() + 60)
        t = time.monotonic()
        try:
            if how == "send":                  # more than the socket buffers hold
                hvd.send(np.zeros(64 << 17), 1, name="never")
            elif how in ("ring-recv", "cma-recv"):
                # a stopped sender's memory can still be read: then the next recv fails
                got = np.zeros_like(huge)
                hvd.recv_(got, 1, name="huge")
                assert (got == 1).all()
                print("read huge", flush=True)
                hvd.recv(1, name="never")
            elif how in ("ring-send", "cma-send"):
                hvd.send(huge, 1, name="huge")
            elif cached:
                api.recv_(buf, 1, name="cached")
            else:
                hvd.recv(1, name="never")
            print("no error", flush=True)
        except Exception as e:
            print(f"failed after {time.monotonic() - t:.1f}s: {type(e).__name__}: {e}", flush=True)


if __name__ == "__main__":
    main()
