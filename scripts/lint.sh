#!/usr/bin/env bash
# The style the tools keep: ruff over the Python (its rules are in pyproject.toml) and
# clang-format over the C of the engine and its tests (.clang-format). Both are pinned in
# requirements.txt as [test] packages; scripts/test.sh runs this with no arguments.
#
#     bash scripts/lint.sh
#
# A C file that differs from .clang-format fails the check: run `clang-format -i` on it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

for tool in ruff clang-format; do
    command -v "$tool" >/dev/null 2>&1 || {
        echo "lint: $tool not found; '. scripts/setup.sh --test' installs it" >&2; exit 2; }
done

echo "lint: ruff check"
ruff check --quiet .

# Every C file below engine/ and tests/c/, at any depth.
mapfile -t C_FILES < <(find engine tests/c -name '*.[ch]' | sort)
echo "lint: clang-format --dry-run --Werror (${#C_FILES[@]} files)"
clang-format --dry-run --Werror "${C_FILES[@]}"
echo "lint: passed"
