#!/usr/bin/env bash
# Set up, then train a small model on 2 ranks with horovodlikerun and say what happened.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$ROOT/scripts/setup.sh"
cd "$ROOT"
echo "demo: horovodlikerun -np 2 python examples/numpy_digits.py"
horovodlikerun -np 2 python examples/numpy_digits.py
