#!/usr/bin/env bash
# Build the engine with AddressSanitizer and UndefinedBehaviorSanitizer and run the
# multi-rank tests of every data path against it. Any out-of-bounds access, use after
# free or undefined behaviour in the engine aborts the rank, and the test fails.
#
#     bash scripts/sanitize.sh [pytest args]
#
# The checking engine lives in a scratch copy of the package; the checkout's own build
# is untouched. Leak checking is off: the Python interpreter itself is not leak-clean.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$ROOT/scripts/setup.sh" --test >/dev/null
OUT="$(mktemp -d)"
trap 'cd /; rm -rf "$OUT"' EXIT
cp -r "$ROOT/horovodlike" "$OUT/"
rm -f "$OUT"/horovodlike/_engine*.so
(cd "$ROOT" && HOROVODLIKE_SANITIZE=1 python horovodlike/_build_engine.py "$OUT" >"$OUT/build.log" 2>&1) \
    || { tail -40 "$OUT/build.log"; exit 1; }
rm -f "$ROOT"/horovodlike/_engine.c "$ROOT"/horovodlike/_engine.o
ls "$OUT"/horovodlike/_engine*.so >/dev/null
export LD_PRELOAD="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:allocator_may_return_null=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export PYTHONPATH="$OUT"
export HOROVODLIKE_TEST_SANITIZED=1
# Run from the scratch copy, so neither the checkout nor its editable install shadows it.
cd "$OUT"
python -c "import horovodlike._engine as e; assert e.__file__.startswith('$OUT'), e.__file__"
if [ "$#" -eq 0 ]; then
    set -- tests/test_collectives.py tests/test_data_paths.py tests/test_security.py \
        tests/test_engine_hostile.py tests/test_negotiate_nodes.py tests/test_p2p.py
fi
args=()
for a in "$@"; do
    case "$a" in tests/*) args+=("$ROOT/$a") ;; *) args+=("$a") ;; esac
done
python -m pytest -q -p no:cacheprovider -n "${HOROVODLIKE_TEST_WORKERS:-3}" --dist load \
    --rootdir "$ROOT" "${args[@]}"
