"""cffi build script for the C engine (out-of-line API mode).

The declarations come from engine/include/horovodlike.h itself, between its CDEF markers, so
the C header is the single source of every constant Python sees. No framework headers
are involved: one build serves every PyTorch and TensorFlow version.
"""
import glob
import os
import sys

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
ENGINE = os.path.join(os.path.dirname(HERE), "engine")
# The engine's folders (docs/how-it-works.md, "The tree"). Every one is on the include
# path of the engine's own build; scripts/check_boundaries.sh narrows it for coll/.
ENGINE_DIRS = ["include", "util", "core", "control", "control/segment", "transport", "p2p",
               "coll"]
PUBLIC_HEADER = os.path.join(ENGINE, "include", "horovodlike.h")


def engine_sources():
    """Every engine source file, absolute paths, sorted."""
    return sorted(p for d in ENGINE_DIRS for p in glob.glob(os.path.join(ENGINE, d, "*.c")))


def engine_include_dirs():
    return [os.path.join(ENGINE, d) for d in ENGINE_DIRS]


def _cdef_text():
    with open(PUBLIC_HEADER) as f:
        text = f.read()
    return text.split("/* CDEF-BEGIN */", 1)[1].split("/* CDEF-END */", 1)[0]


# The engine's compiler flags; tests/test_c_engine.py builds the C tests with them too.
COMPILE_FLAGS = ["-O3", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter"]
# HOROVODLIKE_SANITIZE=1 builds a checking engine (scripts/sanitize.sh): every
# out-of-bounds access, use after free and undefined behaviour aborts loudly.
SANITIZE_FLAGS = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer",
                  "-fno-sanitize-recover=undefined", "-g"]
_SANITIZE = SANITIZE_FLAGS if os.environ.get("HOROVODLIKE_SANITIZE") == "1" else []

def make_builder(absolute=False):
    """The cffi builder. setup.py needs source paths relative to the repo root (it runs
    there); a build into another directory (cffi changes into it) needs absolute ones."""
    root = os.path.dirname(HERE)
    path = (lambda p: p) if absolute else (lambda p: os.path.relpath(p, root))
    builder = FFI()
    builder.cdef(_cdef_text())
    builder.set_source(
        "horovodlike._engine",
        '#include "horovodlike.h"',
        sources=[path(p) for p in engine_sources()],
        include_dirs=[path(d) for d in engine_include_dirs()],
        extra_compile_args=COMPILE_FLAGS + ["-fvisibility=hidden"] + _SANITIZE,
        extra_link_args=_SANITIZE,
        libraries=["pthread"],
    )
    return builder


ffibuilder = make_builder()

if __name__ == "__main__":
    # python horovodlike/_build_engine.py [OUT_DIR]: OUT_DIR/horovodlike/_engine*.so
    if len(sys.argv) > 1:
        make_builder(absolute=True).compile(tmpdir=sys.argv[1], verbose=True)
    else:
        ffibuilder.compile(verbose=True)
