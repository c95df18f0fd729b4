"""Runs the ranks of one engine layout test (tests/engines/_worker.py, one process per rank,
gloo between them) and checks what they report.

Engine suites run inside the engine's own venv (scripts/engine-venvs.sh). Outside it the engine
is missing: a skip with the reason, or a failure when DELTACAST_ENGINES_REQUIRED=1 (the test
script sets it, so a suite that cannot run never counts as passed)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

import pytest

WORKER = Path(__file__).with_name("_worker.py")
ARCHS = ("qwen2", "qwen3_moe")


def require(module: str) -> None:
    if importlib.util.find_spec(module) is not None:
        return
    why = f"{module} is not installed here (run the suite in its venv: scripts/engine-venvs.sh)"
    if os.environ.get("DELTACAST_ENGINES_REQUIRED") == "1":
        pytest.fail(why, pytrace=False)
    pytest.skip(why, allow_module_level=True)


def run_ranks(engine: str, tp: int, workdir: Path, archs=ARCHS, timeout: int = 900) -> dict:
    """Starts every rank, waits for all; returns {(arch, rank): result}."""
    init = workdir / "dist-init"
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    procs, logs = [], []
    for r in range(tp):
        log = open(workdir / f"rank{r}.log", "w")
        logs.append(log)
        cmd = [
            sys.executable,
            str(WORKER),
            engine,
            str(tp),
            str(r),
            str(init),
            str(workdir),
            ",".join(archs),
        ]
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env))
    codes = []
    try:
        for p in procs:
            codes.append(p.wait(timeout=timeout))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()
    out = {}
    for r in range(tp):
        text = (workdir / f"rank{r}.log").read_text()
        assert codes[r] == 0, f"rank {r} exited {codes[r]}:\n{text[-6000:]}"
        for arch in archs:
            path = workdir / f"result-{arch}-{r}.json"
            assert path.exists(), f"rank {r} wrote no result for {arch}:\n{text[-6000:]}"
            out[arch, r] = json.loads(path.read_text())
    return out


def check_apply(engine: str, tp: int, workdir: Path, results: dict, archs=ARCHS) -> None:
    for (arch, r), res in sorted(results.items()):
        assert res["ok"], f"{engine} {arch} rank {r}/{tp}:\n{res.get('error')}"
        assert [c["dtype"] for c in res["checks"]] == ["bfloat16", "float32"]
        for c in res["checks"]:
            where = f"{engine} {arch} {c['dtype']} rank {r}/{tp}"
            assert c["param_dtypes"] == [f"torch.{c['dtype']}"], (where, c["param_dtypes"])
            assert c["mismatched"] == [], (
                f"{where}: apply differs from load_weights: {c['mismatched']}"
            )
            # Not vacuous: the delta reached this rank and changed its parameters.
            assert c["written"] > 0 and c["changed"] > 0, (where, c)
    for arch in archs:
        check_coverage(workdir, arch, tp)


def check_post_load(engine: str, tp: int, results: dict, arch: str) -> None:
    """The engine's post-load step leaves the parameters the layout describes as they are; a
    step whose kernels this install lacks is a skip that says which."""
    for r in range(tp):
        res = results[arch, r]
        assert res["ok"], f"{engine} {arch} rank {r}/{tp}:\n{res.get('error')}"
        post = res["post_load"]
        if "missing" in post:
            pytest.skip(
                f"{engine} {arch}: the post-load step needs kernels absent from this install "
                f"(the PyPI wheel on a CPU): {post['missing']}"
            )
        assert post["changed"] == [] and post["added"] == [], (engine, arch, r, post)


def check_coverage(workdir: Path, arch: str, tp: int) -> None:
    """Over all ranks, every HF element lands somewhere; a slot held whole by one rank is held
    whole by every rank (replicated), and a split slot's shares do not overlap."""
    lays = [json.loads((workdir / f"layout-{arch}-{r}.json").read_text()) for r in range(tp)]
    slots = lays[0]["slots"]
    for lay in lays:
        assert lay["world"] == tp and lay["slots"] == slots
    for s, shape in slots.items():
        n = math.prod(shape)
        per_rank = []
        for lay in lays:
            hit = np.zeros(n, dtype=np.int64)
            for p in lay["params"].values():
                for b in p["blocks"]:
                    if b["slot"] != s:
                        continue
                    i = np.arange(b["count"])[:, None] * b["src_stride"]
                    hit[(b["src"] + i + np.arange(b["len"])[None, :]).reshape(-1)] += 1
            assert hit.max(initial=0) <= 1, f"{arch} {s}: an element twice on one rank"
            per_rank.append(hit)
        total = np.sum(per_rank, axis=0)
        assert total.min() >= 1, f"{arch} {s}: {int((total == 0).sum())} elements land on no rank"
        whole = [bool(h.all()) for h in per_rank]
        if any(whole):
            # Replicated (norms, the router, a KV head shared by ranks): all or nothing.
            assert all(whole), f"{arch} {s}: whole on some ranks only"
        else:
            assert total.max() == 1, f"{arch} {s}: split shares overlap"
