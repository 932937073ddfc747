"""Collectives on real multi-process jobs, under horovodlikerun, mpirun and plain python.

Every rank script is rank-agnostic: each rank regenerates every rank's input from a
seed (so it knows what the others contributed), computes the expected result with
numpy, emulating the engine's documented arithmetic where it matters (integers wrap;
Average is sum * (1/size) in double truncated toward zero; float16/bfloat16 round to the
type after each step), and compares. Data for the exact checks is chosen so that every
partial result is exactly representable, which makes the reduction order irrelevant and
lets even float16/bfloat16 be compared bit for bit; a separate block checks fractional
data with a tolerance.

Each launch checks many cases (every dtype x every op x several shapes) because process
start-up dominates on a 2-core machine; a failing rank lists every failing case.
"""
import importlib.util
import json
import os
import time

import pytest

from harness import MPIRUN_SKIP_REASON, RankTimeout, launcher_matrix, rank_program, run_ranks

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(240)

FUSION_ENV = {"HOROVOD_FUSION_THRESHOLD": "65536"}
BIG = 100_003          # float32 elements: 400 KB, well above the 64 KB fusion threshold

# ----------------------------------------------------------------- rank-side code

BLOCKS = rank_program("collectives_blocks")
# the blocks it can run (tests/ranks/collectives_blocks.py)
ALLREDUCE_MATRIX = "allreduce_matrix"
ALLREDUCE_FRACTIONAL = "allreduce_fractional"
ALLREDUCE_SCALING = "allreduce_scaling"
ASYNC_FUSION = "async_fusion"
ALLGATHER = "allgather"
BROADCAST = "broadcast"
BARRIER = "barrier"
TOPOLOGY = "topology"


def script(*blocks):
    """The rank program's argv: the blocks to run, in order."""
    return blocks


def run_ok(blocks, np_, launcher, env=None, timeout=180, **kw):
    return run_ranks(BLOCKS, np_, launcher, env=env, timeout=timeout, args=blocks,
                     **kw).assert_ok()


HVDRUN_ALL = [("horovodlikerun", n) for n in (1, 2, 3, 4)]


# ------------------------------------------------------------------------ tests

@pytest.mark.parametrize("launcher,np_", launcher_matrix(
    HVDRUN_ALL + [("mpirun", 2), ("mpirun", 3)]))
def test_allreduce_every_dtype_and_op_matches_numpy(launcher, np_):
    run_ok(script(ALLREDUCE_MATRIX, ALLREDUCE_FRACTIONAL), np_, launcher, env=FUSION_ENV)


@pytest.mark.parametrize("launcher,np_", launcher_matrix(
    [("horovodlikerun", 1), ("horovodlikerun", 3), ("horovodlikerun", 4), ("mpirun", 2)]))
def test_allreduce_scaling_default_op_and_deprecated_average(launcher, np_):
    run_ok(script(ALLREDUCE_SCALING), np_, launcher)


@pytest.mark.parametrize("launcher,np_", launcher_matrix(
    HVDRUN_ALL + [("mpirun", 2), ("mpirun", 4)]))
def test_async_poll_synchronize_and_fusion(launcher, np_):
    run_ok(script(ASYNC_FUSION), np_, launcher, env=FUSION_ENV)


def test_async_with_default_fusion_threshold():
    # The default (128 MB) threshold: every compatible tensor of a cycle fuses into one
    # buffer, the large ones included; a longer cycle batches more requests per cycle.
    run_ok(script(ASYNC_FUSION), 3, "horovodlikerun", env={"HOROVOD_CYCLE_TIME": "5"})


@pytest.mark.parametrize("launcher,np_", launcher_matrix(
    HVDRUN_ALL + [("mpirun", 2), ("mpirun", 3)]))
def test_allgather_variable_first_dimension(launcher, np_):
    run_ok(script(ALLGATHER), np_, launcher)


@pytest.mark.parametrize("launcher,np_", launcher_matrix(
    HVDRUN_ALL + [("mpirun", 2), ("mpirun", 3)]))
def test_broadcast_from_every_root_and_barrier(launcher, np_):
    run_ok(script(BROADCAST, BARRIER), np_, launcher)


def _check_topology(res, np_, hosts=None):
    topo = {r: json.loads(v) for r, v in res.rank_values("topo").items()}
    assert sorted(topo) == list(range(np_)), res.describe()
    hosts = hosts or ["same"] * np_
    for r, t in topo.items():
        same = [q for q in range(np_) if hosts[q] == hosts[r]]
        local_rank = same.index(r)
        peers = [q for q in range(np_)
                 if [p for p in range(np_) if hosts[p] == hosts[q]].index(q) == local_rank]
        expected = dict(rank=r, size=np_, local_rank=local_rank, local_size=len(same),
                        cross_rank=peers.index(r), cross_size=len(peers),
                        is_initialized=True, gloo_built=False, nccl_built=False)
        got = {k: t[k] for k in expected}
        assert got == expected, f"rank {r}\n{res.describe()}"
        assert isinstance(t["mpi_built"], bool)
    return topo


@pytest.mark.parametrize("launcher,np_", launcher_matrix(
    HVDRUN_ALL + [("mpirun", n) for n in (1, 2, 3, 4)] + [("python", 1)]))
def test_topology(launcher, np_):
    res = run_ok(script(TOPOLOGY), np_, launcher)
    _check_topology(res, np_)
    values = [json.loads(v) for v in res.rank_values("topo").values()]
    assert all(v["homogeneous"] for v in values)
    if launcher == "mpirun":
        assert all(v["mpi_built"] and isinstance(v["threads"], bool) for v in values)
    else:
        assert all(v["threads"] == "not-mpi" for v in values)


def test_fake_hosts_topology_and_collectives():
    res = run_ok(script(TOPOLOGY, ALLREDUCE_MATRIX, ALLGATHER, BROADCAST, BARRIER), 4,
                 "horovodlikerun",
                 launcher_args=["-H", "a:2,b:2", "--ssh-command", "sh -c {command}"],
                 env={"HVDTEST_QUICK": "1", "HVDTEST_BIG": "20011"}, timeout=200)
    topo = _check_topology(res, 4, hosts=["a", "a", "b", "b"])
    assert [topo[r]["hostname"] for r in range(4)] == ["a", "a", "b", "b"]
    assert [(topo[r]["local_size"], topo[r]["cross_size"]) for r in range(4)] == [(2, 2)] * 4
    assert all(topo[r]["homogeneous"] for r in range(4))


def test_uneven_hosts_are_not_homogeneous():
    res = run_ok(script(TOPOLOGY), 3, "horovodlikerun",
                 launcher_args=["-H", "a:2,b:1", "--ssh-command", "sh -c {command}"])
    topo = {r: json.loads(v) for r, v in res.rank_values("topo").items()}
    assert [topo[r]["homogeneous"] for r in range(3)] == [False] * 3


INIT_SHUTDOWN = "init_shutdown"


@pytest.mark.parametrize("launcher,np_", launcher_matrix(
    [("python", 1), ("horovodlikerun", 1), ("horovodlikerun", 2), ("horovodlikerun", 3),
     ("mpirun", 2)]))
def test_init_idempotent_and_shutdown_then_init_again(launcher, np_):
    run_ok(script(INIT_SHUTDOWN), np_, launcher)


LAST_OP_THEN_EXIT = rank_program("collectives_last_op_then_exit")


@pytest.mark.parametrize("launcher,np_", launcher_matrix(
    [("python", 1), ("horovodlikerun", 2), ("horovodlikerun", 4), ("mpirun", 3)]))
def test_every_rank_exits_cleanly_right_after_its_last_collective(launcher, np_):
    """The most common ending of a training script: every rank finishes the same last
    allreduce and exits (atexit or an explicit hvd.shutdown()). A fast rank leaving must
    not fail a slower rank's copy of that same op. Repeated, because it is a race."""
    for attempt in range(6 if np_ > 1 else 1):
        n = (1, 4096, 100_003)[attempt % 3]
        how = ("atexit", "shutdown")[attempt % 2]
        res = run_ranks(LAST_OP_THEN_EXIT, np_, launcher, timeout=60, args=(n, how))
        assert res.returncode == 0, f"attempt {attempt} (n={n}, {how})\n{res.describe()}"
        res.assert_ok()
        assert res.rank_values("sum") == {r: str(sum(range(np_))) for r in range(np_)}


def _running(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


HANG = rank_program("collectives_hang")


@pytest.mark.parametrize("launcher,np_", launcher_matrix([("horovodlikerun", 2),
                                                          ("mpirun", 2)]))
def test_harness_kills_a_hung_job_on_timeout(launcher, np_):
    """The harness itself: a stalled job is killed, whole tree, and reported."""
    # The ranks print their pids at once; a loaded machine running the engine under the
    # sanitizers needs longer than 5 s to start two ranks at all.
    timeout = 15 if os.environ.get("HOROVODLIKE_TEST_SANITIZED") else 5
    with pytest.raises(RankTimeout) as info:
        run_ranks(HANG, np_, launcher, timeout=timeout)
    assert "timeout" in str(info.value) and "pid=" in str(info.value)
    pids = [int(line.rsplit("pid=", 1)[1].split()[0])
            for line in str(info.value).splitlines() if "pid=" in line]
    assert len(pids) == np_, str(info.value)
    deadline = time.monotonic() + 5
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in pids if _running(p)]
        time.sleep(0.1)
    assert not alive, f"ranks {alive} survived the timeout kill"


COMM_SUBSET = rank_program("collectives_comm_subset")


@pytest.mark.skipif(MPIRUN_SKIP_REASON is not None, reason=str(MPIRUN_SKIP_REASON))
def test_init_on_a_list_of_world_ranks():
    res = run_ranks(COMM_SUBSET, 3, "mpirun", timeout=120)
    assert res.returncode == 0, res.describe()
    lines = {r: " ".join(v) for r, v in res.rank_lines().items()}
    assert "member 2 rank=0 size=2 sum=2.0 comm=True" in lines[2], res.describe()
    assert "member 0 rank=1 size=2 sum=2.0 comm=True" in lines[0], res.describe()
    assert "refused 1" in lines[1] and "not one of them" in lines[1], res.describe()
