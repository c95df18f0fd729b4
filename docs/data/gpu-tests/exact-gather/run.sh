#!/usr/bin/env bash
# Session 9: the exact-size gather test and the rest of the two-GPU suite.
. scripts/gpu-env.sh
export DELTACAST_REQUIRE_GPU=1
timeout 150 .devbin/gather/gpu_sync --test-threads 1 > $OUT/gpu_sync_gather.txt 2>&1; echo "gpu_sync rc=$?"
grep -E "^test |^test result|panicked" $OUT/gpu_sync_gather.txt | head -12
