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
#      KERNEL_ARCHS (default "compute_90"), CARGO_TARGET_DIR (as cargo).
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
# shellcheck disable=SC2086
cargo run --quiet --release -p deltacast-cuda --features cuda --example check_kernels -- $KERNEL_ARCHS

echo "== deltacast-cuda with the GPU path built: the tests that need no GPU; the GPU tests compile"
cargo test --quiet --release -p deltacast-cuda --features cuda --lib
cargo test --quiet --release -p deltacast-cuda --features cuda --test gpu gpu_new_never_panics
cargo test --quiet --release -p deltacast-cuda --features cuda --tests --examples --no-run
