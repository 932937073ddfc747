"""Every data path gives numpy's answer: the shared-memory path (one-shot, two-shot with
many pieces), the TCP ring (HOROVODLIKE_SHM=0, and across fake nodes), process sets that
are exactly one node's ranks (shm) or straddle nodes (TCP), and 8 oversubscribed ranks.
Sizes are odd, smaller than the rank count, and not multiples of the piece size."""
import glob
import os
import textwrap

import pytest

from harness import RANK_PRELUDE, run_ranks

PATHS = RANK_PRELUDE + textwrap.dedent("""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    sizes = [0, 1, n - 1, 3, 1023, 4097, 70001, 300007]
    for size in sizes:
        for dt in (np.float32, np.float64, np.int32, np.float16, np.uint8):
            x = ((np.arange(size) % 7) + r).astype(dt)
            exp = sum(((np.arange(size) % 7) + q).astype(np.float64) for q in range(n))
            got = hvd.allreduce(x, op=hvd.Sum, name=f"sum.{size}.{np.dtype(dt).name}")
            check_close(got, exp.astype(dt), f"sum {size} {np.dtype(dt).name}",
                        rtol=1e-2 if dt == np.float16 else 1e-6, atol=0)
        # Average: the shm path scales each reduced share inside the algorithm
        for dt in (np.float32, np.float64, np.int32):
            x = ((np.arange(size) % 7) + r).astype(dt)
            exp = sum(((np.arange(size) % 7) + q).astype(np.float64) for q in range(n))
            want = np.trunc(exp * (1.0 / n)) if dt == np.int32 else exp / n
            got = hvd.allreduce(x, op=hvd.Average, name=f"avg.{size}.{np.dtype(dt).name}")
            check_close(got, want.astype(dt), f"average {size} {np.dtype(dt).name}", rtol=1e-6, atol=0)
        x = (np.arange(size) * (r + 1)).astype(np.int64)
        check_equal(hvd.allreduce(x, op=hvd.Max, name=f"max.{size}"), np.arange(size) * n, f"max {size}")
        check_equal(hvd.allreduce(x, op=hvd.Min, name=f"min.{size}"), np.arange(size), f"min {size}")
        b = hvd.broadcast(np.full(size, r, np.int16), root_rank=n - 1, name=f"bc.{size}")
        check_equal(b, np.full(size, n - 1, np.int16), f"broadcast {size}")
        g = hvd.allgather(np.full((size // 1000 + r, 3), r, np.float32), name=f"ag.{size}")
        exp = np.concatenate([np.full((size // 1000 + q, 3), q, np.float32) for q in range(n)])
        check_equal(g, exp, f"allgather {size}")
    for rows in (0, 1, n + 1, 30001):
        x = np.arange(rows * 3, dtype=np.float64).reshape(rows, 3) + r
        exp = sum(np.arange(rows * 3, dtype=np.float64).reshape(rows, 3) + q for q in range(n))
        share = [rows // n + (q < rows % n) for q in range(n)]
        lo = sum(share[:r])
        check_equal(hvd.reducescatter(x, op=hvd.Sum, name=f"rs.{rows}"), exp[lo:lo + share[r]],
                    f"reducescatter {rows}")
        check_close(hvd.reducescatter(x, op=hvd.Average, name=f"rsavg.{rows}"),
                    exp[lo:lo + share[r]] / n, f"reducescatter average {rows}", rtol=1e-12, atol=0)
        splits = [((r + j) % 3) * (rows // 3 + 1) for j in range(n)]
        x = np.concatenate([np.full((splits[j], 2), r * 1000 + j, np.int32) for j in range(n)])
        out, got = hvd.alltoall(x, splits=splits, name=f"a2a.{rows}")
        want = [((q + r) % 3) * (rows // 3 + 1) for q in range(n)]
        check_equal(np.asarray(got), np.array(want, np.int32), f"alltoall splits {rows}")
        check_equal(out, np.concatenate([np.full((want[q], 2), q * 1000 + r, np.int32)
                                         for q in range(n)]), f"alltoall {rows}")
    # many tensors fused into one buffer
    hs = [hvd.allreduce_async(np.full(1000 + i, i + r, np.float64), op=hvd.Sum, name=f"f{i}")
          for i in range(40)]
    for i, h in enumerate(hs):
        check_equal(hvd.synchronize(h), np.full(1000 + i, n * i + n * (n - 1) / 2), f"fused {i}")
    hs = [hvd.allreduce_async(np.full(1000 + i, i + r, np.float64), op=hvd.Average, name=f"fa{i}")
          for i in range(40)]
    for i, h in enumerate(hs):
        check_close(hvd.synchronize(h), np.full(1000 + i, i + (n - 1) / 2), f"fused average {i}",
                    rtol=1e-12, atol=0)
    finish()
""")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("env", [
    {},                                              # shm, default pieces
    {"HOROVODLIKE_SHM_CHUNK_BYTES": "4096"},         # shm, many pieces per op
    {"HOROVODLIKE_SHM": "0"},                        # the TCP ring on one node
    {"HOROVODLIKE_SHM": "0", "HOROVODLIKE_CHUNK_BYTES": "4096"},
], ids=["shm", "shm-small-pieces", "tcp", "tcp-small-chunks"])
@pytest.mark.parametrize("np_", [2, 3])
def test_every_path_matches_numpy(env, np_):
    run_ranks(PATHS, np=np_, env=env, timeout=240).assert_ok()


def test_eight_oversubscribed_ranks():
    run_ranks(PATHS, np=8, env={"HVDTEST": "8"}, timeout=280).assert_ok()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("np_", [1, 2, 8])
def test_waits_spin_only_where_every_thread_has_a_core(np_):
    """A waiting caller and the loop's wait spin only where each local rank's two threads
    (caller and engine) have a core each; a shm barrier while each rank has one. On
    fewer cores a spinning thread holds the core that its own engine thread needs."""
    res = run_ranks(RANK_PRELUDE + "hvd.init()\nhvd.allreduce(np.ones(3), name='x')\nfinish()\n",
                    np=np_, env={"HOROVOD_LOG_LEVEL": "info", "HOROVODLIKE_SPIN_US": "37"},
                    timeout=100)
    res.assert_ok()
    cores = os.sysconf("SC_NPROCESSORS_ONLN")
    lines = [ln for ln in res.stderr.splitlines() if " waits spin " in ln]
    assert len(lines) == np_, res.stderr
    for ln in lines:
        want = (f"waits spin {0 if 2 * np_ > cores else 37} us, "
                f"shm barriers {0 if np_ > cores else 37} us ({np_} local ranks, {cores} cores)")
        assert want in ln, ln


SETS = RANK_PRELUDE + textwrap.dedent("""
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
""")


@pytest.mark.timeout(200)
def test_process_sets_on_a_node_and_across_fake_nodes():
    run_ranks(SETS, np=4, launcher_args=["-H", "a:2,b:2", "--ssh-command", "sh -c {command}"],
              timeout=180).assert_ok()


def test_no_shared_memory_segment_is_left_behind():
    run_ranks(RANK_PRELUDE + "hvd.init()\nhvd.allreduce(np.ones(10), name='x')\nfinish()\n",
              np=3).assert_ok()
    assert not glob.glob("/dev/shm/hvdl-*")


FAKE_NODES = ["--ssh-command", "sh -c {command}"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("algorithm,np_,hosts", [
    ("auto", 4, "a:2,b:2"),          # several nodes of several ranks: hierarchical
    ("hier", 6, "a:3,b:3"),
    ("ring", 4, "a:2,b:2"),
    ("rd", 4, "a:2,b:2"),            # recursive doubling, power of two
    ("rd", 3, "a:1,b:1,c:1"),        # ... and not
    ("auto", 3, "a:2,b:1"),          # uneven nodes: no hierarchical path, flat TCP
], ids=lambda v: str(v))
def test_allreduce_algorithms_across_fake_nodes(algorithm, np_, hosts):
    # allgather follows: hierarchical on homogeneous fake nodes unless forced flat
    run_ranks(PATHS, np=np_, launcher_args=["-H", hosts] + FAKE_NODES, timeout=280,
              env={"HOROVODLIKE_ALLREDUCE_ALGORITHM": algorithm,
                   "HOROVODLIKE_ALLGATHER_ALGORITHM": "ring" if algorithm == "ring" else "auto",
                   "HOROVODLIKE_SHM_CHUNK_BYTES": "4096"}).assert_ok()
