#!/usr/bin/env bash
# Exploration: diff kernel at 0.1-50 %, sync at several lr and stage sizes (entropy off / auto).
. scripts/gpu-env.sh
nvidia-smi --query-gpu=name,memory.used --format=csv
timeout 150 .devbin/gpu_bench 2 5 > $OUT/gpu_bench.txt 2>&1; echo "gpu_bench rc $?"
for spec in "1e-5 off -" "1e-5 off 256" "1e-5 off 128" "3e-5 off -" "1e-4 off 256"; do
  set -- $spec; lr=$1; e=$2; st=$3
  extra=(--lr $lr); [ "$st" != "-" ] && extra+=(--stage-mib $st)
  timeout 200 scripts/gpu-bench.sh --steps 4 --runs "0.5b:ipc:$e" --out $OUT/s_${lr}_${e}_${st} -- "${extra[@]}" --capacity 0.6 > $OUT/s_${lr}_${e}_${st}.log 2>&1
  echo "$spec rc $?"; grep -E "median|deltacast|full" $OUT/s_${lr}_${e}_${st}.log | tail -4
done
