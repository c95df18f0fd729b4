#!/usr/bin/env bash
# Session 9, call 5: pinned snapshot, HEAD (pair) against the shared-memory slot build, alternated.
. scripts/gpu-env.sh
T0=$(date +%s); R=/tmp/r; mkdir -p $R
for i in 1 2; do for b in pair smem; do
  timeout 90 .devbin/$b/gpu_bench pinned 2 5 > $R/pinned_${b}_$i.txt 2>&1; echo "pinned $b $i rc=$? ($(( $(date +%s)-T0 ))s)"
  grep -E "^ *1.5% |^HtoD" $R/pinned_${b}_$i.txt | cut -c1-100
done; done
tar czf $OUT/r.tgz -C /tmp r
