"""backend="horovodlike" for torch.distributed: start-up under every launcher, every
collective for every dtype on the default group and a new_group, failures, and torch's
own consumers (DDP, FSDP2/HSDP, DTensor, tensor parallelism, pipelining, checkpointing)
against single-process references. Each launch checks many cases (the rank programs
collect failures and report all of them)."""
import subprocess
import sys

import pytest

from harness import REPO, launcher_param, rank_program, run_ranks

torch = pytest.importorskip("torch")

sys.path.insert(0, str(REPO / "tests"))
from test_launch_env import clean_env, free_port_pair  # noqa: E402

COLLECTIVES = rank_program("torchdist_collectives")
FAILURES = rank_program("torchdist_failures")
CONSUMERS = rank_program("torchdist_consumers")
ENV = {"OMP_NUM_THREADS": "1"}


@pytest.mark.parametrize("launcher,np,mode", [
    launcher_param("horovodlikerun", 2, "plain", id="horovodlikerun-np2"),
    launcher_param("horovodlikerun", 4, "hvd-first", id="horovodlikerun-np4-hvd-first"),
    launcher_param("mpirun", 2, "plain", id="mpirun-np2"),
])
def test_collectives_under_launchers(launcher, np, mode):
    run_ranks(COLLECTIVES, np=np, launcher=launcher, args=[mode], env=ENV,
              timeout=300).assert_ok()


@pytest.mark.parametrize("mode", ["plain", "store"])
def test_collectives_under_torchrun(tmp_path, mode):
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
                          "2", "--master_port", str(free_port_pair()), str(COLLECTIVES),
                          mode], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env=clean_env(OMP_NUM_THREADS="1", HVDTEST_DIR=str(tmp_path)),
                         start_new_session=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-6000:]
    assert res.stdout.count("HVDTEST-OK") == 2, res.stdout


def test_mismatched_shapes_are_named_not_hung():
    run_ranks(FAILURES, np=2, args=["mismatch"], env=ENV, timeout=120).assert_ok()


def test_lost_peer_fails_the_waiting_op_naming_it():
    res = run_ranks(FAILURES, np=2, args=["lost"], env=ENV, timeout=120)
    assert "HVDTEST-OK" in "\n".join(res.rank_lines().get(0, [])), res.describe()


def test_wait_timeout_is_honoured_and_the_op_still_completes():
    run_ranks(FAILURES, np=2, args=["timeout"], env=ENV, timeout=120).assert_ok()


def test_destroy_on_one_rank_leaves_other_groups_running():
    run_ranks(FAILURES, np=3, args=["destroy"], env=ENV, timeout=180).assert_ok()


@pytest.mark.parametrize("np,parts", [
    (2, ["ddp", "fsdp", "dtensor", "tp", "pipe", "dcp"]),
    (4, ["ddp", "fsdp", "pipe"]),
])
def test_consumers_match_single_process_reference(np, parts):
    run_ranks(CONSUMERS, np=np, args=parts, env=ENV, timeout=420).assert_ok()
