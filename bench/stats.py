"""How bench/run.py turns rounds into a row: medians, spread, and the slow-mode rule.

Pure Python (no timing here), so tests/test_bench_stats.py checks it without a machine.

A ROUND is one job of one implementation: its own processes, launched, timed over every
size of the case, stopped. Rounds of the implementations alternate (ours, peer, peer,
ours...). Samples inside one round are not independent (one process layout, one page
placement, one state of the machine), so a row is built from the rounds, not from the
pooled samples:

- each round gives its median sample;
- the row gives, per implementation, the median of its kept rounds' medians and their
  min-max ("spread over rounds"), and the ratio of ours to each peer's median;
- a round in the machine's slow mode is marked and kept out of the row (see is_slow).

The slow mode. This 2-core machine is shared, and at times every process on it runs
slower for seconds to minutes: another job's processes take the cores, or the host
slows the guest. OpenMPI slows as much as we do (docs/benchmarks.md has 1 MiB at about
0.5 ms for both, against 0.11 ms otherwise). With a handful of rounds, one such round
can set a row's median or make a ratio swing by 4x. The rule must not depend on the
implementation under test, or it would excuse our own slowness; so every round times a
fixed CALIBRATION workload (bench/worker.py, calibrate) on every rank, before each case's
measurement and after the last: the same Python and memory work whatever the
implementation. Its wall time rises when the rank loses its core to other processes and
when the machine itself is slow, the two causes of the slow mode.

The rule (is_slow): a round is slow when its worst calibration is more than SLOW_FACTOR
times the baseline, the lower quartile of every calibration reading (before and after)
of every round at the same rank count in this run. Why those choices:
- the worst of before/after, as the slow mode can begin or end during a round;
- the lower quartile of the readings, not the minimum (one lucky reading would mark
  everything) nor the median (if the slow mode hits half the rounds, the median is
  itself slow and nothing would be marked); readings, not each round's worst, as a
  busy machine would otherwise raise the baseline with the very slowness it should
  show; per rank count, because 4 or 8 ranks on 2 cores share the cores even when
  the machine is quiet;
- 1.5x: on a quiet machine the calibration varies by about 10-20% between rounds
  (measured: docs/benchmarks.md, "Reading the rows"); a rank that shares its core with
  one other busy process takes about 2x.
Marked rounds are reported with their times, never dropped silently, and an
implementation whose every round is slow keeps them all (the row then says so).
"""
import statistics

SLOW_FACTOR = 1.5


def quantile(values, q):
    """The q-quantile (0..1) of values, linear between the closest ranks."""
    v = sorted(values)
    if not v:
        raise ValueError("quantile of no values")
    pos = (len(v) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def baseline(calibrations):
    """The healthy machine's calibration time: the lower quartile of every reading, before
    and after, of every round (None when no round carries one)."""
    readings = [v for c in calibrations if c for v in c]
    return quantile(readings, 0.25) if readings else None


def is_slow(calibration, base, factor=SLOW_FACTOR):
    """Whether a round whose calibrations (seconds, before and after) were `calibration`
    ran in the slow mode, against the baseline `base`."""
    if not calibration or base is None:
        return False
    return max(calibration) > factor * base


def summarize(rounds):
    """One implementation's part of a row from its rounds, each a dict with "seconds"
    (samples) and "slow" (bool). Returns median (of the kept rounds' medians), lo and hi
    (their min and max), kept and slow (counts), all_slow (every round was slow, so all
    were kept), and slow_medians (the marked rounds' medians, for the report)."""
    if not rounds:
        raise ValueError("no rounds to summarize")
    meds = [(statistics.median(r["seconds"]), r["slow"]) for r in rounds if r["seconds"]]
    kept = [m for m, slow in meds if not slow]
    slow = [m for m, s in meds if s]
    all_slow = not kept
    use = kept or slow
    return {"median": statistics.median(use), "lo": min(use), "hi": max(use),
            "kept": len(use), "slow": len(slow), "all_slow": all_slow,
            "slow_medians": slow}


def ratio(ours, peer):
    """ours / peer of two summaries' medians."""
    return ours["median"] / peer["median"]
