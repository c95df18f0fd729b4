#!/usr/bin/env bash
# The GPU test suites, in two halves: `build` here (a machine with Rust), `run` on the GPU
# machine (no Rust there), carrying the built folder.
#
#   scripts/gpu-tests.sh build [DIR]   # default DIR .devbin: the test binaries of
#                                      # crates/deltacast-cuda (tests/gpu.rs, gpu_apply.rs, gpu_entropy.rs, gpu_convert.rs, gpu_steps.rs, gpu_sync.rs,
#                                      # tests/gpu_sharded.rs, tests/gpu_frames.rs, tests/ipc_auth.rs)
#                                      # and its gpu_bench example (scripts/gpu-profile.sh),
#                                      # built with --features cuda, and the Python wheel in .whl/
#   scripts/gpu-tests.sh run [DIR]     # on the GPU machine: both binaries one test at a time,
#                                      # then bindings/python/tests/test_cuda.py, test_cuda_fp8.py and test_cuda_engine.py
#                                      # against the wheel
#
# `run` needs the machine's NVRTC (found in torch's venv, /opt/torch/.venv, or through
# DELTACAST_NVRTC_PATH) and sets DELTACAST_REQUIRE_GPU=1, so a missing GPU is a failure, not a
# skip; tests/gpu_sync.rs, tests/gpu_sharded.rs and test_cuda.py need two GPUs (with one, only
# their CUDA-IPC tests run, and the script says so); tests/gpu_frames.rs one. NVLink multicast stays off
# (NCCL_NVLS_ENABLE=0 and friends, a rule of the lent machines). Logs go to $OUT (the device
# tool's folder) when set, else ./gpu-tests-out. Exit status 0 only when every suite passed.
set -uo pipefail
cd "$(dirname "$0")/.."

mode=${1:-}
dir=${2:-.devbin}

case "$mode" in
build)
    set -e
    mkdir -p "$dir"
    target=${CARGO_TARGET_DIR:-target/gpu-tests}
    CARGO_TARGET_DIR=$target cargo test -p deltacast-cuda --features cuda --release --no-run \
        --message-format=json 2>/dev/null |
        python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in ("gpu", "gpu_apply", "gpu_entropy", "gpu_convert", "gpu_steps", "gpu_sync", "gpu_sharded", "gpu_frames", "ipc_auth", "gpu_bench"):
        print(m["target"]["name"], m["executable"])
' | while read -r name exe; do
        cp "$exe" "$dir/$name"
        strip "$dir/$name" 2>/dev/null || true
        echo "gpu-tests: $dir/$name"
    done
    py=${PYTHON:-python3}
    rm -f .whl/deltacast-*.whl
    CARGO_TARGET_DIR=target/python "$py" -m pip wheel --no-deps -q ./bindings/python -w .whl
    ls .whl/deltacast-*.whl
    ;;
run)
    # shellcheck source=scripts/gpu-env.sh
    . scripts/gpu-env.sh
    export DELTACAST_REQUIRE_GPU=1
    out=${OUT:-gpu-tests-out}
    mkdir -p "$out"
    status=0
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    # gpu_frames writes the captured GPU sync there: the golden files CI applies without a GPU
    # (crates/deltacast-cli/tests/data/gpu-sync/).
    export DELTACAST_GOLDEN_OUT=${DELTACAST_GOLDEN_OUT:-$out/golden}
    for name in gpu gpu_apply gpu_entropy gpu_convert gpu_steps gpu_frames ipc_auth gpu_sync gpu_sharded; do
        if [ ! -x "$dir/$name" ]; then
            echo "gpu-tests: $dir/$name missing (run 'scripts/gpu-tests.sh build' first)"
            status=1
            continue
        fi
        filter=()
        if { [ "$name" = gpu_sync ] || [ "$name" = gpu_sharded ]; } && [ "$gpus" -lt 2 ]; then
            echo "gpu-tests: $gpus GPU: $name runs only its CUDA-IPC tests (the NCCL ones need two GPUs)"
            filter=(ipc)
        fi
        timeout 300 "$dir/$name" "${filter[@]}" --test-threads 1 --nocapture >"$out/$name.log" 2>&1
        rc=$?
        echo "gpu-tests: $name exit $rc: $(grep -E '^test result' "$out/$name.log" | tail -1)"
        [ "$rc" -ne 0 ] && status=1 && grep -E 'panicked|FAILED' "$out/$name.log" | head -5
    done
    site=${DELTACAST_SITE:-/tmp/site}
    if ls .whl/deltacast-*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --target "$site" .whl/deltacast-*.whl \
            >"$out/pip.log" 2>&1
        PYTHONPATH=$site timeout 300 python3 -m pytest -q -rs bindings/python/tests/test_cuda.py bindings/python/tests/test_cuda_fp8.py bindings/python/tests/test_cuda_engine.py \
            >"$out/pytest.log" 2>&1
        rc=$?
        echo "gpu-tests: test_cuda.py, test_cuda_fp8.py, test_cuda_engine.py exit $rc: $(tail -1 "$out/pytest.log")"
        [ "$rc" -ne 0 ] && status=1
    else
        echo "gpu-tests: no wheel in .whl/ (run 'scripts/gpu-tests.sh build' first)"
        status=1
    fi
    exit $status
    ;;
*)
    echo "usage: scripts/gpu-tests.sh build|run [DIR]" >&2
    exit 2
    ;;
esac
