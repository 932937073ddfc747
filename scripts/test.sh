#!/usr/bin/env bash
# Set up, then run the whole test suite (multi-process tests under horovodlikerun and
# mpirun). Extra arguments go to pytest. With no arguments, the linters then run
# (scripts/lint.sh), the multi-rank tests of every data path run once more against an
# engine built with ASan and UBSan (scripts/sanitize.sh), the engine's include boundaries
# are checked (scripts/check_boundaries.sh), and the engine is compiled for aarch64
# (scripts/cross_compile.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$ROOT/scripts/setup.sh" --test
cd "$ROOT"
python -m pytest -q -p no:cacheprovider "$@" tests
if [ "$#" -eq 0 ]; then
    bash "$ROOT/scripts/lint.sh"
    echo "test: the engine under AddressSanitizer and UndefinedBehaviorSanitizer"
    bash "$ROOT/scripts/sanitize.sh"
    bash "$ROOT/scripts/check_boundaries.sh"
    bash "$ROOT/scripts/cross_compile.sh"
fi
