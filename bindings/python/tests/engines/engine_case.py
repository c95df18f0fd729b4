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
ADAPTER_WORKER = Path(__file__).with_name("_adapter_worker.py")
ARCHS = ("qwen2", "qwen3_moe")


def require(module: str) -> None:
    if importlib.util.find_spec(module) is not None:
        return
    why = f"{module} is not installed here (run the suite in its venv: scripts/engine-venvs.sh)"
    if os.environ.get("DELTACAST_ENGINES_REQUIRED") == "1":
        pytest.fail(why, pytrace=False)
    pytest.skip(why, allow_module_level=True)


def start_ranks(worker: Path, engine: str, tp: int, workdir: Path, *extra: str, timeout: int):
    """Runs ``worker ENGINE TP RANK INIT_FILE WORKDIR EXTRA...`` for every rank (gloo through
    INIT_FILE), waits for all; returns each rank's log. Fails on a rank that did not exit 0."""
    init = workdir / "dist-init"
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    procs, logs = [], []
    for r in range(tp):
        log = open(workdir / f"rank{r}.log", "w")
        logs.append(log)
        cmd = [sys.executable, str(worker), engine, str(tp), str(r), str(init), str(workdir)]
        procs.append(
            subprocess.Popen(cmd + list(extra), stdout=log, stderr=subprocess.STDOUT, env=env)
        )
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
    texts = []
    for r in range(tp):
        text = (workdir / f"rank{r}.log").read_text()
        assert codes[r] == 0, f"rank {r} exited {codes[r]}:\n{text[-6000:]}"
        texts.append(text)
    return texts


def run_ranks(engine: str, tp: int, workdir: Path, archs=ARCHS, timeout: int = 900) -> dict:
    """Starts every rank of the layout test, waits for all; returns {(arch, rank): result}."""
    texts = start_ranks(WORKER, engine, tp, workdir, ",".join(archs), timeout=timeout)
    out = {}
    for r, text in enumerate(texts):
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
            # The slots' views (GpuLayoutReceiver): whole slots in one run at TP 1, refused
            # (row-parallel slices) at TP 2.
            if tp == 1:
                assert c["views_refused"] is None, (where, c["views_refused"])
                assert c["views_mismatched"] == [], (
                    f"{where}: writing through the slots' views differs from load_weights: "
                    f"{c['views_mismatched']}"
                )
                assert c["views_changed"] > 0, (where, c)
            else:
                assert c["views_refused"] and "use LayoutReceiver" in c["views_refused"], (
                    where, c["views_refused"],
                )
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


def run_adapter(
    engine: str, tp: int, workdir: Path, *case: str, timeout: int = 600
) -> list[dict]:
    """Runs the ranks of the adapter test (tests/engines/_adapter_worker.py; ``case``: ARCH
    DTYPE, default the tiny Qwen2 in bf16); their reports."""
    texts = start_ranks(ADAPTER_WORKER, engine, tp, workdir, *case, timeout=timeout)
    out = []
    for r, text in enumerate(texts):
        path = workdir / f"adapter-{r}.json"
        assert path.exists(), f"rank {r} wrote no report:\n{text[-6000:]}"
        rep = json.loads(path.read_text())
        assert rep["ok"], f"{engine} rank {r}/{tp}:\n{rep.get('error')}\n{text[-3000:]}"
        out.append(rep)
    return out


def check_adapter_steps(engine: str, tp: int, reports: list[dict]) -> None:
    """Every step on every rank: a sync that should land left the parameters bit-identical to
    load_weights of the full new checkpoint and changed them; a refused one raised deltacast's
    error and left them as they were (still equal to the previous checkpoint)."""
    for rep in reports:
        steps = rep["steps"]
        assert [s["step"] for s in steps][:4] == ["seed", "delta1", "delta2", "delta3"], steps
        for s in steps:
            where = f"{engine} rank {rep['rank']}/{tp} step {s['step']} ({s['how']})"
            assert s["mismatched"] == [], f"{where}: differs from load_weights: {s['mismatched']}"
            assert s["frames"] > 1, where  # several flushes: staging is exercised
            if s["expect_error"] is None:
                assert s["error"] is None, f"{where}: refused: {s['error']}"
                assert s["changed"] > 0, f"{where}: nothing reached this rank"
            else:
                assert s["error"] is not None, f"{where}: a bad sync was accepted"
                if s["expect_error"] != "refused":
                    assert s["error"].startswith(s["expect_error"]), (where, s["error"])
                assert s["deltacast_error"], f"{where}: not deltacast's refusal: {s['error']}"
                assert s["changed"] == 0, f"{where}: a refused sync changed {s['changed']}"
