"""Colours shared by the PNG and HTML renderers: one per kind of event, so no two
legend entries look alike. Negotiation (NEGOTIATE_<OP>) takes warm colours, one per op;
data movement cool ones."""

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
# One per op the engine negotiates (engine/core/exec.c names them NEGOTIATE_<OP>).
_NEGOTIATE = {
    "NEGOTIATE_ALLREDUCE": NEGOTIATE_COLOR,
    "NEGOTIATE_ALLGATHER": "#d35400",
    "NEGOTIATE_BROADCAST": "#f7dc6f",
    "NEGOTIATE_ALLTOALL": "#a0522d",
    "NEGOTIATE_REDUCESCATTER": "#ff8a65",
    "NEGOTIATE_BARRIER": "#c8a27c",
    "NEGOTIATE_JOIN": "#e59866",
}
_NEGOTIATE_OTHER = ["#ffcc80", "#bf7a30", "#ffab40", "#8d6e63"]   # an op added later
LATE_COLOR = "#d62728"


def color_for(name):
    c = _BY_NAME.get(name)
    if c:
        return c
    if name.startswith("NEGOTIATE_"):
        return _NEGOTIATE.get(name) or _pick(name, _NEGOTIATE_OTHER)
    if name.startswith("MEMCPY"):
        return "#8e6cc2"
    # Algorithm sub-phases and anything else: a stable pick from a teal family.
    return _pick(name, _ALGO)


def _pick(name, family):
    """A stable choice from `family` by the name's hash (not Python's, which varies
    from run to run)."""
    h = 0
    for ch in name:
        h = (h * 31 + ord(ch)) & 0xFFFFFF
    return family[h % len(family)]
