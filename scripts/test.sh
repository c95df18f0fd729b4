#!/usr/bin/env bash
# Runs every test of the project: what CI runs (.ci/run). About 25 min on 2 cores from a cold
# cargo cache (longer on a busy machine: each phase prints its time), ~6 GB of disk under
# target/ and fuzz/target/, plus the engine suites (below).
#
# Needs: Rust stable with rustfmt, a C/C++ compiler (libFuzzer's runtime, for the fuzz smoke),
# Python >= 3.10 with the venv module (Debian: python3-venv), and network access to crates.io
# and PyPI.
#
# Installs, outside the repository:
#   - cargo-fuzz into ~/.cargo/bin (cargo install --locked), when `cargo fuzz` is missing;
#   - iproute2 (`ip`, `tc`) with apt-get, when running as root without them (the shaped bench
#     tests of crates/deltacast-cli/tests/bench.rs need root, ip and tc);
#   - crates in ~/.cargo/registry and wheels in pip's cache (~/.cache/pip), as cargo and pip do;
#   - the inference engines' venvs (vLLM, SGLang from PyPI; ~10 GB each, reused across runs) in
#     ${DELTACAST_ENGINE_VENVS:-~/.cache/deltacast/engines} (scripts/engine-venvs.sh). A cold
#     install is network-bound (minutes): it starts in the background at once and overlaps the
#     Rust build; the engine phase at the end waits for it. DELTACAST_SKIP_ENGINES=1 skips the
#     engine suites (for local runs; the summary lists them as not run).
# Inside it: build outputs in target/ (the Python package's venv in target/pyenv, its cargo
# build in target/python, the NVRTC wheel in target/nvrtc-venv-*) and fuzz/target/.
#
# Everything printed also goes to target/test.log; at the end comes a summary of every test
# that did not run (cargo's `ignored` lines, pytest's skips, fuzz targets not fuzzed) with its
# reason.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
ROOT=$PWD
LOG=$ROOT/target/test.log
mkdir -p target
: >"$LOG"

# `say TEXT`: to the terminal and the log.
say() { echo "$*" | tee -a "$LOG"; }

# Every test that did not run, with its reason, from the log (printed also on failure).
summary() {
    local status=${1:-$?}
    {
        echo
        echo "== not run (from $LOG)"
        # cargo: "Running tests/x.rs (target/.../deps/x-HASH)", "Running unittests src/lib.rs
        # (…/deps/crate-HASH)" or "Doc-tests crate", then "test NAME ... ignored, REASON".
        awk '
            /^ *Running / {
                path = ($2 == "unittests") ? $3 : $2; bin = $NF
                gsub(/^\(.*\/|-[0-9a-f]+\)$/, "", bin); where = bin " " path
            }
            /^ *Doc-tests / { where = "doc-tests of " $2 }
            / \.\.\. ignored/ {
                line = $0; sub(/^test /, "", line)
                split(line, parts, / \.\.\. ignored,? ?/)
                reason = (parts[2] == "") ? "no reason given" : parts[2]
                printf "  cargo  %s: %s: %s\n", where, parts[1], reason
                n++
            }
            /^SKIPPED \[/ { sub(/^SKIPPED /, ""); printf "  pytest %s\n", $0; n++ }
            /^fuzz-smoke: SKIPPED/ { printf "  fuzz   %s\n", $0; n++ }
            /^engines: SKIPPED/ { printf "  engine %s\n", $0; n++ }
            END { if (n == 0) print "  (none reported)" }
        ' "$LOG"
        if [ -n "${SHAPING_SKIPPED:-}" ]; then
            echo "  cargo  bench tests/bench.rs (deltacast-cli): shaped_run_verifies_every_step_and_leaves_nothing_behind,"
            echo "         sigint_midway_tears_everything_down: shape nothing here: $SHAPING_SKIPPED"
            echo "         (they need root, ip, tc and network namespaces; they pass after printing"
            echo "         'skipping' to their captured output)"
        fi
        if [ "$status" -eq 0 ]; then
            echo "== every test passed ($(($(date +%s) - START)) s)"
        else
            echo "== FAILED (exit $status) after $(($(date +%s) - START)) s; the whole output: $LOG"
        fi
    } | tee -a "$LOG"
    exit "$status"
}
START=$(date +%s)
# The background engine venv install (its own process group) must not outlive the run.
ENGINE_VENVS_PID=
stop_engine_venvs() {
    if [ -n "$ENGINE_VENVS_PID" ] && kill -0 "$ENGINE_VENVS_PID" 2>/dev/null; then
        kill -- "-$ENGINE_VENVS_PID" 2>/dev/null || kill "$ENGINE_VENVS_PID" 2>/dev/null || true
    fi
}
# The run's status is taken first: stop_engine_venvs's own status must not replace it.
trap 'status=$?; stop_engine_venvs; summary "$status"' EXIT
# Stopped from outside: the summary must say so, not "passed".
trap 'exit 130' INT
trap 'exit 143' TERM

# `phase TITLE CMD...`: says what it starts, runs it (its output to the terminal and the log),
# says how long it took; returns the command's status.
phase() {
    local title=$1 t0 rc=0
    shift
    say "== $title"
    t0=$(date +%s)
    "$@" 2>&1 | tee -a "$LOG" || rc=$?
    if [ "$rc" -eq 0 ]; then
        say "   ($title: $(($(date +%s) - t0)) s)"
    else
        say "   ($title: FAILED, exit $rc, after $(($(date +%s) - t0)) s)"
    fi
    return "$rc"
}

# Fail at once, with the fix, on what the test run cannot do without.
cargo fmt --version >/dev/null 2>&1 || {
    say "rustfmt is missing: rustup component add rustfmt"
    exit 1
}
python3 -c 'import sys, venv, ensurepip; assert sys.version_info >= (3, 10), sys.version' 2>/dev/null || {
    say "Python >= 3.10 with the venv module is needed (Debian: apt-get install python3-venv)"
    exit 1
}

# Shaped bench runs need root, ip, tc and network namespaces; install iproute2 if we may.
if [ "$(id -u)" = 0 ] && ! { command -v ip && command -v tc; } >/dev/null 2>&1 \
    && command -v apt-get >/dev/null 2>&1; then
    install_iproute2() {
        apt-get update -qq >/dev/null &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 >/dev/null
    }
    phase "installing iproute2 (apt-get; for the shaped bench tests)" install_iproute2 ||
        say "   could not install iproute2: the shaped bench tests will not shape"
fi
SHAPING_SKIPPED=
if [ "$(id -u)" != 0 ]; then
    SHAPING_SKIPPED="not root"
elif ! { command -v ip && command -v tc; } >/dev/null 2>&1; then
    SHAPING_SKIPPED="ip or tc (iproute2) missing"
elif ! ip netns add "dct-probe-$$" >/dev/null 2>&1; then
    SHAPING_SKIPPED="\`ip netns add\` fails here"
else
    ip netns del "dct-probe-$$" >/dev/null 2>&1 || true
fi

# The engine venvs install while the Rust phases build (network against CPU).
ENGINE_LOG=$ROOT/target/engine-venvs.log
if [ "${DELTACAST_SKIP_ENGINES:-}" = 1 ]; then
    say "engines: SKIPPED the vLLM and SGLang suites (bindings/python/tests/engines): DELTACAST_SKIP_ENGINES=1"
else
    say "== engine venvs: installing in the background (scripts/engine-venvs.sh install; log: $ENGINE_LOG)"
    if command -v setsid >/dev/null 2>&1; then
        setsid ./scripts/engine-venvs.sh install >"$ENGINE_LOG" 2>&1 &
    else
        ./scripts/engine-venvs.sh install >"$ENGINE_LOG" 2>&1 &
    fi
    ENGINE_VENVS_PID=$!
    ENGINE_T0=$(date +%s)
fi

phase "cargo fmt --check" cargo fmt --all -- --check

phase "cargo test (workspace)" cargo test --workspace --no-fail-fast

phase "benches compile" cargo check --workspace --benches --quiet

phase "API docs build without warnings (broken links included)" \
    env RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet

phase "fuzz smoke (each cargo-fuzz target for a few seconds)" \
    env FUZZ_SECONDS="${FUZZ_SECONDS:-5}" ./scripts/fuzz-smoke.sh

phase "GPU kernels compile (NVRTC from PyPI, PTX for sm_90, no GPU needed)" \
    ./scripts/check-kernels.sh

say "== python package (bindings/python): pip install into a venv, pytest"
# The package is its own cargo workspace (no Python needed by the Rust tests above). pip builds
# it through maturin, fetched from PyPI into pip's isolated build environment; the wheel's cargo
# build keeps its artefacts in target/python so later runs only rebuild what changed.
py_env=target/pyenv
if [ ! -x "$py_env/bin/python" ]; then
    phase "creating the venv $py_env" python3 -m venv "$py_env"
fi
export PYTHONDONTWRITEBYTECODE=1
phase "pip install numpy pytest (from PyPI, into $py_env)" \
    "$py_env/bin/python" -m pip install --quiet --disable-pip-version-check numpy pytest
# Built once, as a wheel file: the engine venvs install the same one.
wheel_dir=$ROOT/target/python/wheels
rm -rf "$wheel_dir"
phase "building the wheel (maturin, a release build: minutes when cold)" \
    env CARGO_TARGET_DIR="$ROOT/target/python" "$py_env/bin/python" -m pip wheel --quiet \
    --disable-pip-version-check --no-deps -w "$wheel_dir" ./bindings/python
wheel=$(echo "$wheel_dir"/deltacast-*.whl)
phase "installing the wheel into $py_env" "$py_env/bin/python" -m pip install --quiet \
    --disable-pip-version-check --no-deps --force-reinstall "$wheel"
phase "cargo fmt --check (bindings/python)" \
    cargo fmt --manifest-path bindings/python/Cargo.toml -- --check
# The engine suites need the engines: they run below, each in its own venv.
# pytest exits 5 when it collects no test, which `set -e` turns into a failure.
phase "pytest bindings/python/tests" \
    "$py_env/bin/python" -m pytest bindings/python/tests -q -rs -p no:cacheprovider \
    --ignore=bindings/python/tests/engines

if [ -n "$ENGINE_VENVS_PID" ]; then
    say "== engine venvs: waiting for the background install (started $(($(date +%s) - ENGINE_T0)) s ago)"
    t0=$(date +%s)
    rc=0
    wait "$ENGINE_VENVS_PID" || rc=$?
    ENGINE_VENVS_PID=
    tee -a "$LOG" <"$ENGINE_LOG"
    if [ "$rc" -ne 0 ]; then
        say "   (engine venvs: FAILED, exit $rc; waited $(($(date +%s) - t0)) s)"
        exit "$rc"
    fi
    say "   (engine venvs: ready after waiting $(($(date +%s) - t0)) s, $(($(date +%s) - ENGINE_T0)) s since the start)"
    phase "the wheel into the engine venvs" ./scripts/engine-venvs.sh wheel "$wheel"
    phase "engine suites (vLLM, SGLang: learned layouts, apply vs load_weights, TP 1 and 2)" \
        ./scripts/engine-venvs.sh test
fi
