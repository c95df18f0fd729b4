#!/usr/bin/env bash
# Codec throughput per core next to the diff's, in one session (docs/benchmarks.md, "Codec
# throughput per core vs the diff"): the single-threaded diff on a 64 MiB BF16 buffer, then
# every codec on one chunk of 2^20 elements, then the diff again (its two runs bracket the
# codecs, so the spread shows how much the machine drifted). Criterion output is kept in
# $OUT (default target/codec-vs-diff), one file per run, with the load average between runs.
# The diff kernel is the best this CPU has; set DIFF_FILTER to compare another one.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-target/codec-vs-diff}
mkdir -p "$out"
export DELTACAST_BENCH_BYTES=$((64 << 20))
filter=${DIFF_FILTER:-diff_serial/(plain_read|avx512vbmi2)}
uptime | tee "$out/load.txt"
cargo bench -p deltacast --bench diff -- "$filter" >"$out/diff-before.txt" 2>&1
uptime | tee -a "$out/load.txt"
cargo bench -p deltacast --bench codecs >"$out/codecs.txt" 2>&1
uptime | tee -a "$out/load.txt"
cargo bench -p deltacast --bench diff -- "$filter" >"$out/diff-after.txt" 2>&1
uptime | tee -a "$out/load.txt"
# Changes per second of the diff: its element rate (bytes / 2) times the density.
for run in before after; do
  echo "== diff ($run the codecs), M changes/s"
  grep -A2 -E '^diff_serial/.*_(0\.1|1|10|50)%' "$out/diff-$run.txt" | grep -E '^diff_serial|thrpt:' |
    paste - - | awk '{n = $1; g = $5; d = n ~ /_0\.1%/ ? 0.001 : n ~ /_1%/ ? 0.01 : n ~ /_10%/ ? 0.1 : 0.5;
      printf "%s %.0f\n", n, g * 1073741824 / 2 * d / 1e6}'
done
echo "== codecs (changes/s, middle estimate)"
grep -E '^(positions|values|chunk)/|thrpt:' "$out/codecs.txt" | grep -v '%\]' | paste - - |
  awk '{print $1, $5, $6}'
