"""Every data path gives numpy's answer: the shared-memory path (one-shot, two-shot with
many pieces), the TCP ring (HOROVODLIKE_SHM=0, and across fake nodes), process sets that
are exactly one node's ranks (shm) or straddle nodes (TCP), and 8 oversubscribed ranks.
Sizes are odd, smaller than the rank count, and not multiples of the piece size."""
import os

import pytest

from harness import leaked_segments, rank_program, run_ranks

PATHS = rank_program("data_paths_paths")


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
    res = run_ranks(rank_program("one_allreduce"),
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


SETS = rank_program("data_paths_sets")


@pytest.mark.timeout(200)
def test_process_sets_on_a_node_and_across_fake_nodes():
    run_ranks(SETS, np=4, launcher_args=["-H", "a:2,b:2", "--ssh-command", "sh -c {command}"],
              timeout=180).assert_ok()


def test_no_shared_memory_segment_is_left_behind():
    run_ranks(rank_program("one_allreduce"), np=3, args=(10,)).assert_ok()
    assert not leaked_segments()


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


HIER = rank_program("data_paths_hier")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("hosts,per_node,env", [
    # 4 KiB chunks: a piece is 16 KiB (2 ranks a node) or 24 KiB, so the sizes run from
    # under one piece to about 50
    ("a:2,b:2", 2, {"HOROVODLIKE_SHM_CHUNK_BYTES": "4096"}),
    ("a:3,b:3", 3, {"HOROVODLIKE_SHM_CHUNK_BYTES": "4096"}),
    ("a:2,b:2,c:2", 2, {"HOROVODLIKE_SHM_CHUNK_BYTES": "4096"}),
    # the default pieces (1 MiB at 2 ranks a node): 3 MB is 3 of them and a part
    ("a:2,b:2", 2, {"HIER_SIZES": "262145,800001"}),
], ids=["2x2", "2x3", "3x2", "2x2-default-pieces"])
def test_hierarchical_pieces_match_numpy(hosts, per_node, env):
    """The pipelined hierarchical allreduce (allreduce_hier.c) at sizes of one piece to
    many: bit for bit the algorithm's order with two nodes, the same bits on every rank."""
    np_ = sum(int(h.split(":")[1]) for h in hosts.split(","))
    run_ranks(HIER, np=np_, args=(per_node,), launcher_args=["-H", hosts] + FAKE_NODES,
              timeout=280, env={"HOROVODLIKE_ALLREDUCE_ALGORITHM": "hier", **env}).assert_ok()
