#!/usr/bin/env bash
# Session 11, call 4: on a machine with ONE H200: the IPC link's tests and the 0.5B bench with
# trainer and receiver as two processes on that GPU. Everything in one tarball.
set -u
. scripts/gpu-env.sh
export DELTACAST_REQUIRE_GPU=1
R=/tmp/r; mkdir -p $R/bench
site=/tmp/site
python3 -m pip install -q --no-index --no-deps --target "$site" .whl/deltacast-*.whl >$R/pip.log 2>&1
nvidia-smi -L >$R/smi.txt 2>&1; nvidia-smi >>$R/smi.txt 2>&1
timeout 90 .devbin/s11/gpu_sync --exact ipc_link_two_processes_on_one_gpu_stay_bit_identical --test-threads 1 --nocapture >$R/gpu_sync_ipc.log 2>&1
echo "gpu_sync ipc rc=$?"; grep -E "test result|FAILED|panicked" $R/gpu_sync_ipc.log | tail -4
PYTHONPATH=$site timeout 150 python3 -m pytest -q -rs -v bindings/python/tests/test_cuda.py -k "ipc" >$R/test_cuda_ipc.log 2>&1
echo "pytest ipc rc=$?"; grep -E "PASSED|FAILED|SKIPPED|passed|failed" $R/test_cuda_ipc.log | tail -8
PYTHONPATH=$site timeout 30 python3 bindings/python/bench/gpu_sync.py --model 0.5b --transport nvlink --out $R/bench >$R/bench_nvlink_skip.log 2>&1
echo "bench nvlink on one gpu rc=$?"; tail -2 $R/bench_nvlink_skip.log
PYTHONPATH=$site timeout 90 python3 bindings/python/bench/gpu_sync.py --model 0.5b --transport ipc --steps 8 --out $R/bench >$R/bench_05b_ipc_onegpu.log 2>&1
echo "bench 0.5b ipc one gpu rc=$?"; grep -A7 "== summary" $R/bench_05b_ipc_onegpu.log
PYTHONPATH=$site DELTACAST_STAGE_TRACE=0 timeout 90 python3 bindings/python/bench/gpu_sync.py --model 0.5b --transport ipc --steps 8 --entropy on --out $R/bench >$R/bench_05b_ipc_onegpu_entropy.log 2>&1
echo "bench 0.5b ipc one gpu entropy on rc=$?"; grep -A5 "== summary" $R/bench_05b_ipc_onegpu_entropy.log
tar -C /tmp -czf "$OUT/s11d.tgz" r
