#!/usr/bin/env bash
# The GPU suites, then the one-GPU bench at three densities (defaults, no flags).
. scripts/gpu-env.sh
mkdir -p $OUT/r
timeout 330 scripts/gpu-tests.sh run .devbin > $OUT/r/gpu-tests.log 2>&1; echo "gpu-tests rc $?"
grep -E "test result|passed|failed|FAILED|SKIP" $OUT/r/gpu-tests.log | tail -25
timeout 240 scripts/gpu-bench.sh --steps 6 --out $OUT/r/bench > $OUT/r/bench.log 2>&1; echo "bench rc $?"
tail -8 $OUT/r/bench.log
cd $OUT && tar czf r.tgz r && rm -rf r
