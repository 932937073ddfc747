"""The framework-free pipeline schedules (horovodlike.common.pipeline_schedule): the
order of each stage's actions, their messages, the activation-memory bound, the cost
model and the partitioner. No launch: the multi-rank runs are in test_torch_pipeline.py."""
import itertools

import pytest

from horovodlike.common import pipeline_schedule as S


def simulate(schedule, p, m, tf=1.0, tb=2.0):
    """Run every stage's actions against their dependencies with free messages; returns
    (makespan, per-stage busy time). Raises if some stage waits for ever (a deadlock)."""
    acts = {s: S.actions(schedule, p, m, s) for s in range(p)}
    done, clock, pos = {}, [0.0] * p, [0] * p
    while any(pos[s] < len(acts[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            if pos[s] == len(acts[s]):
                continue
            a = acts[s][pos[s]]
            dep = None if a.recv is None else (a.recv, a.kind, a.mb)
            if a.kind == S.BACKWARD and a.recv is None:
                dep = (s, S.FORWARD, a.mb)          # the last stage's own forward
            if dep is not None and dep not in done:
                continue
            start = max(clock[s], done.get(dep, 0.0))
            clock[s] = start + (tf if a.kind == S.FORWARD else tb)
            done[(s, a.kind, a.mb)] = clock[s]
            pos[s] += 1
            progressed = True
        assert progressed, f"{schedule} p={p} m={m} deadlocks at {pos}"
    return max(clock), m * (tf + tb)


@pytest.mark.parametrize("schedule,p,m", list(itertools.product(["gpipe", "1f1b"], [1, 2, 3, 4],
                                                                [1, 2, 4, 8])))
def test_every_microbatch_once_no_deadlock_and_the_bubble(schedule, p, m):
    for s in range(p):
        acts = S.actions(schedule, p, m, s)
        assert sorted((a.kind, a.mb) for a in acts) == sorted(
            [(S.FORWARD, i) for i in range(m)] + [(S.BACKWARD, i) for i in range(m)])
        for a in acts:     # forward: from the previous stage, to the next; backward reversed
            fwd = (s - 1 if s else None, s + 1 if s < p - 1 else None)
            assert (a.recv, a.send) == (fwd if a.kind == S.FORWARD else fwd[::-1])
    span, work = simulate(schedule, p, m)
    assert span == pytest.approx((m + p - 1) * 3.0)
    assert 1 - work / span == pytest.approx(S.bubble_fraction(p, m))


@pytest.mark.parametrize("p,m", list(itertools.product([2, 3, 4], [1, 4, 8])))
def test_activation_memory_bound(p, m):
    for s in range(p):
        assert S.peak_microbatches("gpipe", p, m, s) == m
        assert S.peak_microbatches("1f1b", p, m, s) == min(p - s, m)


def test_cost_model_figures_and_names():
    assert round(S.bubble_fraction(2, 8), 3) == 0.111
    assert round(S.bubble_fraction(4, 8), 3) == 0.273
    assert S.message_name(3, S.FORWARD, 5) == "pipe.3.act.5"
    assert S.message_name(3, S.BACKWARD, 5) == "pipe.3.grad.5"
    assert [a.kind + str(a.mb) for a in S.actions("1f1b", 4, 4, 1)] == \
        ["F0", "F1", "F2", "B0", "F3", "B1", "B2", "B3"]
    assert [a.kind + str(a.mb) for a in S.actions("1f1b", 4, 4, 1, forward_only=True)] == \
        ["F0", "F1", "F2", "F3"]


def test_partitions():
    assert S.partition(7, 4, "uniform") == [0, 2, 4, 6, 7]
    assert S.partition(5, 2, [3]) == [0, 3, 5]
    assert S.partition(4, 2, "parameters", [10, 0, 5, 5]) == [0, 1, 4]
    assert S.partition(6, 3, "parameters", [1, 1, 1, 1, 1, 1]) == [0, 2, 4, 6]
    w = [3, 9, 1, 1, 7, 2, 8]
    b = S.partition(len(w), 3, "parameters", w)
    best = min(max(sum(w[i:j]) for i, j in zip(c, c[1:]))
               for c in ([0, x, y, 7] for x in range(1, 6) for y in range(x + 1, 7)))
    assert max(sum(w[i:j]) for i, j in zip(b, b[1:])) == best


@pytest.mark.parametrize("args,words", [
    ((3, 4, "uniform"), "4 stages but only 3 layers"),
    ((5, 2, [0]), "increasing layer indices in [1, 5)"),
    ((5, 3, [3, 2]), "2 increasing layer indices"),
    ((5, 2, "balanced"), "partition must be"),
])
def test_partition_errors(args, words):
    with pytest.raises(ValueError, match=None) as e:
        S.partition(*args)
    assert words in str(e.value)


@pytest.mark.parametrize("m", [0, -1, 1.5, True])
def test_microbatches_must_be_positive(m):
    with pytest.raises(ValueError, match="m >= 1"):
        S.actions("1f1b", 2, m, 0)
