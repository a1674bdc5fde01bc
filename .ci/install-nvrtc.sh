#!/usr/bin/env bash
# Installs NVRTC, NVIDIA's runtime CUDA C++ compiler, into target/nvrtc-venv so that exec-cuda's tests can prove
# that every kernel we generate compiles, on machines (developers', CI) that have no GPU and no CUDA toolkit.
# NVRTC is a plain CPU library; PyPI ships it as the wheel nvidia-cuda-nvrtc-cu12 (about 90 MB installed).
#
# Usage (the library must be on LD_LIBRARY_PATH before the test process starts: glibc reads it once, at start-up,
# and cudarc dlopens NVRTC by bare soname, with no path or environment variable of its own):
#     eval "$(.ci/install-nvrtc.sh)"          # stdout is only the `export LD_LIBRARY_PATH=...` line
#  or .ci/install-nvrtc.sh && source target/nvrtc-venv/env.sh
#
# Behaviour:
#  - idempotent: when the pinned version is already installed it only prints the export line (well under a second);
#  - never fails the caller: without python3, without the registry, or on any install error it prints
#    "SKIP: ..." to stderr, prints nothing to stdout, and exits 0 (the NVRTC tests then skip and say why);
#  - NVRTC_VENV overrides the venv location.
set -uo pipefail

# 12.8.x matches cudarc's `cuda-12080` feature (the API surface cudarc was generated for).
NVRTC_VERSION="12.8.93"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${NVRTC_VENV:-$ROOT/target/nvrtc-venv}"
STAMP="$VENV/.installed-nvidia-cuda-nvrtc-cu12-$NVRTC_VERSION"
ENV_FILE="$VENV/env.sh"

skip() {
    echo "SKIP: NVRTC not installed: $*" >&2
    exit 0
}

find_lib_dir() {
    local d
    for d in "$VENV"/lib/python3*/site-packages/nvidia/cuda_nvrtc/lib; do
        if [ -e "$d/libnvrtc.so.12" ]; then
            echo "$d"
            return 0
        fi
    done
    return 1
}

emit() {
    local lib_dir="$1"
    # The env file: LD_LIBRARY_PATH for the loader, CUPLAN_NVRTC_LIB_DIR so that tests can tell the user which
    # directory was expected when NVRTC still fails to load.
    cat >"$ENV_FILE" <<ENV
export LD_LIBRARY_PATH="$lib_dir\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export CUPLAN_NVRTC_LIB_DIR="$lib_dir"
ENV
    echo "NVRTC $NVRTC_VERSION: $lib_dir (env file: $ENV_FILE)" >&2
    # Idempotent when evaluated twice in one shell: do not prepend the directory again.
    case ":${LD_LIBRARY_PATH:-}:" in
        *":$lib_dir:"*) echo "export CUPLAN_NVRTC_LIB_DIR=\"$lib_dir\"" ;;
        *) echo "export LD_LIBRARY_PATH=\"$lib_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}\" CUPLAN_NVRTC_LIB_DIR=\"$lib_dir\"" ;;
    esac
}

# Fast path: already installed.
if [ -e "$STAMP" ] && lib_dir="$(find_lib_dir)"; then
    emit "$lib_dir"
    exit 0
fi

case "$(uname -s)-$(uname -m)" in
    Linux-x86_64 | Linux-aarch64) ;;
    *) skip "no nvidia-cuda-nvrtc-cu12 wheel for $(uname -s)-$(uname -m)" ;;
esac
command -v python3 >/dev/null 2>&1 || skip "python3 is not on PATH"

if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV" >&2 || skip "python3 -m venv $VENV failed (is the venv module installed?)"
fi

echo "installing nvidia-cuda-nvrtc-cu12==$NVRTC_VERSION into $VENV ..." >&2
# Short network timeouts so that an unreachable registry costs seconds, not minutes; the wheel has no dependencies.
if ! timeout 900 "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
    --timeout 30 --retries 1 --no-deps "nvidia-cuda-nvrtc-cu12==$NVRTC_VERSION" >&2; then
    skip "pip could not install nvidia-cuda-nvrtc-cu12==$NVRTC_VERSION (registry unreachable?)"
fi

lib_dir="$(find_lib_dir)" || skip "the wheel installed but libnvrtc.so.12 is not under $VENV/lib/python3*/site-packages/nvidia/cuda_nvrtc/lib"
touch "$STAMP"
emit "$lib_dir"
