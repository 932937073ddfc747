#!/usr/bin/env bash
# Set up, then train a small model on 2 ranks with horovodlikerun and say what happened.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$ROOT/scripts/setup.sh"
cd "$ROOT"
TRACE="$(mktemp -d)/timeline.json"
echo "demo: HOROVOD_TIMELINE=$TRACE horovodlikerun -np 2 python examples/pytorch_digits.py --epochs 10"
HOROVOD_TIMELINE="$TRACE" horovodlikerun -np 2 python examples/pytorch_digits.py --epochs 10
echo
echo "demo: where the time went (python -m timeline_viewer $TRACE --brief)"
python -m timeline_viewer "$TRACE" --brief
