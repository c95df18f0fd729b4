#!/usr/bin/env bash
# Session 11, call 6: the final code (IPC link after review): every GPU suite, the Python tests,
# the one-command bench with one GPU visible (-> 0.5B over CUDA IPC), then the NCCL bench at 7B
# and 0.5B over NVLink on two GPUs. Everything in one tarball.
set -u
T0=$(date +%s)
. scripts/gpu-env.sh
export DELTACAST_REQUIRE_GPU=1
R=/tmp/r; mkdir -p $R
site=/tmp/site
python3 -m pip install -q --no-index --no-deps --target "$site" .whl/deltacast-*.whl >$R/pip.log 2>&1
nvidia-smi -L >$R/smi.txt 2>&1
timeout 150 .devbin/s11/gpu_sync --test-threads 1 --nocapture >$R/gpu_sync.log 2>&1
echo "gpu_sync rc=$?"; grep -E "^test .*(ok|FAILED)$|test result: .* passed|FAILED|panicked" $R/gpu_sync.log | grep -v "1 passed" | tail -12
PYTHONPATH=$site timeout 170 python3 -m pytest -q -rs bindings/python/tests/test_cuda.py >$R/test_cuda.log 2>&1
echo "pytest rc=$?"; tail -3 $R/test_cuda.log
CUDA_VISIBLE_DEVICES=0 GPU_BENCH_RUN_TIMEOUT=90 timeout 120 scripts/gpu-bench.sh --out $R/onegpu >$R/gpu-bench-onegpu.txt 2>&1
echo "gpu-bench one visible GPU rc=$?"; grep -E "one GPU|summary|full/deltacast|correctness|ok \(exit|FAILED" $R/gpu-bench-onegpu.txt | tail -6
left=$(( 560 - ($(date +%s) - T0) ))
echo "left for the NCCL bench: ${left}s"
GPU_BENCH_RUN_TIMEOUT=170 GPU_BENCH_RUNS="7b:nvlink 0.5b:nvlink" timeout $left scripts/gpu-bench.sh --out $R/twogpu >$R/gpu-bench-twogpu.txt 2>&1
echo "gpu-bench nvlink rc=$?"; grep -E "full/deltacast|correctness|ok \(exit|FAILED|TIMED" $R/gpu-bench-twogpu.txt | tail -8
tar -C /tmp -czf "$OUT/s11e.tgz" r
