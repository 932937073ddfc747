import glob
import re

from setuptools import find_packages, setup

with open("horovodlike/__init__.py") as f:
    VERSION = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)

setup(
    name="horovodlike",
    version=VERSION,
    description="Horovod's API on a framework-free C engine",
    packages=find_packages(include=["horovodlike", "horovodlike.*", "timeline_viewer",
                                    "timeline_viewer.*"]),
    # The HTML viewer's script and style, read with importlib.resources.
    package_data={"timeline_viewer": ["static/*.js", "static/*.css"]},
    python_requires=">=3.9",
    install_requires=["cffi>=1.15", "numpy"],
    setup_requires=["cffi>=1.15"],
    cffi_modules=["horovodlike/_build_engine.py:ffibuilder"],
    # The engine's sources and headers travel in the wheel too (<prefix>/share/...).
    data_files=[("share/horovodlike/engine", sorted(glob.glob("engine/*.[ch]")))],
    entry_points={"console_scripts": [
        "horovodlikerun = horovodlike.runner.entry:main",
        "horovodlike-timeline = timeline_viewer.__main__:main",
    ]},
)
