"""Colours shared by the PNG and HTML renderers: one per kind of event."""

_BY_NAME = {
    "QUEUE": "#9e9e9e",
    "MEMCPY_IN_FUSION_BUFFER": "#8e6cc2",
    "MEMCPY_OUT_FUSION_BUFFER": "#b39ddb",
    "ALLREDUCE": "#1f77b4",
    "ALLGATHER": "#2ca02c",
    "BROADCAST": "#17becf",
    "ALLTOALL": "#bcbd22",
    "REDUCESCATTER": "#8c564b",
    "BARRIER": "#7f7f7f",
    "JOIN": "#e377c2",
    "ERROR": "#d62728",
    "STEP": "#444444",
    "CYCLE_START": "#bbbbbb",
    "TIMELINE_TRUNCATED": "#d62728",
}
_ALGO = ["#4db6ac", "#00897b", "#80cbc4", "#26a69a", "#009688", "#b2dfdb"]
NEGOTIATE_COLOR = "#f5b041"
LATE_COLOR = "#d62728"


def color_for(name):
    c = _BY_NAME.get(name)
    if c:
        return c
    if name.startswith("NEGOTIATE_"):
        return NEGOTIATE_COLOR
    if name.startswith("MEMCPY"):
        return "#8e6cc2"
    # Algorithm sub-phases and anything else: a stable pick from a teal family.
    h = 0
    for ch in name:
        h = (h * 31 + ord(ch)) & 0xFFFFFF
    return _ALGO[h % len(_ALGO)]
