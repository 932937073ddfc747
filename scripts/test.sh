#!/usr/bin/env bash
# Set up, then run the whole test suite (multi-process tests under horovodlikerun and
# mpirun). Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$ROOT/scripts/setup.sh"
cd "$ROOT"
exec python -m pytest -q -p no:cacheprovider "$@" tests
