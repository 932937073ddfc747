"""Pipeline bubbles: each rank's idle fraction in pipeline-parallel batches, and the stage
that holds the others up.

A pipeline schedule (horovodlike.torch.pipeline) names its point-to-point messages
"pipe.<batch>.<act|grad|loss|out>.<micro-batch>" and posts each recv only when the
next action needs it, so a RECV span of an activation or gradient is time the stage
waits for its neighbour. The stages are found from the messages: a rank that receives
activations from rank q is the stage after q's.

Per batch, every rank of a pipeline starts together: the schedule opens each batch with a
small allgather of its arguments over the pipeline, so the end of that collective is the
batch's start on each rank's own clock. The batch ends on a rank with its loss message
(the last stage sends the losses after its last backward; the others receive them after
theirs). Only durations on one rank's clock are used (ranks' clocks are aligned to about
a millisecond at best, too coarse for a bubble): the batch's window is the longest
start-to-loss time of its ranks (the first stage's, which runs the last backward), and
a rank's idle time is its activation/gradient RECV time plus the window's part after
its own loss message. The bubble fraction is idle / window, summed over batches. With
equal stages it is (p-1)/(m+p-1) on every rank; the stage with the smallest fraction is
the one the others wait for. The first batch pays one-time costs (the pipeline's
connections, the allocator) and is left out when later ones exist.
"""
import re
from dataclasses import dataclass, field

from ..model import COMPLETE

_NAME = re.compile(r"^p2p\.pipe\.(\d+)\.(act|grad|loss|out)\.?(\d*)$")


@dataclass
class PipelineRank:
    rank: int
    stage: int
    window_us: float = 0.0
    idle_us: float = 0.0

    @property
    def bubble(self):
        return self.idle_us / self.window_us if self.window_us > 0 else 0.0


@dataclass
class PipelineReport:
    ranks: dict                     # rank -> PipelineRank
    stages: int                     # p
    microbatches: int               # m (most seen in a batch)
    batches: int
    bottleneck: int = -1            # rank with the smallest bubble
    notes: list = field(default_factory=list)

    @property
    def ideal(self):
        p, m = self.stages, self.microbatches
        return (p - 1) / (m + p - 1) if m and p else 0.0


def _events(tl):
    """rank -> [(batch, kind, mb, SEND|RECV, peer, start, end)] of the pipeline."""
    out = {}
    for r, rt in tl.ranks.items():
        lst = []
        for i in range(len(rt.t)):
            a = rt.args[i]
            if rt.phase[i] != COMPLETE or not a or "peer" not in a:
                continue
            mt = _NAME.match(str(a.get("name", "")))
            if not mt:
                continue
            what = tl.strings[int(rt.name[i])]
            lst.append((int(mt.group(1)), mt.group(2), int(mt.group(3) or 0), what,
                        int(a["peer"]), float(rt.t[i]), float(rt.t[i] + rt.dur[i])))
        if lst:
            out[r] = lst
    return out


def _starts(tl, batches):
    """rank -> {batch: end of the batch's argument allgather} on the rank's own axis."""
    want = {f"pipeline.{b}.args": b for b in batches}
    out = {}
    for r, rt in tl.ranks.items():
        mine = out.setdefault(r, {})
        for i in range(len(rt.t)):
            a = rt.args[i]
            if rt.phase[i] != COMPLETE or not a or "tensors" not in a:
                continue
            for name in a["tensors"] or ():
                b = want.get(str(name).split("allgather.", 1)[-1])
                if b is not None:
                    mine[b] = max(mine.get(b, 0.0), float(rt.t[i] + rt.dur[i]))
    return out


def pipeline(tl):
    """A PipelineReport, or None when the timeline has no pipeline messages."""
    ev = _events(tl)
    if not ev:
        return None
    prev = {}
    for r, lst in ev.items():
        for b, kind, _, what, peer, _, _ in lst:
            if kind == "act" and what == "RECV":
                prev[r] = peer
    stage = {}
    for r in ev:
        s, q, seen = 0, r, set()
        while q in prev and q not in seen:
            seen.add(q)
            q, s = prev[q], s + 1
        stage[r] = s
    ranks = {r: PipelineRank(rank=r, stage=stage[r]) for r in ev}
    batches = sorted({e[0] for lst in ev.values() for e in lst})
    m = max((e[2] + 1 for lst in ev.values() for e in lst if e[1] == "act"), default=0)
    batches = batches[1:] if len(batches) > 1 else batches
    starts = _starts(tl, batches)
    counted = 0
    for b in batches:
        mine = {r: [e for e in lst if e[0] == b] for r, lst in ev.items()}
        ends = {r: max((e[6] for e in v if e[1] == "loss"), default=None)
                for r, v in mine.items()}
        if any(ends[r] is None or b not in starts.get(r, {}) for r in mine):
            continue                # eval batches and cut-off batches carry no losses
        dur = {r: ends[r] - starts[r][b] for r in mine}
        window = max(dur.values())
        counted += 1
        for r, v in mine.items():
            waits = sum(e[6] - e[5] for e in v if e[3] == "RECV" and e[1] in ("act", "grad"))
            ranks[r].window_us += window
            ranks[r].idle_us += waits + (window - dur[r])
    rep = PipelineReport(ranks=ranks, stages=max(stage.values()) + 1, microbatches=m,
                         batches=counted)
    if counted:
        rep.bottleneck = min(ranks, key=lambda r: (ranks[r].bubble, r))
    else:
        rep.notes.append("no complete training batch (with its loss message) in the timeline")
    return rep
