#!/usr/bin/env bash
# The engine's include boundaries, checked by the compiler (docs/how-it-works.md, "The
# tree"). An algorithm sees only its context: every file of engine/coll/ must compile
# with nothing but coll/, transport/ (whose transport.h is the exchange and the segment),
# util/ and the public include/ on the include path. An algorithm that includes an engine
# header (engine.h, loop.h, a control/ header, or transport/'s net.h, which needs
# engine.h) then fails here with "No such file". util/ is the bottom: it compiles with
# itself and include/ alone. Syntax only: seconds.
#
#     bash scripts/check_boundaries.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ENGINE="$ROOT/engine"
CC="${CC:-gcc}"
FLAGS=(-fsyntax-only -std=gnu11 -Wall -Wextra -Wno-unused-parameter
       -Werror=implicit-function-declaration)
status=0

# check FOLDER ALLOWED...: every .c of FOLDER with only the ALLOWED folders' headers.
check() {
    local folder="$1"; shift
    local includes=()
    for dir in "$@"; do includes+=("-I$ENGINE/$dir"); done
    for src in "$ENGINE/$folder"/*.c; do
        if ! "$CC" "${FLAGS[@]}" "${includes[@]}" "$src"; then
            echo "check_boundaries: ${src#"$ROOT"/} reaches outside $* (see above)" >&2
            status=1
        fi
    done
}

check util include util
check coll include util transport coll
if [ "$status" -ne 0 ]; then
    echo "check_boundaries: FAILED: move what the file needs into coll/context.h or" \
         "transport/transport.h, or do the work on the engine's side (core/exec.c)" >&2
    exit 1
fi
echo "check_boundaries: coll/ and util/ stay inside their boundaries"
