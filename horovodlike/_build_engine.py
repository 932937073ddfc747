"""cffi build script for the C engine (out-of-line API mode).

The declarations come from engine/horovodlike.h itself, between its CDEF markers, so
the C header is the single source of every constant Python sees. No framework headers
are involved: one build serves every PyTorch and TensorFlow version.
"""
import glob
import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
ENGINE = os.path.join(os.path.dirname(HERE), "engine")


def _cdef_text():
    with open(os.path.join(ENGINE, "horovodlike.h")) as f:
        text = f.read()
    return text.split("/* CDEF-BEGIN */", 1)[1].split("/* CDEF-END */", 1)[0]


ffibuilder = FFI()
ffibuilder.cdef(_cdef_text())
ffibuilder.set_source(
    "horovodlike._engine",
    '#include "horovodlike.h"',
    # Relative paths: setuptools requires them, and setup.py runs from the repo root.
    sources=sorted(os.path.relpath(p, os.path.dirname(HERE))
                   for p in glob.glob(os.path.join(ENGINE, "*.c"))),
    include_dirs=["engine"],
    extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter",
                        "-fvisibility=hidden"],
    libraries=["pthread"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
