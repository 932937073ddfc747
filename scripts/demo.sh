#!/usr/bin/env bash
# Set up, then train a small model on 2 ranks with horovodlikerun and say what happened.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
set --                      # setup.sh takes no options here: the library and the demo
. "$ROOT/scripts/setup.sh"
cd "$ROOT"
WORK="$(mktemp -d)"
TRACE="$WORK/timeline.json"
echo "demo: HOROVOD_TIMELINE=$TRACE horovodlikerun -np 2 python examples/pytorch_digits.py --epochs 10"
HOROVOD_TIMELINE="$TRACE" horovodlikerun -np 2 python examples/pytorch_digits.py --epochs 10 \
    --checkpoint-dir "$WORK/checkpoints"
echo
echo "demo: where the time went (horovodlike-timeline $TRACE --brief)"
python -m horovodlike.timeline_viewer "$TRACE" --brief
