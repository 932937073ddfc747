"""Command line: horovodlike-timeline PATH... [--html F] [--png F] [--merged F]."""
import argparse
import os
import sys

from .load import TraceError


def build_parser():
    p = argparse.ArgumentParser(
        prog="horovodlike-timeline",
        description="Read the per-rank timelines a horovodlike job wrote "
                    "(HOROVOD_TIMELINE) and say which rank is late, on what, and where "
                    "the time goes.")
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="the base path given to HOROVOD_TIMELINE (timeline.json finds "
                        "timeline.rank*.json), rank files, or a directory")
    p.add_argument("--html", metavar="OUT.html",
                   help="write one self-contained interactive HTML page")
    p.add_argument("--png", metavar="OUT.png", help="write a swim-lane picture")
    p.add_argument("--merged", metavar="OUT.json",
                   help="write one Chrome/Perfetto trace with every rank (pid = rank)")
    p.add_argument("--text", nargs="?", const="-", default="-", metavar="OUT.txt",
                   help="write the text summary to a file instead of stdout")
    p.add_argument("--brief", action="store_true",
                   help="print only the first paragraph: who is late and where the time goes")
    p.add_argument("--quiet", "-q", action="store_true",
                   help="print no summary (only write the files asked for)")
    p.add_argument("--top", type=int, default=10, metavar="N",
                   help="rows in the top-N tables (default 10)")
    return p


def _have_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.top < 1:
        print("horovodlike-timeline: --top must be at least 1", file=sys.stderr)
        return 2
    if args.png and not _have_matplotlib():
        # Said before the traces are read, which can take a while.
        print("horovodlike-timeline: --png needs matplotlib, which is not installed "
              "(pip install matplotlib, or the horovodlike[viewer] extra); --html "
              "needs nothing more", file=sys.stderr)
        return 2
    from .analyses import analyze
    from .model import open_timeline
    try:
        tl = open_timeline(args.paths)
    except (TraceError, OSError) as exc:
        print(f"horovodlike-timeline: {exc}", file=sys.stderr)
        return 2
    if not tl.ranks:
        print("horovodlike-timeline: no events found", file=sys.stderr)
        return 2
    rep = analyze(tl, top=args.top)

    if not args.quiet:
        from .render_text import render_text
        text = render_text(rep, brief=args.brief)
        if args.text == "-":
            try:
                sys.stdout.write(text)
                sys.stdout.flush()
            except BrokenPipeError:            # `... | head`: the reader has enough
                try:
                    sys.stdout = open(os.devnull, "w")
                except OSError:
                    pass
        else:
            with open(args.text, "w") as f:
                f.write(text)
            print(f"wrote {args.text}", file=sys.stderr)
    if args.merged:
        from .render_merged import render_merged
        render_merged(tl, args.merged)
        print(f"wrote {args.merged}", file=sys.stderr)
    if args.png:
        from .render_png import render_png
        render_png(rep, args.png)
        print(f"wrote {args.png}", file=sys.stderr)
    if args.html:
        from .render_html import render_html
        render_html(rep, args.html)
        print(f"wrote {args.html}", file=sys.stderr)
    return 0
