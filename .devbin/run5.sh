#!/usr/bin/env bash
# The final tree (engines merged): the sync suites, test_cuda.py, one bench run.
. scripts/gpu-env.sh
export DELTACAST_REQUIRE_GPU=1 DELTACAST_GOLDEN_OUT=$OUT/r/golden
mkdir -p $OUT/r
for t in "gpu_frames" "gpu_sync ipc" "gpu_sharded ipc"; do
  set -- $t
  timeout 100 .devbin/$1 ${2:-} --test-threads 1 --nocapture > $OUT/r/$1.log 2>&1
  echo "$t rc $? $(grep -E '^test result' $OUT/r/$1.log | tail -1)"
done
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/deltacast-*.whl > /dev/null 2>&1
PYTHONPATH=/tmp/site timeout 120 python3 -m pytest -q -rs bindings/python/tests/test_cuda.py > $OUT/r/pytest.log 2>&1; echo "pytest rc $?"; tail -2 $OUT/r/pytest.log
timeout 90 scripts/gpu-bench.sh --steps 6 --runs "0.5b:ipc:::1e-5" --out $OUT/r/bench > $OUT/r/bench.log 2>&1; echo "bench rc $?"; tail -3 $OUT/r/bench.log
cd $OUT && tar czf r.tgz r && rm -rf r
