"""Elastic PyTorch jobs with real processes on fake hosts: a SIGKILLed rank, a host
added mid-run, a host removed (also below --min-np for a while), too few slots for
longer than --elastic-timeout, a host that keeps failing (blacklist, cooldown,
--reset-limit), and a rank that exits 0 early. Each job trains an MLP on scikit-learn's
digits with hvd.elastic.TorchState and ElasticSampler; faults are caused for real from
inside the job (a rank SIGKILLs itself, exits, or rewrites the discovery's host file)."""

import pytest

from elastic_support import records, run_elastic
from harness import rank_program

SCRIPT = rank_program("elastic_torch_script")

THREE = "a:1\nb:1\nc:1\n"


def _finals(res):
    return [r for _, r in records(res, "final")]


def _assert_finished_together(res, size, epochs=4):
    assert res.returncode == 0, res.describe()
    finals = _finals(res)
    assert len(finals) == size, res.describe()
    assert {f["size"] for f in finals} == {str(size)}, finals
    assert {f["epoch"] for f in finals} == {str(epochs - 1)}, finals
    assert len({f["hash"] for f in finals}) == 1, f"ranks disagree: {finals}"
    return finals


def _starts_agree(res):
    """Every attempt of train() after a sync starts from the same parameters and
    optimizer state on every rank of that round."""
    by_round = {}
    for _, r in records(res, "start"):
        by_round.setdefault((r["size"], r["epoch"], r["batch"]), []).append(r)
    for key, starts in by_round.items():
        assert len({s["hash"] for s in starts}) == 1, f"round {key} started apart: {starts}"
    return by_round


@pytest.mark.timeout(210)        # two jobs, 72 s together on a loaded 2-core machine
def test_sigkilled_rank_job_goes_on_from_last_commit(tmp_path):
    """(a) np=3, min-np=2: a rank SIGKILLs itself mid-epoch; the job re-forms on 2 ranks
    from the last commit, finishes every epoch with bit-identical parameters, and reaches
    an uninterrupted run's accuracy within 0.04."""
    res = run_elastic(SCRIPT, tmp_path, THREE, 3, 2, 3, env={"EL_FAULT": "kill:c:1:9"},
                      timeout=100)
    finals = _assert_finished_together(res, 2)
    assert "fault kill" in res.stdout and "SIGKILL" in res.stderr, res.describe()
    assert "blacklisting host c" in res.stderr
    # rank 0 of the new round is the oldest survivor; every epoch ran to its end
    assert "round 1: 2 ranks: 0=worker 0@a, 1=worker 1@b" in res.stderr, res.describe()
    done = {(int(r["epoch"]), w) for w, r in records(res, "epoch-done")}
    assert {e for e, w in done if w == 0} == {0, 1, 2, 3}
    _starts_agree(res)
    # the attempt after the kill starts from the last commit of epoch 1 (batch 8: commit
    # every 4 batches, the kill at batch 9)
    assert any(r["epoch"] == "1" and r["batch"] == "8" and r["size"] == "2"
               for _, r in records(res, "start")), res.describe()

    clean = run_elastic(SCRIPT, tmp_path, THREE, 3, 2, 3, timeout=100)
    reference = _assert_finished_together(clean, 3)
    acc, ref = float(finals[0]["acc"]), float(reference[0]["acc"])
    assert ref > 0.85, clean.describe()
    assert abs(acc - ref) <= 0.04, f"accuracy {acc} vs uninterrupted {ref}"


@pytest.mark.timeout(210)        # 73 s on a loaded 2-core machine
def test_discovered_hosts_join_with_the_committed_state(tmp_path):
    """(b) The discovery adds a host with 2 slots mid-run: the job grows from 2 to 4 and
    the new ranks start from the same parameters and optimizer state as the others."""
    res = run_elastic(SCRIPT, tmp_path, "a:1\nb:1\n", 2, 2, 4,
                      env={"EL_HOSTS_AT": "1:2:a:1;b:1;c:2;", "EL_EPOCHS": "6",
                           "EL_SLOW": "0.2", "EL_SLOW_BELOW": "4"}, timeout=195)
    _assert_finished_together(res, 4, epochs=6)
    assert "hosts-changed" in res.stdout
    by_round = _starts_agree(res)
    grown = [s for key, starts in by_round.items() if key[0] == "4" for s in starts]
    assert len(grown) == 4, by_round
    # the grown round resumed where the others were, not from the start
    assert all((s["epoch"], s["batch"]) != ("0", "0") for s in grown), grown
    hellos = records(res, "hello")
    assert sorted(h["host"] for _, h in hellos) == ["a", "b", "c", "c"]


@pytest.mark.timeout(270)        # 91 s on a loaded 2-core machine
def test_removed_host_is_drained_even_below_min_np(tmp_path):
    """(c) Host c leaves the discovery: its rank leaves at the next commit (exit 0, no
    restore). That leaves 2 < --min-np 3 slots; the job waits, host d appears a few
    seconds later, and the job goes on at 3, with the new rank synchronized (Horovod's
    deadlock: the old ranks skipped the sync the new one waited in)."""
    marker = str(tmp_path / "hosts.marker")
    res = run_elastic(SCRIPT, tmp_path, THREE, 3, 3, 3,
                      env={"EL_HOSTS_AT": "1:5:a:1;b:1;", "EL_EPOCHS": "4",
                           "EL_SLOW": "0.1"},
                      extra=["--elastic-timeout", "60"],
                      on_marker=(marker, 4.0, "a:1\nb:1\nd:1\n"), timeout=255)
    _assert_finished_together(res, 3)
    assert "waiting for 3 slots (have 2)" in res.stderr, res.describe()
    assert "leaves the job: its slot was removed" in res.stderr, res.describe()
    assert "blacklisting" not in res.stderr
    hosts = {h["host"] for _, h in records(res, "hello")}
    assert hosts == {"a", "b", "c", "d"}
    by_round = _starts_agree(res)
    # the drain kept the state (no restore to an earlier commit): the round with d
    # starts where the others stopped, after the change at epoch 1 batch 5
    grown = [(int(k[1]), int(k[2])) for k in by_round if k[0] == "3" and k[1:] != ("0", "0")]
    assert len(grown) == 1 and grown[0] > (1, 5), by_round


@pytest.mark.timeout(130)        # 44 s on a loaded 2-core machine
def test_too_few_slots_for_longer_than_the_timeout_fails(tmp_path):
    """(d) Host b leaves for good: with 1 < --min-np 2 slots the job waits
    --elastic-timeout seconds and fails saying why."""
    res = run_elastic(SCRIPT, tmp_path, "a:1\nb:1\n", 2, 2, 2,
                      env={"EL_HOSTS_AT": "1:3:a:1;", "EL_SLOW": "0.02"},
                      extra=["--elastic-timeout", "6"], timeout=115)
    assert res.returncode != 0, res.describe()
    assert "timed out after 6 s waiting for at least 2 slots (--min-np 2); only 1 " \
           "available (usable hosts: a:1)" in res.stderr, res.describe()
    assert not _finals(res)


@pytest.mark.timeout(17)         # 5.7 s on a loaded 2-core machine (3 s of it waiting)
def test_not_enough_slots_to_start_fails_after_the_timeout(tmp_path):
    res = run_elastic(SCRIPT, tmp_path, "a:1\n", 2, 2, 2,
                      extra=["--elastic-timeout", "3"], timeout=15)
    assert res.returncode == 1, res.describe()
    assert "timed out after 3 s waiting for at least 2 slots" in res.stderr
    assert "hello" not in res.stdout


@pytest.mark.timeout(175)        # 59 s on a loaded 2-core machine
def test_failing_host_is_blacklisted_for_good(tmp_path):
    """(e) A rank on host c exits 3: c is blacklisted (no cooldown: for good) and never
    gets a worker again; the job finishes on a and b."""
    res = run_elastic(SCRIPT, tmp_path, THREE, 3, 2, 3, env={"EL_FAULT": "fail:c:0:5"},
                      timeout=160)
    _assert_finished_together(res, 2)
    assert "exited with code 3; blacklisting host c" in res.stderr
    assert [h["host"] for _, h in records(res, "hello")].count("c") == 1


@pytest.mark.timeout(225)        # 76 s on a loaded 2-core machine
def test_cooldown_brings_a_host_back_and_reset_limit_stops_the_job(tmp_path):
    """(e) With --blacklist-cooldown-range 1 2 host c comes back after its cooldown and
    fails again; --reset-limit 2 ends the job with Horovod's reason."""
    res = run_elastic(SCRIPT, tmp_path, THREE, 3, 2, 3,
                      env={"EL_FAULT": "fail:c:0:5", "EL_SLOW": "0.05", "EL_EPOCHS": "30"},
                      extra=["--blacklist-cooldown-range", "1", "2", "--reset-limit", "2"],
                      timeout=210)
    assert res.returncode == 1, res.describe()
    assert "number of resets during the elastic job exceeded the limit: 2" in res.stderr, \
        res.describe()
    assert "host c is out of its blacklist cooldown" in res.stderr
    assert [h["host"] for _, h in records(res, "hello")].count("c") >= 2


@pytest.mark.timeout(135)        # 45 s on a loaded 2-core machine
def test_rank_exiting_zero_early_does_not_end_the_job(tmp_path):
    """(g) The rank on host c exits 0 in epoch 1 while the others train: the job goes on
    with 2 ranks and finishes every epoch (Horovod ended the whole job)."""
    res = run_elastic(SCRIPT, tmp_path, THREE, 3, 2, 3, env={"EL_FAULT": "exit0:c:1:3"},
                      timeout=120)
    _assert_finished_together(res, 2)
    assert "worker 2 (rank 2, host c) finished" in res.stderr
    assert "blacklisting" not in res.stderr
    _starts_agree(res)


PROCESS_SETS = rank_program("elastic_torch_process_sets")


@pytest.mark.timeout(48)         # 16 s on a loaded 2-core machine
def test_process_sets_after_a_reset(tmp_path):
    """After a reset rank() and size() describe the new round, a process set made before
    is refused as unregistered, and one re-added in a reset callback works."""
    res = run_elastic(PROCESS_SETS, tmp_path, THREE, 3, 2, 3, timeout=40)
    assert res.returncode == 0, res.describe()
    finals = sorted((r["rank"], r) for _, r in records(res, "final"))
    assert [r for r, _ in finals] == ["0", "1"], res.describe()
    for _, r in finals:
        assert (r["size"], r["total"], r["stale_refused"], r["pair"]) == \
            ("2", "2", "yes", "0,1"), r
