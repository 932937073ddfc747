# Where scripts/setup.sh takes the pinned torch from; sourced by it (and by its tests).
#
#     torch_source PIN PIP...   prints one word:
#       default    a machine with CUDA (nvidia-smi lists a GPU, or HOROVODLIKE_TORCH_CUDA=1):
#                  the default index, whose Linux torch is the CUDA build
#       local      no CUDA, and pip finds the pin's CPU build (+cpu) without an index
#                  (a wheel in its --find-links): installed from there, offline
#       cpu-index  no CUDA, and PyTorch's CPU wheel index answers: the pin from there
#       none       no CUDA, no local CPU build, no CPU index: the default index would
#                  bring the CUDA build (several GB), so setup stops and says so
#
# The index is HOROVODLIKE_TORCH_CPU_INDEX (default PyTorch's). The probes cost one
# `pip install --dry-run --no-index` (a few seconds, no network) and one HTTP request
# with a 5 s limit, and run only when the pinned torch is missing.
TORCH_CPU_INDEX="${HOROVODLIKE_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"

has_cuda() {
    [ "${HOROVODLIKE_TORCH_CUDA:-}" = 1 ] && return 0
    command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'
}

local_cpu_build() {   # local_cpu_build PIN PIP...: pip finds PIN's +cpu wheel offline
    local pin=$1; shift
    "$@" install --dry-run --no-index --no-deps --ignore-installed --quiet --report - \
        "$pin" 2>/dev/null | grep -q '"version": *"[^"]*+cpu"'
}

url_answers() {       # url_answers URL: an HTTP answer within 5 s (any status below 400)
    python3 - "$1" <<'PY' >/dev/null 2>&1
import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=5).close()
PY
}

torch_source() {
    local pin=$1; shift
    if has_cuda; then echo default
    elif local_cpu_build "$pin" "$@"; then echo local
    elif url_answers "${TORCH_CPU_INDEX%/}/torch/"; then echo cpu-index
    else echo none
    fi
}
