#!/usr/bin/env bash
# Compile every engine source for aarch64, so code that only builds on x86-64 (an
# architecture builtin outside engine/util/platform.h) fails CI instead of an ARM user's
# install. Objects go to a scratch directory; nothing is linked or run.
#
#     bash scripts/cross_compile.sh
#
# Needs aarch64-linux-gnu-gcc (Debian/Ubuntu: gcc-aarch64-linux-gnu;
# `scripts/setup.sh --test` installs it where apt-get is available). Without it the
# check is skipped, loudly.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CC="${HOROVODLIKE_CROSS_CC:-aarch64-linux-gnu-gcc}"
if ! command -v "$CC" >/dev/null 2>&1; then
    echo "cross-compile: SKIPPED, $CC not found (apt-get install gcc-aarch64-linux-gnu)"
    exit 0
fi
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
# Every folder of the engine on the include path, as in its own build (_build_engine.py).
INCLUDES=()
for dir in $(find "$ROOT/engine" -type d | sort); do
    INCLUDES+=("-I$dir")
done
status=0
for src in $(find "$ROOT/engine" -name '*.c' | sort); do
    obj="$OUT/$(basename "$(dirname "$src")")_$(basename "$src" .c).o"
    "$CC" -c -O2 -std=gnu11 -Wall -Wextra -Wno-unused-parameter -Werror=implicit-function-declaration -fPIC \
        "${INCLUDES[@]}" "$src" -o "$obj" || status=1
done
if [ "$status" -ne 0 ]; then
    echo "cross-compile: the engine does not build for aarch64 (see the errors above)"
    exit 1
fi
echo "cross-compile: every engine source builds for aarch64 ($("$CC" -dumpmachine))"
