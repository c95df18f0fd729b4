#!/usr/bin/env bash
# Session 9, final call: GPU tests, kernel bench and pinned bench on main's HEAD (one H200).
. scripts/gpu-env.sh
export DELTACAST_REQUIRE_GPU=1
T0=$(date +%s); R=/tmp/r; mkdir -p $R
git log --oneline -1 > $R/commit.txt 2>/dev/null
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv > $R/smi.txt 2>&1
timeout 250 .devbin/final/gpu --test-threads 1 > $R/gpu_tests.txt 2>&1; echo "gpu tests rc=$? ($(( $(date +%s)-T0 ))s)"; grep -E "^test result|FAILED|panicked" $R/gpu_tests.txt | head
timeout 60 .devbin/final/gpu_sync --test-threads 1 > $R/gpu_sync.txt 2>&1; echo "gpu_sync rc=$? ($(( $(date +%s)-T0 ))s)"; grep -E "^test result|SKIP|skip" $R/gpu_sync.txt | head -3
timeout 120 .devbin/final/gpu_bench 2 5 > $R/gpu_bench.txt 2>&1; echo "gpu_bench rc=$? ($(( $(date +%s)-T0 ))s)"
grep -E "^ *[0-9.]+% |^copy |MISMATCH|identical|checked" $R/gpu_bench.txt | cut -c1-110 | head -40
timeout 90 .devbin/final/gpu_bench pinned 2 5 > $R/pinned.txt 2>&1; echo "pinned rc=$? ($(( $(date +%s)-T0 ))s)"; grep -E "^ *[0-9.]+% |^HtoD" $R/pinned.txt | cut -c1-100
tar czf $OUT/r.tgz -C /tmp r
