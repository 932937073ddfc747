"""hvd.init() under the variables torchrun, Kubeflow, Ray Train, Spark and Horovod's own
workers set: detection, the rank-0 store, and real launches (torchrun included)."""
import hashlib
import importlib.util
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness import rank_program  # noqa: E402
from horovodlike.common import jobkey, launch_contract, launch_env  # noqa: E402

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(300)

HAVE_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")

TORCHRUN_ENV = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "node0",
                "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "job7",
                "TORCHELASTIC_RESTART_COUNT": "0"}


def test_contract_reads_its_timeouts_once_and_says_what_is_wrong():
    c = launch_contract
    assert c.start_timeout({}) == c.DEFAULT_START_TIMEOUT
    assert c.start_timeout({c.START_TIMEOUT: "7.5"}) == 7.5
    assert c.elastic_timeout({c.ELASTIC_TIMEOUT: ""}) == c.DEFAULT_ELASTIC_TIMEOUT
    with pytest.raises(ValueError, match="HOROVODLIKE_START_TIMEOUT='soon' is not a number"):
        c.start_timeout({c.START_TIMEOUT: "soon"})
    with pytest.raises(ValueError, match="HOROVOD_ELASTIC_TIMEOUT='-1' must be >= 0"):
        c.elastic_timeout({c.ELASTIC_TIMEOUT: "-1"})
    # The keys the elastic driver and its workers (and bootstrap) both use.
    assert c.blob_key("j", 3) == "j/init0/blob/3"
    assert c.blob_key("j", 3, elastic_round=2) == "j/elastic2/blob/3"
    keys = c.ElasticKeys("j")
    assert (keys.ready(4), keys.assignment(2, 7), keys.update(1), keys.current) == \
        ("j/elastic/ready/4", "j/elastic/r2/w7", "j/elastic/update/1", "j/elastic/current")

def test_torchrun_variables():
    le = launch_env.detect(dict(TORCHRUN_ENV))
    assert le == launch_env.LaunchEnv("torchrun", 3, 4, 1, 2, 1, 2, "node0", 29501,
                                      "torchrun-job7-0-node0-29500")
    assert le.rendezvous == "node0:29501"


def test_kubeflow_and_ray_train_style_variables():
    # Kubeflow's PyTorchJob without torchrun, Ray Train's TorchTrainer: no GROUP_*.
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "job-master-0",
           "MASTER_PORT": "23456", "NODE_RANK": "0"}
    le = launch_env.detect(env)
    assert (le.launcher, le.rank, le.size, le.local_rank, le.cross_rank) == \
        ("torchrun", 0, 2, None, 0)
    assert le.rendezvous == "job-master-0:23457"
    env["HOROVODLIKE_RENDEZVOUS_PORT"] = "40000"
    assert launch_env.detect(env).rendezvous == "job-master-0:40000"


def test_horovod_worker_variables():
    env = {"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "1",
           "HOROVOD_LOCAL_SIZE": "2", "HOROVOD_CROSS_RANK": "0", "HOROVOD_CROSS_SIZE": "1",
           "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.1", "HOROVOD_GLOO_RENDEZVOUS_PORT": "5555"}
    le = launch_env.detect(env)
    assert (le.launcher, le.rank, le.size, le.local_rank, le.local_size) == \
        ("horovod-env", 1, 2, 1, 2)
    assert le.rendezvous == "10.0.0.1:5555"       # exactly there: nothing else listens
    del env["HOROVOD_GLOO_RENDEZVOUS_ADDR"]
    assert launch_env.detect(env) is None          # nowhere to meet: not guessed
    env.update(MASTER_ADDR="m", MASTER_PORT="100")
    assert launch_env.detect(env).rendezvous == "m:101"


@pytest.mark.parametrize("extra", [{"HOROVODLIKE_STORE_ADDR": "127.0.0.1:1"},
                                   {"OMPI_COMM_WORLD_SIZE": "4"}, {"PMI_SIZE": "4"}])
def test_our_launcher_and_mpi_take_precedence(extra):
    kubeflow = {k: v for k, v in TORCHRUN_ENV.items() if not k.startswith("TORCHELASTIC")}
    assert launch_env.detect({**kubeflow, **extra}) is None
    if "HOROVODLIKE_STORE_ADDR" in extra:
        assert launch_env.detect({**TORCHRUN_ENV, **extra}) is None
    else:   # torchrun under srun/mpirun: its ranks inherit the node task's PMI variables
        assert launch_env.detect({**TORCHRUN_ENV, **extra}).rank == 3


def test_nothing_set_is_not_a_launch_environment():
    assert launch_env.detect({"PATH": "/bin", "RANK": "0"}) is None
    assert launch_env.detect({"RANK": "0", "WORLD_SIZE": "1"}) is None     # one rank
    assert launch_env.detect({}) is None


@pytest.mark.parametrize("env, complaint", [
    ({"RANK": "0", "WORLD_SIZE": "2"}, "MASTER_ADDR/MASTER_PORT"),
    ({**TORCHRUN_ENV, "RANK": "4"}, "rank 4 of world size 4"),
    ({**TORCHRUN_ENV, "LOCAL_RANK": "2"}, "local rank 2 of 2"),
    ({**TORCHRUN_ENV, "MASTER_PORT": "http"}, "MASTER_PORT='http'"),
    ({**TORCHRUN_ENV, "MASTER_PORT": "65535"}, "not a TCP port"),
    ({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "h"},
     "HOROVOD_GLOO_RENDEZVOUS_PORT is not set"),
])
def test_inconsistent_environments_are_refused(env, complaint):
    with pytest.raises(ValueError, match=re.escape(complaint)):
        launch_env.detect(env)


def test_adopt_on_a_non_zero_rank_sets_our_variables_only():
    env = dict(TORCHRUN_ENV)
    with pytest.raises(RuntimeError, match="span hosts"):      # two hosts, no key
        launch_env.adopt(env)
    assert env == TORCHRUN_ENV                                 # nothing was changed
    env[jobkey.ENV] = jobkey.generate().hex()
    le = launch_env.adopt(env)
    assert le.rank == 3 and launch_env._server is None      # rank 0 serves, not us
    assert env["HOROVODLIKE_STORE_ADDR"] == "node0:29501"
    assert (env["HOROVOD_RANK"], env["HOROVOD_SIZE"], env["HOROVOD_LOCAL_RANK"],
            env["HOROVOD_LOCAL_SIZE"], env["HOROVOD_CROSS_RANK"],
            env["HOROVOD_CROSS_SIZE"]) == ("3", "4", "1", "2", "1", "2")
    assert env["HOROVODLIKE_JOB_ID"].startswith("torchrun-job7-")
    assert len(jobkey.from_hex(env[jobkey.ENV])) == jobkey.KEY_BYTES
    assert launch_env.adopt(env) is None                    # idempotent
    assert launch_env.adopt({"PATH": "/bin"}) is None


def test_bind_address_follows_the_master_address():
    assert launch_env.bind_address("localhost") == "127.0.0.1"
    assert launch_env.bind_address("127.0.0.1") == "127.0.0.1"
    assert launch_env.bind_address("no-such-host.invalid") == "0.0.0.0"


def test_rank_zero_reports_a_taken_port(monkeypatch):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        le = launch_env.LaunchEnv("torchrun", 0, 2, 0, 2, 0, 1, "127.0.0.1", port, "j")
        monkeypatch.setattr(launch_env, "_server", None)
        with pytest.raises(RuntimeError, match=f"127.0.0.1:{port}.*HOROVODLIKE_RENDEZVOUS_PORT"):
            launch_env.serve_rendezvous(le, jobkey.generate())


def _private(path):
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def _squat(tmp_path, how):
    """What another local user can do to a fixed name in a shared directory: create it
    first (mode 0777, owned by someone else when the tests run as root), or make it a
    symlink to a directory of theirs."""
    shared = tmp_path / "shared-tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    fixed = shared / f"horovodlike-{os.getuid()}"
    if how == "directory":
        fixed.mkdir()
        fixed.chmod(0o777)
        target = fixed
    else:
        target = shared / "theirs"
        target.mkdir()
        fixed.symlink_to(target)
    if os.getuid() == 0:
        os.chown(target, 65534, 65534)
    return shared


def test_job_key_given_from_a_file_or_shared_in_a_private_directory(tmp_path):
    given = jobkey.generate()
    le0 = launch_env.LaunchEnv("torchrun", 0, 2, 0, 2, 0, 1, "127.0.0.1", 29501, "job-a")
    le1 = launch_env.LaunchEnv("torchrun", 1, 2, 1, 2, 0, 1, "127.0.0.1", 29501, "job-a")
    assert launch_env.job_key(le1, {jobkey.ENV: given.hex()}) == given
    # A key file on shared storage: only a private one is read.
    key_file = tmp_path / "job.key"
    key_file.write_text(given.hex() + "\n")
    key_file.chmod(0o600)
    assert launch_env.job_key(le1, {launch_contract.JOB_KEY_FILE: str(key_file)}) == given
    key_file.chmod(0o640)
    with pytest.raises(RuntimeError, match="not private to this user"):
        launch_env.job_key(le1, {launch_contract.JOB_KEY_FILE: str(key_file)})
    # One host: rank 0 leaves a private file for its siblings (same parent process) in
    # the user's runtime directory ...
    env = {"XDG_RUNTIME_DIR": str(_private(tmp_path / "run-user"))}
    key = launch_env.job_key(le0, env)
    path = Path(launch_env.key_path(le0, env))
    assert path.parent == tmp_path / "run-user" / "horovodlike"
    assert path.parent.stat().st_mode & 0o777 == 0o700
    assert path.stat().st_mode & 0o777 == 0o600
    assert launch_env.job_key(le1, env) == key and len(key) == jobkey.KEY_BYTES
    path.chmod(0o644)
    with pytest.raises(RuntimeError, match="not private"):
        launch_env.job_key(le1, env)
    launch_env.key_delivered()                # every rank has it: the file goes
    assert not path.exists()
    with pytest.raises(RuntimeError, match="did not leave the job's key.*different parents"):
        launch_env.job_key(le1, {**env, "HOROVODLIKE_START_TIMEOUT": "0.2"})
    # ... or in torchrun's own fresh run directory, learnt from the rank's environment.
    attempt = _private(tmp_path / "torchelastic_x" / "none_y") / "attempt_0"
    (attempt / "1").mkdir(parents=True)
    env = {"TORCHELASTIC_ERROR_FILE": str(attempt / "1" / "error.json")}
    key = launch_env.job_key(le0, env)
    assert Path(launch_env.key_path(le0, env)).parent == attempt
    assert launch_env.job_key(le1, env) == key
    launch_env.key_delivered()
    # Neither: an error saying what to do, not a fixed name in a shared directory.
    with pytest.raises(RuntimeError, match="no private place.*XDG_RUNTIME_DIR is not set"):
        launch_env.job_key(le0, {})


@pytest.mark.parametrize("how", ["directory", "symlink"])
def test_a_squatted_shared_name_does_not_stop_a_job(tmp_path, monkeypatch, how):
    """The old fixed place, $TMPDIR/horovodlike-<uid>, taken by another user: the job
    neither uses nor needs it."""
    monkeypatch.setenv("TMPDIR", str(_squat(tmp_path, how)))
    monkeypatch.setattr(tempfile, "tempdir", None)      # gettempdir() reads TMPDIR again
    le0 = launch_env.LaunchEnv("torchrun", 0, 2, 0, 2, 0, 1, "127.0.0.1", 29501, "job-s")
    le1 = launch_env.LaunchEnv("torchrun", 1, 2, 1, 2, 0, 1, "127.0.0.1", 29501, "job-s")
    env = {"XDG_RUNTIME_DIR": str(_private(tmp_path / "run-user"))}
    key = launch_env.job_key(le0, env)
    assert launch_env.job_key(le1, env) == key
    launch_env.key_delivered()
    # Our own directory is never followed through a symlink, even one of the user's.
    os.rmdir(tmp_path / "run-user" / "horovodlike")
    (tmp_path / "run-user" / "horovodlike").symlink_to(tmp_path / "shared-tmp")
    with pytest.raises(RuntimeError, match="not a symlink"):
        launch_env.job_key(le0, env)


def test_several_hosts_without_a_key_refuse_to_start(caplog):
    hosts0 = launch_env.LaunchEnv("torchrun", 0, 4, 0, 2, 0, 2, "10.0.0.1", 29501, "job-b")
    hosts3 = launch_env.LaunchEnv("torchrun", 3, 4, 1, 2, 1, 2, "10.0.0.1", 29501, "job-b")
    # Horovod's worker variables without a local size: nothing says one host either.
    bare = launch_env.LaunchEnv("horovod-env", 0, 2, None, None, None, None, "10.0.0.1",
                                5555, "horovod-env-10.0.0.1-5555")
    for le in (hosts0, hosts3, bare):
        with pytest.raises(RuntimeError, match=f"span hosts.*{jobkey.ENV}.*"
                                               f"{launch_contract.JOB_KEY_FILE}.*"
                                               f"{launch_contract.INSECURE_RENDEZVOUS}=1"):
            launch_env.job_key(le, {})
    # Only the loudly named opt-in runs it, with a key anyone could compute.
    insecure = {launch_contract.INSECURE_RENDEZVOUS: "1"}
    assert launch_env.job_key(hosts0, insecure) == launch_env.job_key(hosts3, insecure)
    assert any("NOT authenticated" in r.getMessage() and r.levelname == "WARNING"
               and r.name.startswith("horovodlike") for r in caplog.records)
    with pytest.raises(RuntimeError, match="span hosts"):
        launch_env.job_key(hosts0, {launch_contract.INSECURE_RENDEZVOUS: "yes"})


# ------------------------------------------------------------------ real launches

TWO_RANKS = rank_program("launch_env_two_ranks")
INIT = rank_program("init_only")


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HOROVOD", "OMPI_", "PMI", "SLURM_", "MASTER_", "RANK",
                                "WORLD_SIZE", "LOCAL_", "GROUP_", "TORCHELASTIC"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_pair():
    """A MASTER_PORT whose next port (rank 0's rendezvous store) is free too. Drawn below
    Linux's ephemeral range (32768 and up), so that no other test's outgoing connection
    can take either port between this check and the launch."""
    import random
    for _ in range(200):
        port = random.randrange(28000, 32700)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no two consecutive free ports")


def run_processes(envs, script, timeout=120):
    procs = [subprocess.Popen([sys.executable, str(script)], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              start_new_session=True) for env in envs]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            outs.append((p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outs


def check_two_ranks(stdout_by_rank):
    for rank, out in enumerate(stdout_by_rank):
        assert f"RANK {rank} of 2 local {rank}/2 sum 3.0 gather [0, 1]" in out, out
        assert f"AGAIN {rank} 2.0" in out, out


@pytest.mark.parametrize("style, key", [("torch", "key"), ("horovod", "key"),
                                        ("torch", "key-file"), ("horovod", "insecure")])
def test_processes_started_with_scheduler_variables(style, key, tmp_path):
    """Two plain processes carrying only what Kubeflow / Ray Train (torch style) or
    Horovod's Gloo workers (horovod style) set, and the job's key in one of the ways a
    multi-host job can be given one (or the opt-in to run without)."""
    port = free_port()
    secret = {"key": {jobkey.ENV: jobkey.generate().hex()},
              "insecure": {launch_contract.INSECURE_RENDEZVOUS: "1"}}.get(key)
    if key == "key-file":
        path = tmp_path / "job.key"
        path.write_text(jobkey.generate().hex() + "\n")
        path.chmod(0o600)
        secret = {launch_contract.JOB_KEY_FILE: str(path)}
    envs = []
    for rank in range(2):
        if style == "torch":
            extra = {"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                     "MASTER_PORT": str(port - 1)}
        else:
            extra = {"HOROVOD_RANK": str(rank), "HOROVOD_SIZE": "2",
                     "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
                     "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port)}
        envs.append(clean_env(**extra, **secret))
    outs = run_processes(envs, TWO_RANKS)
    for code, out, err in outs:
        assert code == 0, err
    check_two_ranks([out for _, out, _ in outs])
    assert ("NOT authenticated" in outs[0][2]) == (key == "insecure")


@pytest.mark.parametrize("how", ["directory", "symlink"])
def test_one_host_job_starts_beside_a_squatted_shared_name(tmp_path, how):
    """Two ranks of one host (one parent: this test) with no key given share one through
    the user's runtime directory, while another user holds the old fixed name."""
    port = free_port()
    shared = _squat(tmp_path, how)
    envs = [clean_env(RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port - 1), TMPDIR=str(shared),
                      XDG_RUNTIME_DIR=str(_private(tmp_path / "run-user")))
            for r in range(2)]
    outs = run_processes(envs, TWO_RANKS)
    for code, out, err in outs:
        assert code == 0, err
    check_two_ranks([out for _, out, _ in outs])
    assert list((tmp_path / "run-user" / "horovodlike").iterdir()) == []   # key file gone


def test_one_host_ranks_of_different_parents_are_told_why_they_cannot_meet(tmp_path):
    """Rank 0 started by this test, rank 1 by another parent: rank 1 cannot find the key
    rank 0 left for its own siblings, and says so rather than only timing out."""
    port = free_port()
    run_user = str(_private(tmp_path / "run-user"))
    envs = [clean_env(RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port - 1),
                      XDG_RUNTIME_DIR=run_user, HOROVODLIKE_START_TIMEOUT="3" if r else "60")
            for r in range(2)]                # rank 0 keeps its key file while rank 1 looks
    rank0 = subprocess.Popen([sys.executable, str(INIT)], env=envs[0],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 60     # rank 0 has left its key: start rank 1
        while not list((tmp_path / "run-user").glob("horovodlike/*.key")):
            assert time.monotonic() < deadline and rank0.poll() is None, rank0.stderr.read()
            time.sleep(0.05)
        rank1 = subprocess.run([sys.executable, str(INIT), "from-another-parent"],
                               env=envs[1], text=True, capture_output=True, timeout=60)
        assert rank1.returncode != 0
        assert "different parents" in rank1.stderr and "key file(s) of this job id" in \
            rank1.stderr and jobkey.ENV in rank1.stderr, rank1.stderr
    finally:
        rank0.kill()
        rank0.communicate()


OUTSIDER_TIMEOUT = 20


def test_an_outsider_who_knows_the_job_description_cannot_join():
    """Rank 0 of a two-host torchrun-style job with no key. An outsider knows everything
    public about the job (torchrun's default run id, MASTER_ADDR, MASTER_PORT), so it can
    compute any key derived from them; it must still not get into the rendezvous."""
    from horovodlike.common.store import StoreAuthError, StoreClient
    port = free_port_pair()
    rank0 = subprocess.Popen(
        [sys.executable, str(INIT)], text=True,
        env=clean_env(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                      GROUP_RANK="0", GROUP_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), HOROVODLIKE_START_TIMEOUT=str(OUTSIDER_TIMEOUT)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    public = f"torchrun-none-0-127.0.0.1-{port}"
    guessed = hashlib.sha256(f"horovodlike-unauthenticated/{public}".encode()).digest()
    joined = None
    try:
        deadline = time.monotonic() + OUTSIDER_TIMEOUT
        while rank0.poll() is None and time.monotonic() < deadline:
            try:
                with StoreClient(f"127.0.0.1:{port + 1}", timeout=0.5, key=guessed) as c:
                    c.set("outsider", b"rank 1's blob, from someone else")
                    joined = "the store accepted the outsider's key"
                    break
            except (TimeoutError, StoreAuthError, OSError):
                continue
        _, err = rank0.communicate(timeout=OUTSIDER_TIMEOUT + 30)
    finally:
        if rank0.poll() is None:
            os.killpg(rank0.pid, 9)
            rank0.wait()
    assert joined is None, joined
    assert rank0.returncode != 0
    assert jobkey.ENV in err and launch_contract.INSECURE_RENDEZVOUS in err, err


def test_a_rank_with_another_key_cannot_join():
    port = free_port()
    envs = [clean_env(RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port - 1), HOROVODLIKE_START_TIMEOUT="5",
                      HOROVODLIKE_JOB_KEY=jobkey.generate().hex()) for r in range(2)]
    outs = run_processes(envs, TWO_RANKS)
    assert outs[1][0] != 0 and "RANK" not in outs[1][1], outs[1]
    assert outs[0][0] != 0                           # rank 0 waited for rank 1 in vain
    envs[1][jobkey.ENV] = envs[0][jobkey.ENV]        # the same secret: it works
    outs = run_processes(envs, TWO_RANKS)
    assert [code for code, _, _ in outs] == [0, 0], outs
    assert not any("not authenticated" in err for _, _, err in outs)


def torchrun(args, timeout=240, cwd=None):
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
                           "2", "--master_port", str(free_port_pair()), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=clean_env(OMP_NUM_THREADS="1"), start_new_session=True)


@needs_torch
def test_torchrun_with_torch_distributed_alongside(tmp_path):
    """Under real torchrun, hvd.init() and torch.distributed's own init both work:
    horovodlike's store sits beside torch's, not on it."""
    # With no XDG_RUNTIME_DIR, the ranks share their key in torchrun's own run
    # directory, beside a squatted $TMPDIR/horovodlike-<uid>.
    env = {k: v for k, v in clean_env().items() if k != "XDG_RUNTIME_DIR"}
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
                          "2", "--master_port", str(free_port_pair()),
                          str(rank_program("launch_env_torchrun_both")), str(tmp_path)],
                         capture_output=True, text=True, timeout=240, start_new_session=True,
                         env={**env, "OMP_NUM_THREADS": "1",
                              "TMPDIR": str(_squat(tmp_path, "directory"))})
    assert res.returncode == 0, res.stdout + res.stderr
    outs = [(tmp_path / f"out.{r}").read_text() for r in range(2)]
    check_two_ranks(outs)
    assert [f"TORCH {r} 3.0" in out for r, out in enumerate(outs)] == [True, True], outs


@needs_torch
def test_torchrun_digits_trains_as_under_horovodlikerun(tmp_path):
    example = REPO / "examples" / "pytorch_digits.py"
    under_torchrun = torchrun([str(example), "--checkpoint-dir", str(tmp_path / "a")])
    assert under_torchrun.returncode == 0, under_torchrun.stdout + under_torchrun.stderr
    ours = subprocess.run([sys.executable, "-m", "horovodlike.runner", "-np", "2",
                           sys.executable, str(example), "--checkpoint-dir",
                           str(tmp_path / "b")], capture_output=True, text=True,
                          timeout=240, env=clean_env(), start_new_session=True)
    assert ours.returncode == 0, ours.stderr

    def summary(text):
        m = re.search(r"ranks: (\d+); test loss ([\d.]+); test accuracy ([\d.]+)%", text)
        assert m, text
        return m.groups()
    got = summary(under_torchrun.stdout)
    assert got[0] == "2" and float(got[2]) > 90
    assert got == summary(ours.stdout)       # same data split, same arithmetic
    assert "RESULT accuracy=" in under_torchrun.stdout and "identical=1" in \
        under_torchrun.stdout


def test_one_host_key_falls_back_to_the_users_cache_in_their_home(tmp_path):
    """No runtime directory and no torchrun: the key file goes to ~/.cache/horovodlike,
    which only this user (and root) can reach; a cache behind a directory anyone can
    write to (such as /tmp) is refused, not used."""
    home = os.path.expanduser("~")
    if not launch_env._is_safe_chain(home):
        pytest.skip(f"this user's home {home} is writable by others")
    fake_home = Path(tempfile.mkdtemp(dir=home, prefix=".horovodlike-test-"))
    try:
        le0 = launch_env.LaunchEnv("env", 0, 2, 0, 2, 0, 1, "127.0.0.1", 29501, "job-h")
        le1 = launch_env.LaunchEnv("env", 1, 2, 1, 2, 0, 1, "127.0.0.1", 29501, "job-h")
        env = {"HOME": str(fake_home)}
        key = launch_env.job_key(le0, env)
        path = Path(launch_env.key_path(le0, env))
        assert path.parent == fake_home / ".cache" / "horovodlike"
        assert path.parent.stat().st_mode & 0o777 == 0o700
        assert launch_env.job_key(le1, env) == key
        launch_env.key_delivered()
        assert not path.exists()
    finally:
        shutil.rmtree(fake_home, ignore_errors=True)
    exposed = _private(tmp_path / "home")          # under /tmp: others can rename it
    with pytest.raises(RuntimeError, match="no private place.*not reachable through"):
        launch_env.job_key(le0, {"HOME": str(exposed)})
