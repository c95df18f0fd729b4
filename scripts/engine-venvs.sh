#!/usr/bin/env bash
# The inference engines' venvs for the engine test suites (bindings/python/tests/engines), one
# per engine and version, OUTSIDE the clone (each is ~10 GB) and reused across runs:
#   ${DELTACAST_ENGINE_VENVS:-~/.cache/deltacast/engines}/vllm-0.33.0, …/sglang-0.5.23
#
#   scripts/engine-venvs.sh install        create or finish each venv: the engine from PyPI and
#                                          pytest (network-bound, ~5 min each when cold; both at
#                                          once); a venv whose install finished is left alone;
#                                          verl 0.9.1 goes into the SGLang venv (its suite runs there)
#   scripts/engine-venvs.sh wheel WHEEL    (re)install the deltacast wheel into each venv
#   scripts/engine-venvs.sh test           run each engine's suite in its venv (verl's with SGLang's)
#   scripts/engine-venvs.sh path ENGINE    print the venv's directory
#
# ENGINES (default "vllm sglang") picks a subset. Two runs at once wait for each other (flock).
# They cannot share one venv: vLLM and SGLang pin different transformers and torch.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BASE=${DELTACAST_ENGINE_VENVS:-$HOME/.cache/deltacast/engines}
ENGINES=${ENGINES:-vllm sglang}

# The pinned engine versions: what docs/engines.md and the layout caches are keyed by.
spec() {
    case $1 in
    vllm) echo "vllm==0.33.0" ;;
    sglang) echo "sglang==0.5.23" ;;
    *)
        echo "unknown engine $1" >&2
        return 1
        ;;
    esac
}
venv_of() { local s; s=$(spec "$1") && echo "$BASE/${s/==/-}"; }

# `locked NAME CMD...`: runs CMD holding $BASE/NAME.lock (when flock exists).
locked() {
    local name=$1
    shift
    mkdir -p "$BASE"
    if command -v flock >/dev/null 2>&1; then
        flock "$BASE/$name.lock" "$@"
    else
        "$@"
    fi
}

install_one() {
    local e=$1 dir s t0
    dir=$(venv_of "$e")
    s=$(spec "$e")
    # The marker holds the spec that finished installing; anything else means (re)install.
    if [ "$(cat "$dir/.deltacast-installed" 2>/dev/null)" = "$s pytest" ]; then
        echo "$e: reusing $dir"
        return 0
    fi
    t0=$(date +%s)
    [ -x "$dir/bin/python" ] || python3 -m venv "$dir"
    echo "$e: installing $s pytest into $dir (from PyPI)"
    "$dir/bin/python" -m pip install --quiet --disable-pip-version-check "$s" pytest
    echo "$s pytest" >"$dir/.deltacast-installed"
    echo "$e: installed in $(($(date +%s) - t0)) s ($(du -sh "$dir" | cut -f1))"
}

# verl for the verl suite (tests/engines/test_verl_*.py), into the SGLang venv: verl's own
# delta consumer applies into SGLang's model there. verl itself goes in without its
# dependencies (it pins transformers < 5.11; SGLang pins 5.19), then what its checkpoint-engine
# and rollout modules import, constrained to the versions the venv already holds, so nothing
# the engine pinned moves.
VERL_SPEC="verl==0.9.1"
VERL_DEPS=("ray[default]>=2.41.0" hydra-core codetiming "tensordict!=0.9.0,<=0.10.0,>=0.8.0" torchdata pylatexenc)
install_verl() {
    local dir=$1 t0 pins
    if [ "$(cat "$dir/.deltacast-verl" 2>/dev/null)" = "$VERL_SPEC ${VERL_DEPS[*]}" ]; then
        echo "verl: reusing $VERL_SPEC in $dir"
        return 0
    fi
    t0=$(date +%s)
    pins=$(mktemp)
    "$dir/bin/python" -m pip freeze --disable-pip-version-check | grep -v -e '^-e ' -e ' @ ' >"$pins"
    echo "verl: installing $VERL_SPEC into $dir (from PyPI, no deps; then ${VERL_DEPS[*]} pinned to the venv)"
    "$dir/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps "$VERL_SPEC"
    "$dir/bin/python" -m pip install --quiet --disable-pip-version-check -c "$pins" "${VERL_DEPS[@]}"
    rm -f "$pins"
    echo "$VERL_SPEC ${VERL_DEPS[*]}" >"$dir/.deltacast-verl"
    echo "verl: installed in $(($(date +%s) - t0)) s"
}

cmd=${1:-}
case $cmd in
install)
    pids=()
    for e in $ENGINES; do
        locked "$e" "$0" install-one "$e" &
        pids+=($!)
    done
    rc=0
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    exit "$rc"
    ;;
install-one)
    # One engine's venv (the lock is held by `install`): the engine, then verl into SGLang's.
    install_one "$2"
    if [ "$2" = sglang ]; then install_verl "$(venv_of sglang)"; fi
    ;;
wheel)
    wheel=${2:?usage: engine-venvs.sh wheel WHEEL}
    for e in $ENGINES; do
        locked "$e" "$(venv_of "$e")/bin/python" -m pip install --quiet --disable-pip-version-check \
            --no-deps --force-reinstall "$wheel"
        echo "$e: deltacast from $wheel"
    done
    ;;
test)
    rc=0
    for e in $ENGINES; do
        py=$(venv_of "$e")/bin/python
        echo "== $e suite ($py)"
        # Required: a missing engine fails the run rather than skipping (never counts as passed).
        DELTACAST_ENGINES_REQUIRED=1 PYTHONDONTWRITEBYTECODE=1 "$py" -m pytest \
            "$ROOT"/bindings/python/tests/engines/test_"${e}"_*.py \
            $([ "$e" = sglang ] && echo "$ROOT"/bindings/python/tests/engines/test_verl_*.py) \
            $([ "$e" = vllm ] && echo "$ROOT"/bindings/python/tests/engines/test_dtensor_shards.py) \
            "$ROOT/bindings/python/tests/engines/test_layout_probe.py" \
            "$ROOT/bindings/python/tests/engines/test_layout_apply.py" \
            -q -rs -p no:cacheprovider || rc=$?
    done
    exit "$rc"
    ;;
path)
    venv_of "${2:?usage: engine-venvs.sh path ENGINE}"
    ;;
*)
    sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
