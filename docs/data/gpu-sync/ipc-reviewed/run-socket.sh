#!/usr/bin/env bash
# Session 11, call 7: the final code's 7B run over the NCCL socket proxy (two GPUs).
set -u
R=/tmp/r; mkdir -p $R
GPU_BENCH_RUN_TIMEOUT=220 GPU_BENCH_RUNS="7b:socket" timeout 235 scripts/gpu-bench.sh --out $R/twogpu >$R/gpu-bench-socket.txt 2>&1
echo "gpu-bench socket rc=$?"; grep -E -A5 "== summary: median" $R/gpu-bench-socket.txt | tail -7
tar -C /tmp -czf "$OUT/s11f.tgz" r
