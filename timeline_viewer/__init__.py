"""``python -m timeline_viewer`` from a source checkout: the viewer is
``horovodlike.timeline_viewer`` (``horovodlike-timeline`` once installed). This alias is
not installed: the wheel holds no top-level package but ``horovodlike``."""
from horovodlike.timeline_viewer import analyze_paths, main  # noqa: F401

__all__ = ["main", "analyze_paths"]
