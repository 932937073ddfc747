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

Under mpirun (2 ranks), SIGSTOP at init, mid-collective and shutdown: mpirun itself
returns non-zero within the peer (or start-up) timeout plus a margin, because a survivor
ends the job (MPI's own waits, in MPI_Init and MPI_Finalize, would wait for ever); a
stopped rank that mpirun resumes blames no healthy rank. SIGSTOP after a rank's clean
shutdown: its own watchdog names it and ends the job, under mpirun as under
horovodlikerun's --shutdown-grace, and a rank that works on after it is left alone.
"""
import re
import signal
import socket

import pytest

from harness import leaked_segments, rank_program, requires_mpirun, run_ranks, segments

HOST = socket.gethostname()
NP = 3
PEER_TIMEOUT = 3
START_TIMEOUT = 6

VICTIM = rank_program("faults_victim")

PHASES = ["init", "negotiation", "shm", "ring", "shutdown"]
ROLES = {"worker": NP - 1, "coordinator": 0}
LOST = re.compile(r"rank (\d+) \(host [^)]*\) was lost")


def _named(text):
    """The ranks `text` says were lost."""
    return {int(m.group(1)) for m in LOST.finditer(text)}


def _cases():
    for phase in PHASES:
        for role in ROLES:
            for sig in ("SIGKILL", "SIGSTOP"):
                yield pytest.param(phase, role, sig, id=f"{phase}-{role}-{sig}")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("phase,role,sig", list(_cases()))
def test_fault_matrix(phase, role, sig):
    victim = ROLES[role]
    before = segments()
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
    named = _named(res.stdout + res.stderr)
    assert named <= {victim}, f"survivors blamed {sorted(named)}, not {victim}\n{text}"
    if sig == "SIGSTOP" and phase not in ("init", "shutdown"):
        # Only the survivors can tell who hangs. Once one of them fails, the launcher
        # ends the others, which may go before they speak; whoever speaks names the
        # victim (and no one else, as checked above).
        lines = res.rank_lines()
        said = ["\n".join(lines.get(r, [])) for r in range(NP) if r != victim]
        assert any("FAILED" in s and f"rank {victim}" in s for s in said), text
    assert res.elapsed < 60, text
    assert not leaked_segments(before), text


# Where the survivors of an mpirun job wait without an end: MPI_Init (a rank stopped
# before init), MPI_Finalize at exit (stopped mid-collective, or before shutdown).
MPI_NP = 2
MPI_BOUND = {"init": START_TIMEOUT + 5 + 12,    # + mpi_end.START_MARGIN + start and load
             "shm": PEER_TIMEOUT + 15, "shutdown": PEER_TIMEOUT + 15}
MPI_ROLES = {"worker": MPI_NP - 1, "coordinator": 0}


def _mpirun_victim(program, victim, timeout=60, **env):
    """`program` on MPI_NP ranks under mpirun, `victim` its FAULT_VICTIM: the result, and
    what the victim and the survivor each said on stderr."""
    env = {"FAULT_VICTIM": victim, "HOROVODLIKE_PEER_TIMEOUT_SECONDS": PEER_TIMEOUT,
           "HOROVODLIKE_START_TIMEOUT": START_TIMEOUT, "HOROVOD_STALL_CHECK_DISABLE": "1",
           **env}
    res = run_ranks(program, np=MPI_NP, launcher="mpirun", env=env, timeout=timeout)
    lines = res.rank_lines("stderr")
    return res, "\n".join(lines.get(victim, [])), "\n".join(lines.get(1 - victim, []))


@requires_mpirun
@pytest.mark.timeout(120)
@pytest.mark.parametrize("phase", list(MPI_BOUND))
@pytest.mark.parametrize("role", ["worker", "coordinator"])
def test_mpirun_stopped_rank_ends_the_job(phase, role):
    victim = MPI_ROLES[role]
    before = segments()
    res, own, said = _mpirun_victim(VICTIM, victim, FAULT_PHASE=phase, FAULT_SIGNAL="SIGSTOP")
    text = res.describe()
    assert res.returncode != 0, text
    assert res.elapsed < MPI_BOUND[phase], text
    if phase == "init":
        assert "start-up under MPI did not finish" in res.stderr, text
    else:
        # The survivor names the victim, then ends the job.
        assert f"rank {victim} (host {HOST}) was lost" in said, text
        assert "ending the MPI job (MPI_Abort)" in said, text
    # The victim, if mpirun lets it speak once resumed, blames no healthy rank.
    assert _named(own) <= {victim}, text
    assert not leaked_segments(before), text


# mpirun resumes a stopped rank (SIGCONT) to end it, after a survivor's MPI_Abort. A
# rank that ignores SIGTERM, as one that checkpoints on it does, then runs on until
# mpirun's SIGKILL: its engine finds its peers gone, and must say that it was itself
# stopped rather than blame the survivor whose connection closed.
@requires_mpirun
@pytest.mark.timeout(120)
@pytest.mark.parametrize("role", ["worker", "coordinator"])
def test_mpirun_resumed_rank_names_itself(role):
    victim = MPI_ROLES[role]
    before = segments()
    res, own, said = _mpirun_victim(VICTIM, victim, FAULT_PHASE="shm", FAULT_SIGNAL="SIGSTOP",
                                    FAULT_IGNORE_TERM="1")
    text = res.describe()
    assert res.returncode != 0, text
    assert f"rank {victim} (host {HOST}) was lost" in said, text
    assert f"rank {victim} (host {HOST}) was lost: it did not run for" in own, text
    assert _named(own) == {victim}, text
    assert res.elapsed < MPI_BOUND["shm"], text
    assert not leaked_segments(before), text


# A rank that stops (or hangs) once the job has shut down: its engine is gone, so no
# peer can name it; horovodlikerun must notice it is quiet and end it (--shutdown-grace).
AFTER_SHUTDOWN = rank_program("faults_after_shutdown")
GRACE = 2


@pytest.mark.timeout(90)
@pytest.mark.parametrize("role", list(ROLES))
def test_launcher_kills_a_rank_stopped_after_its_peers_finished(role):
    victim = ROLES[role]
    before = segments()
    res = run_ranks(AFTER_SHUTDOWN, np=NP, launcher="horovodlikerun", timeout=60,
                    env={"FAULT_VICTIM": victim, "FAULT_MODE": "stop", "FAULT_BUSY": 0},
                    launcher_args=["--shutdown-grace", str(GRACE)])
    text = res.describe()
    assert res.returncode != 0, text
    last = [line for line in res.stderr.splitlines() if line.startswith("horovodlikerun:")]
    assert last and f"rank {victim} (host {HOST}) is stopped" in last[-1], text
    assert "--shutdown-grace" in last[-1], text
    lines = res.rank_lines()
    assert all("FINISHED" in lines.get(r, []) for r in range(NP) if r != victim), text
    assert res.elapsed < GRACE + 25, text
    assert not leaked_segments(before), text


# Under mpirun the others wait for it in MPI_Finalize, which has no limit: its own
# watchdog (mpi_end) names it and ends the job within the peer timeout.
@requires_mpirun
@pytest.mark.timeout(90)
@pytest.mark.parametrize("role", ["worker", "coordinator"])
def test_mpirun_ends_a_job_whose_rank_stopped_after_shutdown(role):
    victim = MPI_ROLES[role]
    before = segments()
    res, own, _ = _mpirun_victim(AFTER_SHUTDOWN, victim, timeout=PEER_TIMEOUT + 40,
                                 FAULT_MODE="stop", FAULT_BUSY=0)
    text = res.describe()
    assert res.returncode != 0, text
    assert (f"rank {victim} (host {HOST}) was stopped for {PEER_TIMEOUT} s "
            f"(HOROVODLIKE_PEER_TIMEOUT_SECONDS) after its engine shut down") in own, text
    assert "FINISHED" in res.rank_lines().get(1 - victim, []), text
    assert res.elapsed < PEER_TIMEOUT + 15, text
    assert not leaked_segments(before), text


# The watchdog behind it, on one process and no MPI: stopped for its time, the process
# is killed and named; idle (asleep, not stopped) for twice as long, it is left alone.
STOP_WATCH = """
import os, signal, sys, time
from horovodlike.common import mpi_end
seconds = float(sys.argv[1])
mpi_end.Watchdog(seconds, "STOP-WATCH: this process was stopped", stopped=True)
if sys.argv[2] == "stop":
    os.kill(os.getpid(), signal.SIGSTOP)
else:
    time.sleep(2 * seconds)   # idle but running: the case the watchdog must leave alone
print("EXITED", flush=True)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["stop", "idle"])
def test_stop_watch_ends_only_a_stopped_process(mode):
    res = run_ranks(STOP_WATCH, launcher="python", args=(1, mode), timeout=30)
    text = res.describe()
    if mode == "stop":
        assert res.returncode == -signal.SIGKILL, text
        assert "STOP-WATCH: this process was stopped" in res.stderr, text
        assert res.elapsed < 1 + 10, text
    else:
        assert res.returncode == 0 and "EXITED" in res.stdout, text
        assert "STOP-WATCH" not in res.stderr, text


@requires_mpirun
@pytest.mark.timeout(90)
def test_mpirun_waits_for_a_busy_rank_after_shutdown():
    # Rank 0 works on, silently, for twice the peer timeout after its shutdown, while
    # rank 1 waits in MPI_Finalize: a rank that runs is never ended.
    res, _, _ = _mpirun_victim(AFTER_SHUTDOWN, 0, FAULT_MODE="busy", FAULT_BUSY=2 * PEER_TIMEOUT)
    assert res.returncode == 0, res.describe()
    assert all("FINISHED" in res.rank_lines().get(r, []) for r in range(MPI_NP)), res.describe()


@pytest.mark.timeout(90)
def test_launcher_waits_for_a_busy_rank_after_its_peers_finished():
    # Rank 0 works on, silently, for twice the grace after the others left: CPU time
    # is activity, so the job still ends well.
    res = run_ranks(AFTER_SHUTDOWN, np=2, launcher="horovodlikerun", timeout=60,
                    env={"FAULT_VICTIM": 0, "FAULT_MODE": "busy", "FAULT_BUSY": 2 * GRACE},
                    launcher_args=["--shutdown-grace", str(GRACE)])
    assert res.returncode == 0, res.describe()
    assert "FINISHED" in res.rank_lines().get(0, []), res.describe()
