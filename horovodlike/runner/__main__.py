"""``python -m horovodlike.runner`` is the same as ``horovodlikerun``."""

import sys

from .entry import main

sys.exit(main())
