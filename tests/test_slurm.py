"""horovodlike under a real Slurm: a one-node cluster of Debian's slurmctld, slurmd and
munged (tests/slurm_cluster.py), started once for this module and stopped after it.

  * `srun -n 4 python` of a torch training script: the tasks find each other without
    MPI (rank 0 serves the rendezvous, common/launch_env.py) and train in step;
  * `sbatch` of a job script whose plain `python` is a job of one, and whose `srun`
    trains;
  * `srun` with a rank SIGKILLed, and with one SIGSTOPped, in the middle of training: the
    others name it, and one of them ends the job step (scancel), so srun ends non-zero
    within the peer timeout instead of waiting for the stopped task for ever;
  * `horovodlikerun` inside an allocation takes its hosts and slots from Slurm.

Without Slurm installed, or not as root, the cluster tests skip saying so
(scripts/setup.sh --test installs it as root). The host-list parsing and the detection
of a task of srun are tested without a cluster.
"""
import glob
import os
import re
import socket

import pytest

import slurm_cluster
from harness import rank_program
from hpc_support import HAVE_MPICH, MPICH_LIBMPI, MPICH_PIN, MPICH_SHM, PEER_TIMEOUT, \
    rank_env, remove_mpich_shm, run_watched
from horovodlike.common import launch_env, slurm
from horovodlike.runner.args import slurm_hosts

REASON = slurm_cluster.unavailable()
TRAIN = rank_program("hpc_train")
NODE = socket.gethostname().split(".")[0]
# A job of 4 torch ranks on 2 loaded cores: start-up dominates.
JOB_TIMEOUT = 150


def _first_job_id():
    """Each pytest-xdist worker's cluster numbers its jobs in a block of its own: a job
    step's rendezvous port comes from its job id, and two clusters share this host."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    n = int(worker[2:]) if worker[2:].isdigit() else 0
    return 1 + 40 * (n % 6)


@pytest.fixture(scope="module")
def cluster():
    if REASON is not None:
        pytest.skip(REASON)
    with slurm_cluster.Cluster(cpus=8, first_job_id=_first_job_id()) as c:
        yield c


def _run(cluster, argv, timeout=JOB_TIMEOUT, cwd=None, **extra):
    env = rank_env(cluster.env(), **extra)
    try:
        return run_watched(argv, env, timeout, cwd=cwd, on_timeout=cluster.cancel_all)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{cluster.logs()}") from None


def _ok_ranks(text):
    return sorted(int(m) for m in re.findall(r"HVDTEST-OK rank=(\d+)", text))


# ---------------------------------------------------------------- with a cluster

@pytest.mark.timeout(JOB_TIMEOUT + 30)
def test_srun_of_four_torch_ranks_trains_in_step(cluster):
    res = _run(cluster, ["srun", "-n", "4", "python", str(TRAIN)])
    assert res.returncode == 0, res.describe()
    assert _ok_ranks(res.output) == [0, 1, 2, 3], res.describe()
    for r in range(4):
        assert f"launch=slurm rank={r} size=4 local={r}/4" in res.output, res.describe()


@pytest.mark.timeout(JOB_TIMEOUT + 60)
def test_sbatch_job_script_runs_one_rank_alone_and_trains_with_srun(cluster, tmp_path):
    """The batch script itself has SLURM_PROCID=0 and SLURM_NTASKS=4 but is no task of
    a step: a plain python there is a job of one; its srun starts the four ranks."""
    script = tmp_path / "job.sh"
    out = tmp_path / "job.out"
    script.write_text(
        "#!/bin/bash\n#SBATCH -n 4\n#SBATCH -J hvdtrain\nset -e\n"
        "python -c 'import horovodlike as hvd; hvd.init(); "
        "print(\"alone size\", hvd.size(), flush=True); hvd.shutdown()'\n"
        f"srun python {TRAIN}\n")
    sub = _run(cluster, ["sbatch", "--parsable", "-o", str(out), str(script)], timeout=60,
               cwd=str(tmp_path))
    assert sub.returncode == 0, sub.describe()
    job = sub.output.strip().split(";")[0].splitlines()[-1]
    state, code = cluster.wait_job(job, timeout=JOB_TIMEOUT)
    text = out.read_text(errors="replace") if out.exists() else "(no output file)"
    assert (state, code) == ("COMPLETED", "0:0"), f"job {job}: {state} {code}\n{text}"
    assert "alone size 1" in text, text
    assert _ok_ranks(text) == [0, 1, 2, 3], text


@pytest.mark.timeout(JOB_TIMEOUT + 30)
@pytest.mark.parametrize("how", ["kill", "stop"])
def test_srun_with_a_lost_rank_ends_within_the_peer_timeout_naming_it(cluster, how):
    """Rank 1 SIGKILLs or SIGSTOPs itself mid-training. The others name it within the
    peer timeout and end the step; srun (no --kill-on-bad-exit) ends non-zero soon
    after. Without the step's end a stopped rank would keep srun waiting for ever."""
    # -u: srun relays each line as it comes, so the lines' times are the ranks' own.
    res = _run(cluster, ["srun", "-u", "-n", "3", "python", str(TRAIN), how, "1"])
    assert res.returncode != 0, res.describe()
    lost = res.first(f"rank 1 (host {NODE}) was lost")
    assert lost is not None, res.describe()
    assert "ending the Slurm job step (scancel" in res.output, res.describe()
    midway = res.first("midway 1")
    assert midway is not None, res.describe()
    # Named within the peer timeout (plus a loaded host's slack); ended soon after.
    assert lost - midway < PEER_TIMEOUT + 10, res.describe()
    assert res.elapsed - midway < PEER_TIMEOUT + 20, res.describe()
    assert cluster.wait_idle(30), cluster.jobs()


@pytest.mark.timeout(JOB_TIMEOUT + 60)
def test_horovodlikerun_inside_an_allocation_takes_its_hosts(cluster):
    res = _run(cluster, ["salloc", "-n", "3", "horovodlikerun", "-np", "3", "python",
                         str(TRAIN)])
    assert res.returncode == 0, res.describe()
    assert "hosts from the Slurm allocation of job" in res.output, res.describe()
    assert f"-H {NODE}:3" in res.output, res.describe()
    assert _ok_ranks(res.output) == [0, 1, 2], res.describe()
    assert "launch=horovodlikerun rank=0 size=3" in res.output, res.describe()
    # More ranks than the allocation has: refused, naming what it has.
    res = _run(cluster, ["salloc", "-n", "2", "horovodlikerun", "-np", "3", "python",
                         str(TRAIN)], timeout=60)
    assert res.returncode != 0, res.describe()
    assert "-np 3 needs 3 slots but the hosts only provide 2" in res.output, res.describe()
    assert "launch=" not in res.output, res.describe()


INIT_ONLY = ("import horovodlike as hvd; hvd.init(); "
             "from horovodlike.common import basics; "
             "print('launch', basics._topo.launcher, hvd.rank(), hvd.size(), flush=True)")


@pytest.mark.timeout(120)
@pytest.mark.skipif(not HAVE_MPICH, reason=f"MPICH ({MPICH_PIN}) is not installed; "
                                           f"scripts/setup.sh --test installs it")
def test_srun_mpi_pmi2_with_mpi4py_on_mpich_exchanges_through_mpi(cluster):
    before = set(glob.glob(MPICH_SHM))
    try:
        res = _run(cluster, ["srun", "--mpi=pmi2", "-n", "2", "python", "-c", INIT_ONLY],
                   timeout=90, MPI4PY_LIBMPI=MPICH_LIBMPI)
    finally:
        remove_mpich_shm(before)
    assert res.returncode == 0, res.describe()
    assert sorted(re.findall(r"launch mpi (\d) 2", res.output)) == ["0", "1"], \
        res.describe()


@pytest.mark.timeout(120)
def test_srun_mpi_pmi2_with_mpi4py_on_open_mpi_says_to_drop_it(cluster):
    """Open MPI's wheel speaks no PMI2: every task's MPI is alone. The error says so and
    what to run instead, not only that the MPIs differ."""
    # Open MPI's shared-memory transport off: a singleton that aborts leaves its
    # segment in /dev/shm.
    res = _run(cluster, ["srun", "--mpi=pmi2", "-n", "2", "python", "-c", INIT_ONLY],
               timeout=90, OMPI_MCA_btl="self,tcp")
    assert res.returncode != 0, res.describe()
    assert "srun gave this task PMI variables" in res.output, res.describe()
    assert "Run srun --mpi=none" in res.output, res.describe()


# ---------------------------------------------------------------- without a cluster

def test_host_lists_expand_as_scontrol_show_hostnames_does():
    assert slurm.expand_hostlist("vm") == ["vm"]
    assert slurm.expand_hostlist("node[01-03,07],gpu7") == \
        ["node01", "node02", "node03", "node07", "gpu7"]
    assert slurm.expand_hostlist("r[1-2]n[8-9]") == ["r1n8", "r1n9", "r2n8", "r2n9"]
    assert slurm.expand_counts("2(x3),1") == [2, 2, 2, 1]
    assert slurm.expand_counts("4") == [4]
    for bad in ("node[01-03", "node]1[", "node[3-1]", "node[a-b]", "n[0-99999999]", ""):
        with pytest.raises(ValueError):
            slurm.expand_hostlist(bad)
    for bad in ("2(x)", "x", "2(x0)", "1(x99999999)"):
        with pytest.raises(ValueError):
            slurm.expand_counts(bad)


def _task_env(**over):
    env = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "2", "SLURM_PROCID": "3",
           "SLURM_STEP_NUM_TASKS": "6", "SLURM_NTASKS": "8", "SLURM_LOCALID": "0",
           "SLURM_NODEID": "1", "SLURM_STEP_NODELIST": "n[1-2]",
           "SLURM_STEP_TASKS_PER_NODE": "3(x2)", "HOROVODLIKE_JOB_KEY": "ab" * 32}
    env.update(over)
    return {k: v for k, v in env.items() if v is not None}


def test_a_task_of_srun_rendezvouses_on_the_steps_first_host():
    le = launch_env.detect(_task_env())
    assert (le.launcher, le.rank, le.size, le.local_rank, le.local_size) == \
        ("slurm", 3, 6, 0, 3)
    assert le.rendezvous_host == "n1" and le.job_id == "slurm-77.2"
    assert le.rendezvous_port == launch_env.SLURM_PORT_BASE + (77 * 64 + 2) % \
        launch_env.SLURM_PORT_SPAN
    assert launch_env.detect(_task_env(HOROVODLIKE_RENDEZVOUS_PORT="23456")) \
        .rendezvous_port == 23456
    # A step on one node: every rank is local (the key goes through a file).
    one = launch_env.detect(_task_env(SLURM_STEP_NODELIST="vm", SLURM_NODEID="0",
                                      SLURM_STEP_TASKS_PER_NODE="6", SLURM_LOCALID="3"))
    assert (one.local_rank, one.local_size) == (3, 6)


def test_what_is_not_a_task_of_srun_is_left_alone():
    # A batch script or an salloc shell: SLURM_PROCID and SLURM_NTASKS, no step.
    assert launch_env.detect(_task_env(SLURM_STEP_ID=None, SLURM_STEP_NUM_TASKS=None)) \
        is None
    # srun --mpi=pmi2: MPI does the exchange.
    assert launch_env.detect(_task_env(PMI_SIZE="6", PMI_RANK="3")) is None
    # A step of one task needs no rendezvous.
    assert launch_env.detect(_task_env(SLURM_STEP_NUM_TASKS="1", SLURM_PROCID="0")) is None
    with pytest.raises(ValueError, match="SLURM_PROCID=9"):
        launch_env.detect(_task_env(SLURM_PROCID="9"))


def test_horovodlikerun_reads_an_allocations_hosts_and_slots():
    said = []
    env = {"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "n[1-2],gpu7",
           "SLURM_TASKS_PER_NODE": "2(x2),1"}
    assert slurm_hosts(said.append, env) == "n1:2,n2:2,gpu7:1"
    assert said == ["hosts from the Slurm allocation of job 5 "
                    "(SLURM_JOB_NODELIST=n[1-2],gpu7): -H n1:2,n2:2,gpu7:1"]
    # --ntasks-per-node wins over the tasks Slurm spread.
    assert slurm_hosts(said.append, dict(env, SLURM_NTASKS_PER_NODE="4")) == \
        "n1:4,n2:4,gpu7:4"
    assert slurm_hosts(said.append, {"SLURM_JOB_NODELIST": "n1"}) is None   # no job
    with pytest.raises(ValueError, match="lists 3 host.*tasks for 2"):
        slurm_hosts(said.append, dict(env, SLURM_TASKS_PER_NODE="2(x2)"))
