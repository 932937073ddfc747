"""Viewer for the per-rank timelines horovodlike writes (HOROVOD_TIMELINE).

    horovodlike-timeline timeline.json [--html t.html] [--png t.png] [--merged m.json]

Pipeline: load (parse, tolerate cut-off files, intern names) -> model (every rank on
one time axis) -> analyses (stragglers, steps, phases, bytes, fusion, idle gaps, top-N)
-> renderers (text, HTML, PNG, merged Chrome trace). See docs/timeline.md.
"""


def main(argv=None):
    """Run the command line with `argv` (default sys.argv[1:]); returns the exit code."""
    from .cli import main as _main
    return _main(argv)


def analyze_paths(paths, top=10):
    """Paths -> analyses.Report, for use from Python."""
    from .analyses import analyze
    from .model import open_timeline
    return analyze(open_timeline(paths), top=top)


__all__ = ["main", "analyze_paths"]
