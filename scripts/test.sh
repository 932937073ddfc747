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
# Three workers (pytest-xdist) on two cores: about half of a serial run is ranks waiting
# out a timeout they are tested against, so other tests fill the idle cores. Tests are
# handed out one by one (--dist load): pytest 9 ignores xdist's group marks, and whole
# modules per worker would leave the slowest module running alone at the end.
# HOROVODLIKE_TEST_WORKERS=0 runs the suite serially.
python -m pytest -q -p no:cacheprovider -n "${HOROVODLIKE_TEST_WORKERS:-3}" --dist load \
    "$@" tests
if [ "$#" -eq 0 ]; then
    bash "$ROOT/scripts/lint.sh"
    echo "test: the engine under AddressSanitizer and UndefinedBehaviorSanitizer"
    bash "$ROOT/scripts/sanitize.sh"
    bash "$ROOT/scripts/check_boundaries.sh"
    bash "$ROOT/scripts/cross_compile.sh"
fi
