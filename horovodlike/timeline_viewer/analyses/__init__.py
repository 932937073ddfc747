"""Analyses: each a small pure function over the model (see each module's docstring).

`analyze` runs them all and bundles the results in a `Report` for the renderers.
"""
from dataclasses import dataclass

from .bytes_moved import bytes_moved
from .events import notable
from .fusion import fusion
from .idle import idle
from .phases import phases
from .pipeline import pipeline
from .steps import steps
from .stragglers import stragglers
from .top import top_stragglers

__all__ = ["Report", "analyze", "bytes_moved", "fusion", "idle", "notable", "phases", "pipeline",
           "steps", "stragglers", "top_stragglers"]


@dataclass
class Report:
    timeline: object
    stragglers: object
    steps: object
    phases: dict
    bytes: list
    fusion: object
    idle: dict
    top_rounds: list
    top_pairs: list
    notable: list
    top: int
    pipeline: object = None          # PipelineReport, or None without pipeline messages


def analyze(tl, top=10):
    st = stragglers(tl)
    sp = steps(tl, st)
    rounds, pairs = top_stragglers(tl, st, sp, n=top)
    ref = st.ref_rank if st.ref_rank >= 0 else None
    return Report(timeline=tl, stragglers=st, steps=sp, phases=phases(tl),
                  bytes=bytes_moved(tl, ref), fusion=fusion(tl, ref), idle=idle(tl, top=top),
                  top_rounds=rounds, top_pairs=pairs, notable=notable(tl), top=top,
                  pipeline=pipeline(tl))
