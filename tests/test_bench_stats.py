"""bench/stats.py and the row-building of bench/run.py: medians over rounds, the spread,
the ratio, and the slow-mode rule, on made-up rounds (no timing, no processes)."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import run as bench_run  # noqa: E402
import stats  # noqa: E402


def rnd(n, median_s, calibration=(0.005, 0.005), spread=0.0):
    """A round numbered n whose samples have this median."""
    return {"round": n, "seconds": [median_s - spread, median_s, median_s + spread],
            "calibration": list(calibration)}


def test_quantile_interpolates_between_ranks():
    assert stats.quantile([4, 1, 3, 2], 0.0) == 1
    assert stats.quantile([4, 1, 3, 2], 1.0) == 4
    assert stats.quantile([1, 2, 3, 4, 5], 0.25) == 2
    assert stats.quantile([1, 2], 0.25) == pytest.approx(1.25)
    with pytest.raises(ValueError):
        stats.quantile([], 0.5)


def test_baseline_is_the_lower_quartile_of_every_reading():
    cals = [[0.004, 0.005], [0.005, 0.004], [0.010, 0.010], [0.020, 0.010], [0.010, 0.030]]
    # readings 4 4 5 5 10 10 10 10 20 30 ms -> lower quartile 5 ms (each round's worst
    # would give 10: the busy rounds would raise the bar they are measured against)
    assert stats.baseline(cals) == pytest.approx(0.005)
    assert stats.baseline([None, []]) is None


def test_a_round_is_slow_when_before_or_after_exceeds_the_factor():
    base = 0.005
    assert not stats.is_slow([0.005, 0.007], base)          # 1.4x: noise
    assert stats.is_slow([0.005, 0.008], base)              # after: 1.6x
    assert stats.is_slow([0.009, 0.005], base)              # before: 1.8x
    assert not stats.is_slow(None, base)                    # no calibration: kept
    assert not stats.is_slow([0.1, 0.1], None)              # no baseline: kept


def test_slow_rounds_leave_the_row_and_are_counted():
    rounds = [dict(rnd(1, 0.010), slow=False), dict(rnd(2, 0.012), slow=False),
              dict(rnd(3, 0.200), slow=True), dict(rnd(4, 0.011), slow=False)]
    s = stats.summarize(rounds)
    assert s["median"] == pytest.approx(0.011)
    assert (s["lo"], s["hi"]) == (pytest.approx(0.010), pytest.approx(0.012))
    assert (s["kept"], s["slow"], s["all_slow"]) == (3, 1, False)
    assert s["slow_medians"] == [pytest.approx(0.200)]


def test_when_every_round_is_slow_all_are_kept_and_the_row_says_so():
    rounds = [dict(rnd(1, 0.2), slow=True), dict(rnd(2, 0.3), slow=True)]
    s = stats.summarize(rounds)
    assert s["all_slow"] and s["kept"] == 2 and s["median"] == pytest.approx(0.25)


def test_the_row_is_the_median_of_round_medians_not_of_pooled_samples():
    # one round with many samples must not outvote the others
    many = {"round": 1, "seconds": [0.050] * 99, "calibration": [0.005, 0.005], "slow": False}
    rounds = [many] + [dict(rnd(n, 0.010), slow=False) for n in (2, 3)]
    assert stats.summarize(rounds)["median"] == pytest.approx(0.010)


def test_run_marks_the_slow_mode_per_rank_count_and_builds_the_row():
    quiet, slow = (0.005, 0.005), (0.005, 0.012)
    samples = {
        ("sizes", 2, "4096", "ours"): [rnd(1, 12e-6, quiet), rnd(2, 200e-6, slow),
                                       rnd(3, 13e-6, quiet)],
        ("sizes", 2, "4096", "mpi"): [rnd(1, 6e-6, quiet), rnd(2, 7e-6, quiet),
                                      rnd(3, 150e-6, slow)],
        # 8 ranks on 2 cores calibrate 4x slower even when quiet: their own baseline
        ("sizes", 8, "4096", "ours"): [rnd(n, 50e-6, (0.02, 0.02)) for n in (1, 2, 3)],
    }
    bases = bench_run.mark_slow(samples)
    assert bases[2] == pytest.approx(0.005) and bases[8] == pytest.approx(0.02)
    assert [r["slow"] for r in samples[("sizes", 2, "4096", "ours")]] == [False, True, False]
    assert [r["slow"] for r in samples[("sizes", 2, "4096", "mpi")]] == [False, False, True]
    assert not any(r["slow"] for r in samples[("sizes", 8, "4096", "ours")])
    assert max(bench_run.kept_seconds(samples[("sizes", 2, "4096", "ours")])) < 20e-6

    text = bench_run.table(samples, ["ours", "mpi"])
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in text.splitlines()]
    cells = next(r for r in rows if r[:2] == ["4 KiB", "2"])
    assert cells[2] == "0.0125 [0.012-0.013] (1 slow)"
    assert cells[3] == "0.0065 [0.006-0.007] (1 slow)"
    assert cells[4] == f"{12.5 / 6.5:.2f}"
    report = bench_run.slow_report(samples)
    assert any("ours: round 2 0.2 ms" in line for line in report)
    assert any("mpi: round 3 0.15 ms" in line for line in report)


def test_replot_reads_old_and_new_json(tmp_path):
    old = {"samples": [{"case": "sizes", "np": 2, "label": "4096", "impl": "ours",
                        "seconds": [1e-5, 2e-5]}]}
    new = dict(old, rounds=[{"case": "sizes", "np": 2, "label": "4096", "impl": "ours",
                             "round": 1, "median": 1.5e-5, "calibration": [0.005, 0.005],
                             "slow": False, "seconds": [1e-5, 2e-5]}],
               slow_factor=stats.SLOW_FACTOR)
    for i, doc in enumerate((old, new)):
        path = tmp_path / f"{i}.json"
        path.write_text(json.dumps(doc))
        assert bench_run.load_samples(str(path)) == {("sizes", 2, "4096", "ours"): [1e-5, 2e-5]}
