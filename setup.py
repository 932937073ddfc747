import glob
import os
import re

from setuptools import find_packages, setup

with open("horovodlike/__init__.py") as f:
    VERSION = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)
with open("README.md", encoding="utf-8") as f:
    README = f.read()

# The optional integrations, each with what it imports. Lower bounds are the oldest
# versions the code is written for; requirements.txt pins the tested ones.
TORCH = "torch>=2.1"
EXTRAS = {
    "torch": [TORCH],
    "tensorflow": ["tensorflow>=2.16"],          # Keras 3
    "ray": ["ray>=2.9"],
    "spark": ["pyspark>=3.5"],                   # barrier mode's allGather
    "lightning": [TORCH, "pytorch-lightning>=2.0,<3"],
    "viewer": ["matplotlib>=3.5"],               # horovodlike-timeline --png
}

# The engine's sources and headers by folder (engine/core, engine/coll, ...).
ENGINE_FILES = {}
for path in sorted(glob.glob("engine/**/*.[ch]", recursive=True)):
    ENGINE_FILES.setdefault(os.path.dirname(path), []).append(path)

setup(
    name="horovodlike",
    version=VERSION,
    description="Horovod's API (PyTorch, TensorFlow, Keras) on a framework-free C engine",
    long_description=README,
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    license_files=["LICENSE"],
    project_urls={
        # The API horovodlike follows (version 0.28.1).
        "Horovod API reference": "https://horovod.readthedocs.io/en/v0.28.1/",
    },
    keywords=["deep learning", "distributed training", "allreduce", "horovod", "pytorch",
              "tensorflow", "keras"],
    classifiers=[
        "Development Status :: 4 - Beta",
        "Intended Audience :: Developers",
        "Intended Audience :: Science/Research",
        "Operating System :: POSIX :: Linux",
        "Programming Language :: C",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3 :: Only",
        "Programming Language :: Python :: Implementation :: CPython",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "Topic :: System :: Distributed Computing",
    ],
    packages=find_packages(include=["horovodlike", "horovodlike.*"]),
    # The HTML viewer's script and style, read with importlib.resources.
    package_data={"horovodlike.timeline_viewer": ["static/*.js", "static/*.css"]},
    python_requires=">=3.9",
    # PyYAML: horovodlikerun --config-file (Horovod requires it too).
    install_requires=["cffi>=1.15", "numpy", "PyYAML>=5.1"],
    extras_require=EXTRAS,
    cffi_modules=["horovodlike/_build_engine.py:ffibuilder"],
    # The engine's sources and headers travel in the wheel too (<prefix>/share/...).
    data_files=[("share/horovodlike/" + d, files) for d, files in ENGINE_FILES.items()],
    entry_points={"console_scripts": [
        "horovodlikerun = horovodlike.runner.entry:main",
        "horovodlike-timeline = horovodlike.timeline_viewer.__main__:main",
    ]},
    # cffi compiles the extension against the stable ABI (Py_LIMITED_API, the module
    # is _engine.abi3.so), so one wheel serves every CPython from 3.9 on.
    options={"bdist_wheel": {"py_limited_api": "cp39"}},
)
