#!/usr/bin/env bash
# Session 9, call 3: where the digest's cost in the place pass goes (experiment build).
. scripts/gpu-env.sh
T0=$(date +%s); R=/tmp/r; mkdir -p $R
for i in 1 2; do
  for v in base EXP_NO_ATOMIC EXP_NO_HASH both; do
    case $v in base) x= ;; both) x="-DEXP_NO_ATOMIC -DEXP_NO_HASH" ;; *) x=-D$v ;; esac
    # one -D per variable: DC_EXPERIMENT carries one option
    if [ "$v" = both ]; then x="-DEXP_NO_ATOMIC=1 -DEXP_NO_HASH=1"; fi
    DC_EXPERIMENT="$x" timeout 120 .devbin/exp/gpu_bench 2 5 > $R/exp_${v}_$i.txt 2>&1; echo "$v $i rc=$? ($(( $(date +%s)-T0 ))s)"
    grep -E "^ *1.5% |^copy " $R/exp_${v}_$i.txt | cut -c1-100 | head -6
  done
done
tar czf $OUT/r.tgz -C /tmp r
