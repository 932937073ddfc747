#!/usr/bin/env bash
# The GPU machine's check, in one run of well under 10 minutes: install what the machine
# lacks from wheels carried along, build the engine, run tests/test_torch_gpu.py, the GPU
# benchmark (bench/gpu.py) and the size sweep at 2, 4 and 8 ranks (bench/run.py), and
# write every log into OUTDIR.
#
# The command, from the repository root of a copy of the tree that has wheels/ in it, on
# a machine with a CUDA GPU (Python 3.12 with torch CUDA and mpi4py, no network):
#
#     bash scripts/device_check.sh "$OUT"        # $OUT: the folder the logs go to
#
# wheels/ (ignored by git) is filled beforehand on a machine with network:
#
#     pip download cffi==2.1.1 pycparser pytest pytest-timeout setuptools \
#         --only-binary :all: --python-version 3.12 --platform manylinux2014_x86_64 \
#         --platform manylinux_2_17_x86_64 --platform any -d wheels/
#
# Only what is missing is installed, into a temporary folder put on PYTHONPATH, never
# into the machine's Python.
#
# Without a GPU the GPU steps skip by themselves (a check of this script); add --smoke to
# make the size sweep short (2 ranks, a few sizes, one round):
#
#     bash scripts/device_check.sh OUTDIR --smoke
#
# Exit status: 0 when every step passed; otherwise the number of failed steps. OUTDIR
# holds one log per step, and summary.txt lists each step's status and duration.
set -u

OUT=${1:?usage: scripts/device_check.sh OUTDIR [--smoke]}
SMOKE=${2:-}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$ROOT"

PY=${PYTHON:-python3}
BUDGET=${DEVICE_CHECK_SECONDS:-540}      # the whole run; each step gets what is left
SITE=$(mktemp -d)                        # what this run installs
SHIM=$(mktemp -d)                        # a horovodlikerun for a tree that is not installed
trap 'rm -rf "$SITE" "$SHIM"' EXIT
printf '#!/bin/sh\nexec %s -m horovodlike.runner "$@"\n' "$(command -v "$PY")" > "$SHIM/horovodlikerun"
chmod +x "$SHIM/horovodlikerun"
ln -sf "$(command -v "$PY")" "$SHIM/python"
export PATH="$SHIM:$PATH" PYTHONPATH="$ROOT:$SITE" PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

FAILED=0
: > "$OUT/summary.txt"

# step NAME LIMIT_SECONDS COMMAND...: run it with its output in OUTDIR/NAME.log, under the
# smaller of its own limit and what is left of the budget.
step() {
    local name=$1 limit=$2
    shift 2
    local left=$((BUDGET - SECONDS))
    [ "$limit" -gt "$left" ] && limit=$left
    if [ "$limit" -le 5 ]; then
        echo "$name: SKIPPED (no time left of ${BUDGET}s)" | tee -a "$OUT/summary.txt"
        FAILED=$((FAILED + 1))
        return
    fi
    local t0=$SECONDS rc
    echo "== $name (limit ${limit}s): $*" | tee "$OUT/$name.log"
    if declare -F "$1" > /dev/null; then     # a function of this script (exported below)
        set -- bash -c "$*"
    fi
    timeout -k 10 "$limit" "$@" >> "$OUT/$name.log" 2>&1
    rc=$?
    local verdict=ok
    [ $rc -ne 0 ] && verdict="FAILED (exit $rc$([ $rc -eq 124 ] && echo ', timed out'))"
    [ $rc -ne 0 ] && FAILED=$((FAILED + 1))
    echo "$name: $verdict in $((SECONDS - t0))s" | tee -a "$OUT/summary.txt"
}

missing_wheels() {
    "$PY" - <<'EOF'
import importlib.util
need = {"cffi": "cffi", "pycparser": "pycparser", "setuptools": "setuptools",
        "pytest": "pytest", "pytest_timeout": "pytest-timeout"}
print(" ".join(w for m, w in need.items() if importlib.util.find_spec(m) is None))
EOF
}

environment() {
    date -u
    nvidia-smi || echo "nvidia-smi: not available"
    nproc
    "$PY" -c "import sys, torch; print(sys.version); print('torch', torch.__version__,
'cuda', torch.version.cuda, 'available', torch.cuda.is_available(),
'devices', torch.cuda.device_count())"
    "$PY" -c "import mpi4py; print('mpi4py', mpi4py.__version__)" || true
    command -v mpirun && mpirun --version | head -1
    git -C "$ROOT" log --oneline -1 || true
}

install() {
    local need
    need=$(missing_wheels)
    echo "missing: ${need:-nothing}"
    [ -z "$need" ] && return 0
    # shellcheck disable=SC2086
    "$PY" -m pip install --no-index --find-links "$ROOT/wheels" --target "$SITE" $need
}

export -f environment install missing_wheels
export PY SITE ROOT
step environment 30 environment
step install 90 install
step build 180 "$PY" setup.py build_ext --inplace -q
step test_torch_gpu 240 "$PY" -m pytest -q -rs --durations=10 tests/test_torch_gpu.py
step bench_gpu 200 "$PY" bench/gpu.py --np 2 --out "$OUT/bench_gpu.json"
if [ "$SMOKE" = "--smoke" ]; then
    step bench_sizes 300 "$PY" bench/run.py --cases sizes --np 2 --quick --rounds 1 \
        --out "$OUT/bench_sizes.json"
else
    # One alternating round (DEVICE_CHECK_ROUNDS for more) keeps the run well under 10
    # minutes: 3 rank counts x 3 implementations x 6 sizes, each size sampled >= 5 times.
    step bench_sizes 300 "$PY" bench/run.py --cases sizes --np 2,4,8 \
        --rounds "${DEVICE_CHECK_ROUNDS:-1}" --out "$OUT/bench_sizes.json"
fi

echo "total: ${SECONDS}s, $FAILED step(s) failed" | tee -a "$OUT/summary.txt"
exit "$FAILED"
