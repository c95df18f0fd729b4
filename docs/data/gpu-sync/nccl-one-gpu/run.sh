#!/usr/bin/env bash
. scripts/gpu-env.sh
PY=$(ls /opt/torch/.venv/bin/python 2>/dev/null || echo python3)
NCCL_DEBUG=WARN timeout 90 $PY .devbin/nccl_same_gpu.py > $OUT/nccl_same_gpu.txt 2>&1; echo "rc=$?"
grep -E "torch|rank|Duplicate|WARN" $OUT/nccl_same_gpu.txt | cut -c1-300 | head -12
