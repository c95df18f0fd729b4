#!/usr/bin/env bash
# Runs every test of the project. Installs nothing system-wide beyond what cargo fetches.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo test (workspace)"
cargo test --workspace --no-fail-fast 2>&1

echo "== benches compile"
cargo check --workspace --benches --quiet

echo "== API docs build without warnings (broken links included)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet

echo "== fuzz smoke (each cargo-fuzz target for a few seconds)"
FUZZ_SECONDS=${FUZZ_SECONDS:-5} ./scripts/fuzz-smoke.sh

echo "== GPU kernels compile (NVRTC from PyPI, PTX for sm_90, no GPU needed)"
./scripts/check-kernels.sh

echo "== python package (bindings/python): pip install into a venv, pytest"
# The package is its own cargo workspace (no Python needed by the Rust tests above). pip builds
# it through maturin, fetched from PyPI into pip's isolated build environment; the wheel's cargo
# build keeps its artefacts in target/python so later runs only rebuild what changed.
py_env=target/pyenv
if [ ! -x "$py_env/bin/python" ]; then
  python3 -m venv "$py_env" || {
    echo "python3 -m venv failed: install the venv module (Debian: apt-get install python3-venv)" >&2
    exit 1
  }
fi
export PYTHONDONTWRITEBYTECODE=1
"$py_env/bin/python" -m pip install --quiet --disable-pip-version-check numpy pytest
CARGO_TARGET_DIR="$PWD/target/python" "$py_env/bin/python" -m pip install --quiet \
  --disable-pip-version-check --no-deps --force-reinstall ./bindings/python
cargo fmt --manifest-path bindings/python/Cargo.toml -- --check
# pytest exits 5 when it collects no test, which `set -e` turns into a failure.
"$py_env/bin/python" -m pytest bindings/python/tests -q -rs -p no:cacheprovider
