#!/usr/bin/env bash
# Session 9, call 1: digest-in-pass-1 branch vs main, gpu_bench alternated; GPU tests of the branch.
. scripts/gpu-env.sh
export DELTACAST_REQUIRE_GPU=1
T0=$(date +%s); R=/tmp/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv > $R/smi.txt 2>&1
for i in 1 2; do
  for b in pair smem; do
    bin=.devbin/$b/gpu_bench
    timeout 120 $bin 2 5 > $R/gpu_bench_${b}_$i.txt 2>&1; echo "gpu_bench $b $i rc=$? ($(( $(date +%s)-T0 ))s)"
    grep -E "^ *1.5% |^copy |MISMATCH|rror" $R/gpu_bench_${b}_$i.txt | cut -c1-120 | head -8
  done
done
timeout 200 .devbin/smem/gpu --test-threads 1 > $R/gpu_tests.txt 2>&1; echo "gpu tests rc=$? ($(( $(date +%s)-T0 ))s)"; grep -E "^test result|FAILED|panicked" $R/gpu_tests.txt | head
timeout 90 .devbin/smem/gpu_bench pinned 2 5 > $R/pinned_smem.txt 2>&1; echo "pinned rc=$? ($(( $(date +%s)-T0 ))s)"; tail -8 $R/pinned_smem.txt | cut -c1-120
tar czf $OUT/r.tgz -C /tmp r
