#!/usr/bin/env bash
# Build the engine with AddressSanitizer and UndefinedBehaviorSanitizer, and run real
# multi-rank jobs on that build, so that an out-of-bounds access or undefined behaviour
# anywhere in the engine (the hostile-peer tests send it malformed frames on purpose)
# fails loudly instead of passing by luck.
#
#   bash scripts/sanitize.sh                 # the default selection below
#   bash scripts/sanitize.sh tests/test_x.py -k name      # any pytest arguments
#
# The sanitized build lives in a temporary copy of the package (the checkout's own build
# is untouched). Python itself is not instrumented, so libasan is preloaded and leak
# checking is off (the interpreter keeps memory until exit by design). A report stops
# the process that made it (ASan aborts, UBSan exits 1): a rank's report fails its test
# (the tests check every rank's exit status), and one in pytest's own process (the
# engine called in-process) ends the run, its report on stderr (captured at sys level
# only, so C-level output passes through). Exit status: pytest's.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-}
if [ -z "$PY" ]; then
    if [ -x "$REPO/.venv/bin/python" ]; then PY=$REPO/.venv/bin/python; else PY=$(command -v python || command -v python3); fi
fi
CC=${CC:-gcc}
LIBASAN=$("$CC" -print-file-name=libasan.so)
[ -f "$LIBASAN" ] || { echo "sanitize.sh: $CC has no libasan.so (install gcc's sanitizer runtime)" >&2; exit 2; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/hvdl-sanitize.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/logs"   # the build log
# the package, the engine sources and the tests (tests find the package next to them)
tar -C "$REPO" --exclude='*.so' --exclude='*.o' --exclude='__pycache__' -cf - \
    engine horovodlike tests timeline_viewer pyproject.toml | tar -C "$WORK" -xf -

echo "== building the engine with -fsanitize=address,undefined"
(cd "$WORK" &&
 CFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g" \
 LDFLAGS="-fsanitize=address,undefined" \
 "$PY" horovodlike/_build_engine.py > "$WORK/logs/build.txt" 2>&1) ||
    { tail -40 "$WORK/logs/build.txt"; exit 2; }
SO=$(find "$WORK" -maxdepth 2 -name '_engine*.so' | head -1)
[ -n "$SO" ] || { echo "sanitize.sh: the build made no _engine*.so"; tail -20 "$WORK/logs/build.txt"; exit 2; }
[ "$(dirname "$SO")" = "$WORK/horovodlike" ] || mv "$SO" "$WORK/horovodlike/"

if [ $# -eq 0 ]; then
    set -- tests/test_engine_hostile.py \
        "tests/test_collectives.py::test_allreduce_every_dtype_and_op_matches_numpy" \
        "tests/test_collectives.py::test_allgather_variable_first_dimension" \
        "tests/test_collectives.py::test_broadcast_from_every_root_and_barrier" \
        "tests/test_collectives.py::test_fake_hosts_topology_and_collectives" \
        -k "not mpirun"
fi

echo "== running: pytest $*"
export LD_PRELOAD="$LIBASAN${LD_PRELOAD:+ $LD_PRELOAD}"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:allocator_may_return_null=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export PYTHONPATH="$WORK${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$(dirname "$PY"):$PATH"
cd "$WORK"
"$PY" -c "import horovodlike._engine as m; assert m.__file__.startswith('$WORK'), m.__file__"
set +e
"$PY" -m pytest -q -p no:cacheprovider --capture=sys "$@"
status=$?
set -e
[ $status -eq 0 ] && echo "== passed with the sanitized engine"
exit $status
