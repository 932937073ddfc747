"""The fault matrix: kill or stop each role at each phase of a job and check how it ends.

Roles: a worker (the last rank) and rank 0, the coordinator. Phases: init (before the
address exchange), negotiation (the victim never submits an op the others wait on), a
shared-memory collective, a TCP ring across fake nodes, and shutdown. Faults: SIGKILL (a
crash) and SIGSTOP (a hang: the process is alive, holds its sockets, and says nothing).

For every case, under horovodlikerun at 3 ranks:
  * the launcher exits non-zero within the time limit and its last word names the victim;
  * no survivor names any other rank as lost (one culprit for the whole job);
  * when the victim hangs mid-job, a survivor fails and says which rank it was;
  * nothing is left running and no /dev/shm segment is left behind.
"""
import glob
import re
import signal
import socket
import textwrap

import pytest

from harness import run_ranks

HOST = socket.gethostname()
NP = 3
PEER_TIMEOUT = 3
START_TIMEOUT = 6

VICTIM = textwrap.dedent("""
    import os, signal, sys, threading, time
    import numpy as np
    import horovodlike as hvd

    phase, victim = os.environ["FAULT_PHASE"], int(os.environ["FAULT_VICTIM"])
    sig = getattr(signal, os.environ["FAULT_SIGNAL"])
    me = int(os.environ["HOROVOD_RANK"])

    def hit():
        print("VICTIM-HIT", flush=True)
        os.kill(os.getpid(), sig)

    if phase == "init" and me == victim:
        hit()
    hvd.init()
    try:
        if phase == "negotiation":
            hvd.allreduce(np.ones(4), name="warm")
            if me == victim:
                hit()
            hvd.allreduce(np.ones(4), name="never-agreed")
        elif phase in ("shm", "ring"):
            x = np.ones(1 << 22, np.float32)
            hvd.allreduce(x, name="warm")
            if me == victim:
                threading.Timer(0.3, hit).start()
            for i in range(100000):
                hvd.allreduce(x, name="big")
        elif phase == "shutdown":
            hvd.allreduce(np.ones(4), name="warm")
            if me == victim:
                hit()
            hvd.shutdown()
        print("FINISHED", flush=True)
    except hvd.HorovodInternalError as e:
        print(f"FAILED: {e}", flush=True)
        sys.exit(3)
""")

PHASES = ["init", "negotiation", "shm", "ring", "shutdown"]
ROLES = {"worker": NP - 1, "coordinator": 0}
LOST = re.compile(r"rank (\d+) \(host [^)]*\) was lost")


def _cases():
    for phase in PHASES:
        for role in ROLES:
            for sig in ("SIGKILL", "SIGSTOP"):
                yield pytest.param(phase, role, sig, id=f"{phase}-{role}-{sig}")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("phase,role,sig", list(_cases()))
def test_fault_matrix(phase, role, sig):
    victim = ROLES[role]
    before = set(glob.glob("/dev/shm/hvdl-*"))
    launcher_args = []
    env = {"FAULT_PHASE": phase, "FAULT_VICTIM": victim, "FAULT_SIGNAL": sig,
           "HOROVODLIKE_PEER_TIMEOUT_SECONDS": PEER_TIMEOUT,
           "HOROVODLIKE_START_TIMEOUT": START_TIMEOUT,
           "HOROVOD_STALL_CHECK_DISABLE": "1"}
    if phase == "ring":
        env["HOROVODLIKE_SHM"] = "0"
        launcher_args = ["-H", "a:1,b:1,c:1", "--ssh-command", "sh -c {command}",
                         "--start-timeout", str(START_TIMEOUT)]
    else:
        launcher_args = ["--start-timeout", str(START_TIMEOUT)]
    res = run_ranks(VICTIM, np=NP, launcher="horovodlikerun", env=env, timeout=60,
                    launcher_args=launcher_args)
    text = res.describe()
    host = {"ring": "abc"[victim]}.get(phase, HOST)

    assert res.returncode != 0, text
    last = [line for line in res.stderr.splitlines() if line.startswith("horovodlikerun:")]
    assert last, text
    assert f"rank {victim} (host {host})" in last[-1], text
    named = {int(m.group(1)) for m in LOST.finditer(res.stdout + res.stderr)}
    assert named <= {victim}, f"survivors blamed {sorted(named)}, not {victim}\n{text}"
    if sig == "SIGSTOP" and phase not in ("init", "shutdown"):
        # Only the survivors can tell who hangs. Once one of them fails, the launcher
        # ends the others, which may go before they speak; whoever speaks names the
        # victim (and no one else, as checked above).
        lines = res.rank_lines()
        said = ["\n".join(lines.get(r, [])) for r in range(NP) if r != victim]
        assert any("FAILED" in s and f"rank {victim}" in s for s in said), text
    assert res.elapsed < 60, text
    assert set(glob.glob("/dev/shm/hvdl-*")) <= before, text
