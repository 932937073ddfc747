#!/usr/bin/env bash
# The engine's include boundaries, checked by the compiler (docs/how-it-works.md, "The
# tree"). An algorithm sees only its context: every file of engine/coll/ must compile
# with nothing but coll/, transport/ (whose transport.h is the exchange and the segment),
# util/ and the public include/ on the include path. An algorithm that includes an engine
# header (engine.h, loop.h, a control/ header, or transport/'s net.h, which needs
# engine.h) then fails here with "No such file". util/ is the bottom: it compiles with
# itself and include/ alone; so does p2p/p2p_frames.c, with its own header. Syntax only:
# seconds.
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
# FOLDER may name one file instead (folder/file.c).
check() {
    local folder="$1"; shift
    local includes=()
    for dir in "$@"; do includes+=("-I$ENGINE/$dir"); done
    local sources=("$ENGINE/$folder"/*.c)
    [[ "$folder" == *.c ]] && sources=("$ENGINE/$folder")
    for src in "${sources[@]}"; do
        if ! "$CC" "${FLAGS[@]}" "${includes[@]}" "$src"; then
            echo "check_boundaries: ${src#"$ROOT"/} reaches outside $* (see above)" >&2
            status=1
        fi
    done
}

check util include util
check coll include util transport coll
# The point-to-point frames' checks are pure (bytes in, a reason out): p2p_frames.c
# compiles with its own header and the public one, so it cannot reach the engine
# (p2p_internal.h needs core/ and transport/).
check p2p/p2p_frames.c include p2p
if [ "$status" -ne 0 ]; then
    echo "check_boundaries: FAILED: move what the file needs into coll/context.h or" \
         "transport/transport.h, or do the work on the engine's side (core/exec.c);" \
         "a p2p frame check takes the bytes, never the engine" >&2
    exit 1
fi
echo "check_boundaries: coll/, util/ and p2p/p2p_frames.c stay inside their boundaries"
