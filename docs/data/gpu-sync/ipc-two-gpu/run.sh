#!/usr/bin/env bash
# Session 11, call 3: IPC link v2 (ranks report completed copies; only the root exports; Bye).
# Rust IPC test on one visible GPU, every GPU suite, the Python tests, the IPC benches.
set -u
. scripts/gpu-env.sh
export DELTACAST_REQUIRE_GPU=1
mkdir -p "$OUT/bench"
site=/tmp/site
python3 -m pip install -q --no-index --no-deps --target "$site" .whl/deltacast-*.whl >"$OUT/pip.log" 2>&1
CUDA_VISIBLE_DEVICES=0 timeout 90 .devbin/s11/gpu_sync --exact ipc_link_two_processes_on_one_gpu_stay_bit_identical --test-threads 1 --nocapture >"$OUT/gpu_sync_ipc.log" 2>&1
echo "gpu_sync ipc (one visible GPU) rc=$?"; grep -E "test result|FAILED|panicked|kinds per step" "$OUT/gpu_sync_ipc.log" | cut -c1-200 | tail -6
CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$site timeout 60 python3 bindings/python/bench/gpu_sync.py --model 0.5b --transport ipc --steps 8 --out "$OUT/bench" >"$OUT/bench_05b_ipc_onegpu.log" 2>&1
echo "bench 0.5b ipc one gpu rc=$?"; tail -9 "$OUT/bench_05b_ipc_onegpu.log"
timeout 150 .devbin/s11/gpu_sync --test-threads 1 --nocapture >"$OUT/gpu_sync.log" 2>&1
echo "gpu_sync rc=$?"; grep -E "^test .*(ok|FAILED)$|test result: .* (9|10) passed|FAILED|panicked" "$OUT/gpu_sync.log" | tail -12
timeout 60 .devbin/s11/gpu --test-threads 1 >"$OUT/gpu.log" 2>&1
echo "gpu rc=$?"; grep -E "test result" "$OUT/gpu.log" | tail -2
PYTHONPATH=$site timeout 170 python3 -m pytest -q -rs bindings/python/tests/test_cuda.py >"$OUT/pytest.log" 2>&1
echo "pytest rc=$?"; tail -3 "$OUT/pytest.log"
PYTHONPATH=$site timeout 60 python3 bindings/python/bench/gpu_sync.py --model 0.5b --transport ipc --steps 8 --out "$OUT/bench" >"$OUT/bench_05b_ipc_twogpu.log" 2>&1
echo "bench 0.5b ipc two gpus rc=$?"; tail -8 "$OUT/bench_05b_ipc_twogpu.log"
PYTHONPATH=$site timeout 120 python3 bindings/python/bench/gpu_sync.py --model 7b --transport ipc --steps 8 --out "$OUT/bench" >"$OUT/bench_7b_ipc_twogpu.log" 2>&1
echo "bench 7b ipc two gpus rc=$?"; tail -8 "$OUT/bench_7b_ipc_twogpu.log"
