#!/usr/bin/env bash
# Nsight Compute report of the diff kernels on the GPU machine: the batched diff's pass 1
# (dc_diff) and its place pass (dc_diff_place) on the first 1 % launch of `gpu_bench`
# (crates/deltacast-cuda/examples/gpu_bench.rs), with the sections that tell memory-bound from
# instruction-bound (throughputs, scheduler and warp-state statistics, occupancy, source
# counters). ncu locks the clocks to base, so its durations run ~10 % above gpu_bench's own.
#
#   scripts/gpu-tests.sh build            # here: builds .devbin/gpu_bench (and the tests)
#   scripts/gpu-profile.sh [GIB] [DIR]    # on the GPU machine, carrying .devbin; default 1 GiB
#
# Needs ncu (CUDA's /usr/local/cuda/bin/ncu on the lent machines) and the machine's NVRTC (torch's
# venv, as scripts/gpu-tests.sh finds it). Report: $OUT/ncu-diff.txt when OUT is set (the device
# tool's folder), else ./gpu-profile-out/ncu-diff.txt. Exit status: ncu's.
set -uo pipefail
cd "$(dirname "$0")/.."

gib=${1:-1}
dir=${2:-.devbin}
# shellcheck source=scripts/gpu-env.sh
. scripts/gpu-env.sh
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
if [ ! -x "$ncu" ]; then
    echo "gpu-profile: no ncu on this machine" >&2
    exit 2
fi
if [ ! -x "$dir/gpu_bench" ]; then
    echo "gpu-profile: $dir/gpu_bench missing (run 'scripts/gpu-tests.sh build' first)" >&2
    exit 2
fi
out=${OUT:-gpu-profile-out}
mkdir -p "$out"
# gpu_bench with one repetition runs each configuration 3 times; at 0.1 % five configurations
# come first, so with both kernels matched the 31st and 32nd launches are the first at 1 %.
"$ncu" --kernel-name regex:'dc_diff$|dc_diff_place' --launch-skip 30 --launch-count 2 \
    --set detailed --section WarpStateStats --section SchedulerStats --section Occupancy \
    --section SourceCounters "$dir/gpu_bench" "$gib" 1 >"$out/ncu-diff.txt" 2>&1
rc=$?
grep -E 'dc_diff|Duration|DRAM Throughput|Issue Slots Busy|Achieved Occupancy|Registers Per|Active Threads Per Warp' \
    "$out/ncu-diff.txt"
echo "gpu-profile: ncu exit $rc, report in $out/ncu-diff.txt"
exit $rc
