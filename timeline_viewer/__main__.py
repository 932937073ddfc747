"""python -m timeline_viewer PATH... (also the horovodlike-timeline console script)."""
import sys

from timeline_viewer.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
