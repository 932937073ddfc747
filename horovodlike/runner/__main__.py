"""``python -m horovodlike.runner`` is the same as ``horovodlikerun``."""

import sys

from .launch import main

sys.exit(main())
