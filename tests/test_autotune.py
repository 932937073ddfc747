"""The autotuner (horovodlike/common/autotune.py, HOROVOD_AUTOTUNE=1 / --autotune).

In this process: the search's schedule (warm-up, the start as the first scored sample,
Bayesian samples, one sample per other algorithm, then done), that it keeps the start
when nothing beats it, that its Gaussian process finds a known optimum, and that a bad
HOROVOD_AUTOTUNE_* value is refused naming it. In real jobs: the tune op changes every
rank's knobs between the same two ops and refuses values the knobs cannot take, and a
DistributedOptimizer job under `horovodlikerun --autotune` ends its search on every rank
at the same step, writes Horovod's CSV log, and keeps the ranks' parameters equal.
Speed is measured in bench/autotune.py, not here."""
import csv
import json
import math

import pytest

from harness import rank_program, run_ranks
from horovodlike.common import autotune

MiB = 1 << 20


def _settings(monkeypatch, warmup=2, steps=1, samples=6, noise=0.1):
    monkeypatch.setenv("HOROVOD_AUTOTUNE_WARMUP_SAMPLES", str(warmup))
    monkeypatch.setenv("HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", str(steps))
    monkeypatch.setenv("HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", str(samples))
    monkeypatch.setenv("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", str(noise))
    monkeypatch.delenv("HOROVOD_AUTOTUNE_LOG", raising=False)
    return autotune.Settings()


class _Clock:
    """A clock the scores come from: each step of a setting takes `cost(values)` s."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _run(monkeypatch, settings, cost, start=(1.0 * MiB, 20.0), bucket=MiB, steps=200):
    """Drive one rank-0 tuner alone (its broadcast returns its own values)."""
    monkeypatch.setattr(autotune.basics, "rank", lambda: 0)
    clock = _Clock()
    monkeypatch.setattr(autotune.time, "perf_counter", clock)
    seen = []
    t = autotune.Autotuner(settings, start, bucket, seen.append, ["auto", "ring", "rd"])
    t._agree = lambda values: values
    for _ in range(steps):
        clock.now += cost(t.values, t.algorithm)
        t.step()
        if t.done:
            break
    return t, seen


def test_schedule_keeps_the_start_when_nothing_beats_it(monkeypatch):
    s = _settings(monkeypatch)
    start = [1.0 * MiB, 20.0, 1.0 * MiB]
    t, _ = _run(monkeypatch, s, lambda v, alg: 0.01 if v == start and alg == "auto" else 0.02)
    phases = [r[-1] for r in t.rows]
    assert phases == ["warmup"] * 2 + ["bayes"] * 6 + ["algorithm"] * 2, phases
    first = t.rows[2]                  # the first scored sample is the start, as given
    assert (first[3], first[4], first[7]) == ("20.000", "1.000", "1.000"), first
    assert t.done and t.kept["allreduce"] == "auto"
    assert math.isclose(t.kept["fusion_mb"], 1.0, rel_tol=1e-6), t.kept
    assert math.isclose(t.kept["cycle_ms"], 20.0, rel_tol=1e-6), t.kept


def test_search_finds_a_known_optimum(monkeypatch):
    """Steps are fastest at fusion 32 MiB, cycle 0.5 ms: the kept setting is near it
    and scores at least 0.95x its best (the benchmark's target, here without noise)."""
    s = _settings(monkeypatch, warmup=0, samples=20, noise=0.05)

    def cost(v, alg):
        f = math.log2(v[0] / (32 * MiB)) / 12
        c = math.log10(v[1] / 0.5) / 3
        return 0.01 * (1 + f * f + c * c) * (1.2 if alg != "auto" else 1.0)

    t, _ = _run(monkeypatch, s, cost, steps=400)
    kept = [t.kept["fusion_mb"] * MiB, t.kept["cycle_ms"]]
    assert t.kept["allreduce"] == "auto", t.kept
    assert cost(kept, "auto") <= 0.01 / 0.95, (t.kept, cost(kept, "auto"))


def test_an_algorithm_is_kept_only_when_clearly_ahead(monkeypatch):
    s = _settings(monkeypatch, warmup=0, samples=3)
    t, _ = _run(monkeypatch, s, lambda v, alg: 0.005 if alg == "rd" else 0.01)
    assert t.kept["allreduce"] == "rd", t.kept
    t, _ = _run(monkeypatch, s, lambda v, alg: 0.0098 if alg == "rd" else 0.01)
    assert t.kept["allreduce"] == "auto", t.kept


def test_the_bucket_cap_reaches_the_framework(monkeypatch):
    s = _settings(monkeypatch, warmup=0, samples=3)
    t, seen = _run(monkeypatch, s, lambda v, alg: 0.01)
    assert len(seen) == len(t.rows) and all(b >= 256 << 10 for b in seen), seen


@pytest.mark.parametrize("var,value,needle", [
    ("HOROVOD_AUTOTUNE_WARMUP_SAMPLES", "many", "an integer of at least 0"),
    ("HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "0", "an integer of at least 1"),
    ("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "2", "in [0, 1]"),
])
def test_bad_settings_are_named(monkeypatch, var, value, needle):
    monkeypatch.setenv(var, value)
    with pytest.raises(ValueError, match=var) as info:
        autotune.Settings()
    assert needle in str(info.value)


KNOBS = rank_program("autotune_knobs")


@pytest.mark.timeout(120)
def test_tune_op_changes_every_ranks_knobs(tmp_path):
    res = run_ranks(KNOBS, 2, env={"HOROVOD_TIMELINE": str(tmp_path / "tl.json")},
                    timeout=90)
    res.assert_ok(sentinel="OK")
    for needle in ("REFUSED NaN: ", "a value is NaN", "REFUSED shm forced",
                   "REFUSED 2 TiB fusion", "REFUSED short"):
        assert needle in res.stdout, res.stdout
    for r in range(2):
        with open(tmp_path / f"tl.rank{r}.json") as f:
            events = json.load(f)["traceEvents"]
        ran = {a["tensors"][0]: (a["algorithm"], a["fusion_threshold"])
               for a in (e.get("args") or {} for e in events) if "algorithm" in a}
        assert ran["allreduce.before"] == ("shm", 128 * MiB), (r, ran)
        assert ran["allreduce.ring"] == ("tcp_ring", 4 * MiB), (r, ran)
        assert ran["allreduce.auto"] == ("shm", 4 * MiB), (r, ran)


TRAIN = rank_program("autotune_train")


@pytest.mark.timeout(200)
def test_search_runs_to_its_end_in_step(tmp_path):
    log = tmp_path / "autotune.csv"
    # 1 warm-up + 4 Bayesian + 2 algorithm samples of 1 untimed + 2 timed steps
    res = run_ranks(TRAIN, 2, env={"HOROVOD_FUSION_THRESHOLD": str(MiB),
                                   "HOROVOD_CYCLE_TIME": "20", "T_STEPS": "30"},
                    launcher_args=["--autotune", "--autotune-log-file", str(log),
                                   "--autotune-warmup-samples", "1",
                                   "--autotune-steps-per-sample", "2",
                                   "--autotune-bayes-opt-max-samples", "4"],
                    timeout=150)
    res.assert_ok(sentinel="OK")
    assert "ENDED 20 " in res.stdout, res.stdout      # 7 samples x 3 steps, from 0
    with open(log, newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0][:6] == ["hierarchical_allreduce", "hierarchical_allgather",
                           "cache_enabled", "cycle_time_ms", "tensor_fusion_threshold",
                           "score"], rows[0]
    assert [r[-1] for r in rows[1:]] == ["warmup"] + ["bayes"] * 4 + ["algorithm"] * 2, rows
    assert rows[2][3:5] == ["20.000", "1.000"], rows[2]     # the start, scored first
    assert all(float(r[5]) > 0 for r in rows[1:]), rows
