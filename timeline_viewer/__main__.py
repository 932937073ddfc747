"""python -m timeline_viewer PATH... (a source checkout's alias of horovodlike-timeline)."""
import sys

from horovodlike.timeline_viewer.cli import main

if __name__ == "__main__":
    sys.exit(main())
