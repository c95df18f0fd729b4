#!/usr/bin/env bash
# Session 9, two GPUs: every GPU suite, then the whole sync bench, on main's HEAD.
. scripts/gpu-env.sh
export DELTACAST_REQUIRE_GPU=1
T0=$(date +%s); R=/tmp/r; mkdir -p $R
nvidia-smi --query-gpu=index,name,driver_version --format=csv > $R/smi.txt 2>&1
OUT=$R/tests timeout 260 scripts/gpu-tests.sh run .devbin/final > $R/tests.txt 2>&1; echo "gpu-tests rc=$? ($(( $(date +%s)-T0 ))s)"; tail -4 $R/tests.txt
left=$(( 585 - ($(date +%s)-T0) ))
GPU_BENCH_STEPS=8 GPU_BENCH_RUN_TIMEOUT=150 GPU_BENCH_RUNS="${RUNS:-7b:nvlink 0.5b:nvlink 7b:socket 0.5b:socket}" timeout $left scripts/gpu-bench.sh --out $R/final > $R/bench.txt 2>&1
echo "bench rc=$? ($(( $(date +%s)-T0 ))s)"; tail -9 $R/bench.txt
tar czf $OUT/r.tgz -C /tmp r
