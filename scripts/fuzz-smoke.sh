#!/usr/bin/env bash
# Short libFuzzer runs of every fuzz target in fuzz/ (a cargo workspace of its own).
#
#   FUZZ_SECONDS   seconds per target (default 15)
#   FUZZ_TARGETS   space-separated subset (default: all of `cargo fuzz list`)
#   FUZZ_BUILD_FLAGS  cargo-fuzz build flags (default --codegen-units 16)
#   CARGO_TARGET_DIR  honoured (default fuzz/target)
#
# Installs cargo-fuzz from crates.io into ~/.cargo/bin if missing (cargo install --locked). Builds on stable with
# --sanitizer none. Exit status: 1 if any target found a crash (panic, failed assertion, timeout,
# out-of-memory; the input is kept under fuzz/artifacts/TARGET/) or if the targets do not
# build for another reason than the one below; 0 otherwise. When libFuzzer itself cannot be
# had or built here (no cargo-fuzz and no registry, no C++ compiler, an unsupported
# toolchain), it says so, marks every target SKIPPED and exits 0: that is not a crash.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SECONDS_EACH=${FUZZ_SECONDS:-15}
# More codegen units: a faster cold build (about 100 s here instead of 150 s) for slightly
# slower targets.
FUZZ_BUILD_FLAGS=${FUZZ_BUILD_FLAGS:---codegen-units 16}
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
start=$(date +%s)
log_dir=$(mktemp -d)
trap 'rm -rf "$log_dir"' EXIT

skip_all() {
    echo "fuzz-smoke: SKIPPED every fuzz target: $1"
    echo "fuzz-smoke: nothing was fuzzed; this is not a crash (exit 0)"
    exit 0
}

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "== installing cargo-fuzz into ~/.cargo/bin (cargo install cargo-fuzz --locked; a few minutes)"
    t0=$(date +%s)
    if ! cargo install cargo-fuzz --locked >"$log_dir/install.log" 2>&1; then
        tail -n 20 "$log_dir/install.log"
        skip_all "cargo-fuzz is not installed and could not be installed"
    fi
    echo "   installed in $(($(date +%s) - t0)) s"
fi
echo "== $(cargo fuzz --version), $(rustc --version)"

targets=${FUZZ_TARGETS:-$(cargo fuzz list)}

echo "== building fuzz targets (--sanitizer none; minutes when cold): $(echo $targets)"
build_start=$(date +%s)
build_ok=1
if [ -z "${FUZZ_TARGETS:-}" ]; then
    cargo fuzz build --sanitizer none $FUZZ_BUILD_FLAGS >"$log_dir/build.log" 2>&1 || build_ok=0
else
    for t in $targets; do
        cargo fuzz build --sanitizer none $FUZZ_BUILD_FLAGS "$t" >>"$log_dir/build.log" 2>&1 || build_ok=0
    done
fi
if [ $build_ok -eq 0 ]; then
    tail -n 40 "$log_dir/build.log"
    # libFuzzer's runtime (C++, built by libfuzzer-sys), the sanitizer-coverage flags or the
    # linker failing is this machine's or toolchain's limit; anything else (a target or the
    # library that does not compile, a bad argument) is a real failure.
    if grep -qE "failed to run custom build command for .libfuzzer-sys|could not compile .libfuzzer-sys|only accepted on the nightly|error: linking with|linker .* not found|failed to find tool" "$log_dir/build.log"; then
        skip_all "libFuzzer could not be built with this toolchain/machine (log above)"
    fi
    echo "fuzz-smoke: FAILED: the fuzz targets do not build (log above)"
    exit 1
fi
echo "   built in $(($(date +%s) - build_start)) s"

failed=()
for t in $targets; do
    corpus=fuzz/corpus/$t
    mkdir -p "$corpus" "fuzz/artifacts/$t"
    seeds=()
    [ -d "fuzz/seeds/$t" ] && seeds+=("fuzz/seeds/$t")
    case $t in
        frame | manifest | apply) seeds+=(crates/deltacast/tests/golden) ;;
    esac
    t0=$(date +%s)
    cargo fuzz run --sanitizer none $FUZZ_BUILD_FLAGS "$t" "$corpus" "${seeds[@]}" -- \
        -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$ROOT/fuzz/artifacts/$t/" >"$log_dir/$t.log" 2>&1
    rc=$?
    execs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log_dir/$t.log" | grep -oE '[0-9]+$')
    if [ $rc -ne 0 ]; then
        grep -m 3 -A 2 -E "panicked at|ERROR: libFuzzer" "$log_dir/$t.log"
        tail -n 12 "$log_dir/$t.log"
        echo "-- $t: CRASH (exit $rc) after $(($(date +%s) - t0)) s; input under fuzz/artifacts/$t/"
        failed+=("$t")
    else
        echo "-- $t: ok, ${execs:-?} execs in $(($(date +%s) - t0)) s, corpus $(ls "$corpus" | wc -l) files"
    fi
done

ntargets=$(echo $targets | wc -w)
echo "== fuzz-smoke: $((ntargets - ${#failed[@]})) of $ntargets targets ran clean, crashed: ${failed[*]:-none}; total $(($(date +%s) - start)) s"
[ ${#failed[@]} -eq 0 ]
