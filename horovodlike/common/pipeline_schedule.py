"""Pipeline schedules, framework-free: which micro-batch a stage runs forward or backward
next, and which messages that step needs.

A model of L layers is cut into p stages, one per rank of a pipeline; a batch is split
into m micro-batches. Stage s runs F(i) (forward of micro-batch i) and B(i) (its
backward). F(i) on stage s > 0 needs the activation of F(i) on stage s-1; B(i) on stage
s < p-1 needs the gradient of B(i) on stage s+1. Every message is matched by
(src, dst, name), with a name unique to (step, direction, micro-batch), and a send
completes without waiting for its recv, so a stage only ever blocks on the one message
its next action reads: any per-stage order that respects the data dependencies is
deadlock-free, and the two schedules below are such orders.

GPipe: every stage runs F(0) .. F(m-1), then B(m-1) .. B(0) (reversed, so the last
micro-batch's activations, the freshest, are consumed first; any order is correct).
It keeps all m micro-batches' activations alive on every stage.

1F1B (PipeDream-flush): stage s runs w = min(p-1-s, m) warm-up forwards, then
alternates one forward and one backward until forwards run out, then drains the
remaining backwards. A stage never holds more than w+1 = p-s micro-batches' activations
(stage k, 0-based, holds at most p-k), independent of m.

Cost model (tf, tb: one micro-batch's forward and backward time on one stage, equal
stages, messages free): both schedules take (m + p - 1)(tf + tb) per batch against
m(tf + tb) of work, so every stage idles for the bubble fraction

    bubble = (p - 1) / (m + p - 1)          e.g. 11.1% at p=2, m=8; 27.3% at p=4, m=8

and the remedy is m >> p. Activation memory per stage: m micro-batches for GPipe,
p - s for 1F1B (so 1F1B lets m grow without memory). Traffic per batch and stage
boundary: m activations forward and m gradients back, each b/m · (activation size);
against data parallelism's every-gradient allreduce per step this is small.
"""
from dataclasses import dataclass

FORWARD, BACKWARD = "F", "B"


@dataclass(frozen=True)
class Action:
    """One step of a stage's schedule: run `kind` (F or B) on micro-batch `mb`; `recv` is
    the neighbour stage whose message it needs first (None: none), `send` the stage it
    sends its result to afterwards (None: none)."""
    kind: str
    mb: int
    recv: object = None
    send: object = None


def bubble_fraction(p, m):
    """The idle fraction of every stage with equal stages and free messages."""
    check_counts(p, m)
    return (p - 1) / (m + p - 1)


def peak_microbatches(schedule, p, m, stage):
    """How many micro-batches' activations `stage` holds at most under `schedule`."""
    live = peak = 0
    for a in actions(schedule, p, m, stage):
        live += 1 if a.kind == FORWARD else -1
        peak = max(peak, live)
    return peak


def check_counts(p, m):
    if not isinstance(p, int) or isinstance(p, bool) or p < 1:
        raise ValueError(f"pipeline: the number of stages must be a positive int, got {p!r}")
    if not isinstance(m, int) or isinstance(m, bool) or m < 1:
        raise ValueError(f"pipeline: microbatches must be a positive int (m >= 1), got {m!r}")


def _order(schedule, p, m, s):
    if schedule == "gpipe":
        return [(FORWARD, i) for i in range(m)] + [(BACKWARD, i) for i in reversed(range(m))]
    if schedule == "1f1b":
        warm = min(p - 1 - s, m)
        out = [(FORWARD, i) for i in range(warm)]
        for i in range(m - warm):
            out += [(FORWARD, warm + i), (BACKWARD, i)]
        return out + [(BACKWARD, i) for i in range(m - warm, m)]
    raise ValueError(f"pipeline: unknown schedule {schedule!r} (gpipe or 1f1b)")


def actions(schedule, p, m, stage, forward_only=False):
    """The ordered actions of `stage` for one batch. forward_only: F(0) .. F(m-1) (eval)."""
    check_counts(p, m)
    if not 0 <= stage < p:
        raise ValueError(f"pipeline: stage {stage} is not in [0, {p})")
    order = ([(FORWARD, i) for i in range(m)] if forward_only
             else _order(schedule, p, m, stage))
    prev = stage - 1 if stage > 0 else None
    nxt = stage + 1 if stage < p - 1 else None
    return [Action(k, i, prev, nxt) if k == FORWARD else Action(k, i, nxt, prev)
            for k, i in order]


def message_name(step, kind, mb):
    """The p2p name of micro-batch mb's activation (F) or gradient (B) in batch `step`;
    both ends derive it, so a message can only ever match its own recv."""
    return f"pipe.{step}.{'act' if kind == FORWARD else 'grad'}.{mb}"


# ---------------------------------------------------------------- partitions

def partition(n_layers, p, how, weights=None):
    """Cut n_layers into p contiguous non-empty stages; returns the p+1 boundaries
    (stage s holds layers bounds[s] .. bounds[s+1]-1).

    how: "uniform" (equal layer counts, the first n % p stages one more), "parameters"
    (balance `weights`, a number per layer: the cut that minimises the heaviest stage,
    by dynamic programming over the O(p n^2) cuts, exact for the small n of a layer
    list), or a list of the p-1 layer indices where stages 1 .. p-1 begin."""
    if not isinstance(n_layers, int) or n_layers < 1:
        raise ValueError(f"pipeline: the model has no layers ({n_layers!r})")
    if p > n_layers:
        raise ValueError(f"pipeline: {p} stages but only {n_layers} layers; each stage "
                         f"needs at least one layer (use fewer stages or split the layers)")
    if isinstance(how, (list, tuple)):
        cuts = list(how)
        if (len(cuts) != p - 1 or not all(isinstance(c, int) for c in cuts)
                or cuts != sorted(set(cuts)) or (cuts and (cuts[0] < 1 or cuts[-1] >= n_layers))):
            raise ValueError(f"pipeline: partition={how!r} must be {p - 1} increasing layer "
                             f"indices in [1, {n_layers}) where stages 1..{p - 1} begin")
        return [0] + cuts + [n_layers]
    if how == "uniform":
        q, r = divmod(n_layers, p)
        bounds = [0]
        for s in range(p):
            bounds.append(bounds[-1] + q + (1 if s < r else 0))
        return bounds
    if how == "parameters":
        if weights is None or len(weights) != n_layers:
            raise ValueError("pipeline: partition='parameters' needs one weight per layer")
        return _balanced(list(weights), p)
    raise ValueError(f"pipeline: partition must be 'parameters', 'uniform' or a list of cut "
                     f"indices, got {how!r}")


def _balanced(w, p):
    n = len(w)
    pre = [0]
    for x in w:
        pre.append(pre[-1] + x)
    inf = float("inf")
    # best[k][i]: the smallest heaviest stage cutting layers [0, i) into k stages
    best = [[inf] * (n + 1) for _ in range(p + 1)]
    cut = [[0] * (n + 1) for _ in range(p + 1)]
    best[0][0] = 0
    for k in range(1, p + 1):
        for i in range(k, n - (p - k) + 1):
            for j in range(k - 1, i):
                v = max(best[k - 1][j], pre[i] - pre[j])
                if v < best[k][i]:
                    best[k][i], cut[k][i] = v, j
    bounds, i = [n], n
    for k in range(p, 0, -1):
        i = cut[k][i]
        bounds.append(i)
    return bounds[::-1]
