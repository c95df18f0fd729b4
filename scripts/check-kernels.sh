#!/usr/bin/env bash
# Compile-checks every GPU kernel (crates/deltacast-cuda/kernels/*.cu) with NVRTC, no GPU needed.
#
# Installs NVIDIA's NVRTC wheel from PyPI into a venv under target/ (once; reused afterwards),
# points deltacast-cuda at its libnvrtc.so through DELTACAST_NVRTC_PATH, and runs the crate's
# `check_kernels` example, which compiles each kernel file exactly as the GPU path does at run
# time (same prelude, same options) to PTX for the given virtual architectures. Exits 0 when every
# kernel compiles; otherwise prints NVRTC's log and exits non-zero. Then, with the GPU path
# built, runs the crate's tests that need no GPU (protocol, NCCL loader, Gpu::new's error) and
# compiles the GPU test binaries; a cuda build fails a GPU test without a GPU, so those run on
# the GPU machine (scripts/gpu-tests.sh).
#
# Env: NVRTC_VERSION (default 13.0.88, the CUDA of the project's H200 machines),
#      KERNEL_ARCHS (default "compute_90"), CARGO_TARGET_DIR (as cargo),
#      KERNEL_RESOURCES=1: also assemble the PTX for sm_90 with ptxas from NVIDIA's nvcc wheel
#      (installed into the same venv when asked) and print each kernel's registers, stack, spill
#      stores and shared memory, what the GPU machine reports, with no GPU (then stop).
set -euo pipefail
cd "$(dirname "$0")/.."

NVRTC_VERSION=${NVRTC_VERSION:-13.0.88}
KERNEL_ARCHS=${KERNEL_ARCHS:-compute_90}
VENV=target/nvrtc-venv-$NVRTC_VERSION

if ! ls "$VENV"/lib/python*/site-packages/nvidia >/dev/null 2>&1; then
    echo "== installing nvidia-cuda-nvrtc==$NVRTC_VERSION into $VENV"
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
        "nvidia-cuda-nvrtc==$NVRTC_VERSION"
fi

LIB=$(find "$VENV" -name 'libnvrtc.so*' ! -name '*builtins*' | sort | head -n 1)
if [ -z "$LIB" ]; then
    echo "check-kernels: no libnvrtc.so inside $VENV" >&2
    exit 1
fi
echo "== NVRTC: $LIB"
export DELTACAST_NVRTC_PATH=$PWD/$LIB
# libnvrtc loads libnvrtc-builtins from its own folder.
export LD_LIBRARY_PATH=$PWD/$(dirname "$LIB")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

echo "== compiling kernels for $KERNEL_ARCHS"
if [ "${KERNEL_RESOURCES:-0}" = 1 ]; then
    if ! ls "$VENV"/lib/python*/site-packages/nvidia/cu*/bin/ptxas >/dev/null 2>&1; then
        echo "== installing nvidia-cuda-nvcc==$NVRTC_VERSION into $VENV (for ptxas)"
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
            "nvidia-cuda-nvcc==$NVRTC_VERSION"
    fi
    PTXAS=$(find "$VENV" -path '*/bin/ptxas' | head -n 1)
    PTX_DIR=$(mktemp -d)
    KERNEL_PTX_DIR=$PTX_DIR cargo run --quiet --release -p deltacast-cuda --features cuda \
        --example check_kernels -- compute_90
    for ptx in "$PTX_DIR"/*.ptx; do
        echo "== $(basename "$ptx" .compute_90.ptx).cu on sm_90 (ptxas -v)"
        "$PTXAS" -arch=sm_90 -v "$ptx" -o /dev/null 2>&1 | awk '
            /Compiling entry function/ { name = $7; gsub(/\047/, "", name) }
            /spill stores/ { spill = $1 " bytes stack, " $5 " bytes spill stores" }
            /Used [0-9]+ registers/ {
                smem = "0"; for (i = 1; i <= NF; i++) if ($i == "smem") smem = $(i - 2) " bytes smem"
                printf "  %-28s %3d registers, %s, %s\n", name, $5, spill, smem
            }'
    done
    rm -rf "$PTX_DIR"
    exit 0
fi
# shellcheck disable=SC2086
cargo run --quiet --release -p deltacast-cuda --features cuda --example check_kernels -- $KERNEL_ARCHS

echo "== deltacast-cuda with the GPU path built: the tests that need no GPU; the GPU tests compile"
cargo test --quiet --release -p deltacast-cuda --features cuda --lib
cargo test --quiet --release -p deltacast-cuda --features cuda --test gpu gpu_new_never_panics
cargo test --quiet --release -p deltacast-cuda --features cuda --tests --examples --no-run
