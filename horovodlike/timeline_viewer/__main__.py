"""python -m horovodlike.timeline_viewer PATH... (also the horovodlike-timeline console
script)."""
import sys

from horovodlike.timeline_viewer.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
