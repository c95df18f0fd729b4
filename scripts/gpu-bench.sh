#!/usr/bin/env bash
# The GPU sync benchmark (issue 5): deltacast vs a full NCCL broadcast vs a plain PyTorch delta,
# trainer on GPU 0 and receiver on GPU 1, at Qwen2.5-0.5B and -7B shape, over NVLink and over
# NCCL sockets on loopback; on a machine with one GPU, both processes on it over CUDA IPC
# (transport "ipc": all three methods without NCCL). Runs bindings/python/bench/gpu_sync.py
# once per (model, transport). Then the fp32 trainer's export (issue 26):
# bindings/python/bench/gpu_fp32_export.py once per model of --fp32 (default "0.5b 3b"; both
# processes on GPU 0, deltacast over the fp32 parameters vs cast to BF16 + sync).
#
#   scripts/gpu-bench.sh [--steps N] [--runs "0.5b:nvlink 7b:socket:off ..."] [--out DIR]
#                        [--fp32 "0.5b 3b"] [-- extra gpu_sync.py arguments]
#   scripts/gpu-bench.sh --runs "" --fp32 "0.5b 3b"     # the fp32 export runs only
#
# Meant for the 2-GPU machine, with the built wheel carried: installs the newest
# $DELTACAST_WHEELS/deltacast-*.whl (default folder .whl) into $DELTACAST_SITE (default
# /tmp/site) with pip --no-index --no-deps and puts it on PYTHONPATH (torch and transformers
# are the machine's own). Without a wheel, an already importable deltacast is used; without
# either, the baselines still run and the deltacast column says why it was skipped.
#
# Env (each also a flag above): GPU_BENCH_STEPS (default 8 timed steps, after 1 warm-up step),
# GPU_BENCH_RUNS (default "0.5b:nvlink 0.5b:socket 7b:nvlink 7b:socket", on one GPU
# "0.5b:ipc::: 0.5b:ipc:::1e-5 0.5b:ipc:::6e-5", the densities of issue 24: 1-4 %, 10-25 % and
# ~50 % changed per step; a third field on|off|auto sets deltacast's entropy codecs, default
# auto; a fourth the stage size in MiB, default the library's; a fifth the learning rate,
# default gpu_sync.py's 1e-6),
# GPU_BENCH_FP32 (the fp32 export's models, default "0.5b 3b"; "" skips them; its extra
# arguments in GPU_BENCH_FP32_ARGS, e.g. "--cast foreach"),
# GPU_BENCH_RUN_TIMEOUT (seconds per run, default 420), PYTHON (default python3).
# Results: $OUT if set (the device tool's folder), else ./bench-out: one JSON per run
# (gpu_sync_<model>_<transport>.json, gpu_fp32_export_<model>.json) and the whole log
# (gpu-bench.log). A run kept for the record goes to docs/data/gpu-sync/<what it measured>/,
# with a line in that folder's README.
#
# NVLink multicast stays off (machine rule): NCCL_NVLS_ENABLE=0,
# TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1 (gpu_sync.py sets them again).
#
# Exit status: 0 when every run passed or the machine has no GPU (SKIPPED);
# 1 when any run failed a check, crashed or timed out, or deltacast did not run.
set -uo pipefail
cd "$(dirname "$0")/.."

export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1

PY=${PYTHON:-python3}
STEPS=${GPU_BENCH_STEPS:-8}
RUNS=${GPU_BENCH_RUNS:-"0.5b:nvlink 0.5b:socket 7b:nvlink 7b:socket"}
RUNS_GIVEN=${GPU_BENCH_RUNS:-}
FP32=${GPU_BENCH_FP32-"0.5b 3b"}
FP32_ARGS=${GPU_BENCH_FP32_ARGS:-}
RUN_TIMEOUT=${GPU_BENCH_RUN_TIMEOUT:-420}
WHEELS=${DELTACAST_WHEELS:-.whl}
SITE=${DELTACAST_SITE:-/tmp/site}
OUT_DIR=${OUT:-./bench-out}
EXTRA=()

while [ $# -gt 0 ]; do
    case "$1" in
        --steps) STEPS=$2; shift 2 ;;
        --runs) RUNS=$2; RUNS_GIVEN=1; shift 2 ;;
        --out) OUT_DIR=$2; shift 2 ;;
        --fp32) FP32=$2; shift 2 ;;
        --) shift; EXTRA=("$@"); break ;;
        -h|--help) sed -n '2,38p' "$0"; exit 0 ;;
        *) echo "gpu-bench: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

mkdir -p "$OUT_DIR"
LOG=$OUT_DIR/gpu-bench.log
: >"$LOG"
say() { echo "$@" | tee -a "$LOG"; }

say "== gpu-bench $(date -u +%Y-%m-%dT%H:%M:%SZ): runs [$RUNS], fp32 export [$FP32], $STEPS timed steps, out $OUT_DIR"

# The carried wheel.
wheel=$(ls -t "$WHEELS"/deltacast-*.whl 2>/dev/null | head -n 1 || true)
if [ -n "$wheel" ]; then
    say "== installing $wheel into $SITE"
    if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" \
            "$wheel" 2>&1 | tee -a "$LOG"; then
        say "gpu-bench: could not install $wheel"
        exit 1
    fi
    export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
else
    say "== no $WHEELS/deltacast-*.whl: using whatever deltacast is importable (if any)"
fi
"$PY" - <<'EOF' 2>&1 | tee -a "$LOG"
try:
    import deltacast
    import deltacast.cuda as dcc
    print("== deltacast", deltacast.__version__, "from", deltacast.__file__,
          "| cuda.available():", dcc.available())
except Exception as e:
    print("== deltacast GPU path not importable:", type(e).__name__, e,
          "-> the deltacast column will be skipped")
EOF

# Two GPUs: NCCL runs. One GPU: NCCL cannot put both ranks on it, so the runs go over CUDA IPC,
# trainer and receiver as two processes on that GPU (0.5B only: at 7B the two processes need
# more memory than one H200 has). None: nothing to measure.
ngpu=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
if [ "${ngpu:-0}" -lt 1 ]; then
    say "gpu-bench: SKIPPED: no GPU found"
    exit 0
fi
if [ "${ngpu:-0}" -lt 2 ] && [ -z "${RUNS_GIVEN:-}" ]; then
    RUNS="0.5b:ipc::: 0.5b:ipc:::1e-5 0.5b:ipc:::6e-5"
    say "gpu-bench: one GPU: trainer and receiver as two processes on it, over CUDA IPC (runs: $RUNS)"
fi
{
    "$PY" -c 'import torch, transformers; print("== torch", torch.__version__, "cuda", torch.version.cuda, "| transformers", transformers.__version__)'
    nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>/dev/null
    nvidia-smi topo -m 2>/dev/null
} 2>&1 | tee -a "$LOG"

status=0
results=()
for spec in $RUNS; do
    IFS=: read -r model transport entropy stage_mib lr <<<"$spec"
    entropy=${entropy:-auto}
    stage=()
    [ -n "${stage_mib:-}" ] && stage=(--stage-mib "$stage_mib")
    [ -n "${lr:-}" ] && stage+=(--lr "$lr")
    say ""
    say "== run: model $model, transport $transport, entropy $entropy, stage ${stage_mib:-default} MiB, lr ${lr:-default}, $STEPS steps ($(date -u +%H:%M:%S))"
    start=$(date +%s)
    timeout -k 15 "$RUN_TIMEOUT" "$PY" bindings/python/bench/gpu_sync.py --model "$model" \
        --transport "$transport" --entropy "$entropy" --steps "$STEPS" --out "$OUT_DIR" \
        "${stage[@]}" "${EXTRA[@]}" 2>&1 | tee -a "$LOG"
    rc=${PIPESTATUS[0]}
    took=$(( $(date +%s) - start ))
    case $rc in
        0) what="ok" ;;
        1) what="FAILED a check or crashed" ;;
        3) what="baselines only: deltacast did not run" ;;
        124|137) what="TIMED OUT after ${RUN_TIMEOUT}s" ;;
        *) what="FAILED (exit $rc)" ;;
    esac
    results+=("$model $transport (entropy $entropy, stage ${stage_mib:-default} MiB, lr ${lr:-default}): $what (exit $rc, ${took}s)")
    [ "$rc" -ne 0 ] && status=1
done

# The fp32 trainer's export (issue 26): one GPU is enough (both processes on GPU 0).
for model in $FP32; do
    say ""
    say "== fp32 export: model $model, $STEPS steps${FP32_ARGS:+, $FP32_ARGS} ($(date -u +%H:%M:%S))"
    start=$(date +%s)
    # shellcheck disable=SC2086  # FP32_ARGS: split into words on purpose
    timeout -k 15 "$RUN_TIMEOUT" "$PY" bindings/python/bench/gpu_fp32_export.py --model "$model" \
        --steps "$STEPS" --out "$OUT_DIR" $FP32_ARGS 2>&1 | tee -a "$LOG"
    rc=${PIPESTATUS[0]}
    took=$(( $(date +%s) - start ))
    case $rc in
        0) what="ok" ;;
        1) what="FAILED a check or crashed" ;;
        3) what="deltacast did not run" ;;
        124|137) what="TIMED OUT after ${RUN_TIMEOUT}s" ;;
        *) what="FAILED (exit $rc)" ;;
    esac
    results+=("fp32 export $model: $what (exit $rc, ${took}s)")
    [ "$rc" -ne 0 ] && status=1
done

say ""
say "== gpu-bench summary"
for r in "${results[@]}"; do say "  $r"; done
"$PY" - "$OUT_DIR" <<'EOF' 2>&1 | tee -a "$LOG"
import glob, json, os, sys

def f(x, unit=""):
    return "-" if x is None else f"{x:.2f}{unit}"

print(f"{'model':<6} {'transport':<9} {'entropy':<7} {'lr':>6} {'full ms':>9} {'plain ms':>9} {'deltacast ms':>13} "
      f"{'full/dc':>8} {'plain/dc':>9} {'changed':>8}  checks")
for path in sorted(glob.glob(os.path.join(sys.argv[1], "gpu_sync_*.json"))):
    r = json.load(open(path))
    s, c = r["summary"], r["correctness"]
    ch = s.get("changed_ratio_median")
    print(f"{r['model']:<6} {r['transport']:<9} {r['args'].get('entropy', 'auto'):<7} "
          f"{r['args'].get('lr', 1e-6):>6g} "
          f"{f(s['full']['median_ms']):>9} "
          f"{f(s['plain']['median_ms']):>9} {f(s['deltacast']['median_ms']):>13} "
          f"{f(s['full_over_deltacast'], 'x'):>8} {f(s['plain_over_deltacast'], 'x'):>9} "
          f"{'-' if ch is None else f'{100 * ch:.2f}%':>8}  "
          f"{'OK' if r['ok'] else 'FAILED'}, A/C mismatches {c['mismatch_A']}/{c['mismatch_C']}, "
          f"generation {'identical' if c['generation_identical'] else 'DIFFERENT'}"
          + ("" if r["deltacast"]["ran"] else f", deltacast skipped: {r['deltacast']['skipped_because']}"))
EOF
"$PY" - "$OUT_DIR" <<'EOF' 2>&1 | tee -a "$LOG"
import glob, json, os, sys

def f(x):
    return "-" if x is None else f"{x:.2f}"

paths = sorted(glob.glob(os.path.join(sys.argv[1], "gpu_fp32_export_*.json")))
if paths:
    print(f"{'fp32 export':<11} {'lr':>6} {'A fp32 ms':>10} {'B cast+sync':>12} {'cast':>7} "
          f"{'sync':>7} {'A/B':>6} {'changed':>8}  checks")
for path in paths:
    r = json.load(open(path))
    s, c = r.get("summary"), r.get("correctness")
    if not s:
        print(f"{r.get('model', path):<11} deltacast did not run: "
              f"{r['deltacast']['skipped_because']}")
        continue
    ch = s["changed_ratio"]
    print(f"{r['model']:<11} {r['args']['lr']:>6g} {f(s['A_ms']):>10} {f(s['B_ms']):>12} "
          f"{f(s['B_cast_ms']):>7} {f(s['B_sync_ms']):>7} {f(s['a_over_b']):>6} "
          f"{'-' if ch is None else f'{100 * ch:.2f}%':>8}  {'OK' if r['ok'] else 'FAILED'}, "
          f"mismatching tensors A/B {c['mismatch_A']}/{c['mismatch_B']}, acceptance "
          f"(A/B <= 0.6) {'met' if r['acceptance']['met'] else 'NOT met'}")
EOF
say "gpu-bench: $([ $status -eq 0 ] && echo OK || echo 'FAILED (see above)'); results in $OUT_DIR"
exit $status
