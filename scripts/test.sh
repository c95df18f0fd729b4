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
