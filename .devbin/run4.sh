#!/usr/bin/env bash
# After the kernel-list fix: the suites the cost model touches, the bench at three densities.
. scripts/gpu-env.sh
export DELTACAST_REQUIRE_GPU=1 DELTACAST_GOLDEN_OUT=$OUT/r/golden
mkdir -p $OUT/r
for t in "gpu digest" "gpu_frames" "gpu_sync ipc" "gpu_sharded ipc"; do
  set -- $t
  timeout 120 .devbin/$1 ${2:-} --test-threads 1 --nocapture > $OUT/r/$1.log 2>&1
  echo "$t rc $? $(grep -E '^test result' $OUT/r/$1.log | tail -1)"
  grep -E "panicked" $OUT/r/$1.log | head -3
done
timeout 300 scripts/gpu-bench.sh --steps 6 --out $OUT/r/bench > $OUT/r/bench.log 2>&1; echo "bench rc $?"
tail -7 $OUT/r/bench.log
cd $OUT && tar czf r.tgz r && rm -rf r
