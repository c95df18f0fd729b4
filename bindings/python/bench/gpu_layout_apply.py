"""Commit time of a delta into an engine's own GPU weights, three ways side by side (issue 25's
GPU benchmark; the layout as data, engine-shaped tensors, no engine on the machine):

- ``commit``: deltacast's apply through the layout (``layout.apply_deltas`` of every changed HF slot,
  positions and values on the host as the ``LayoutReceiver`` holds them after ``stage``);
- ``commit_dev``: the same with positions and values already joined on the GPU, as a receiver
  that decodes on the device holds them (``layout_apply.apply_joined``);
- ``commit_torch``: ``commit_dev`` without the Triton kernels (``DELTACAST_NO_TRITON=1``: one
  ``index_copy_`` per touched parameter), what runs where Triton is missing;
- ``patch``: the checkpoint-patch way (verl's delta consumers, vLLM's patch API): per touched HF
  tensor a full-size NaN tensor on the GPU, the changed values written into it, then the
  engine's loader copying its non-NaN elements into place (a masked copy per engine block);
- ``reload``: every HF tensor loaded whole (``layout.apply_slot`` of each, from GPU tensors).

The layouts are SGLang's, learned on a CPU by engine_layouts.py (one decoder layer, repeated
here for every layer). All three end in bit-identical weights, checked after every step against
each other and against the HF truth. ~1.5 % of every tensor changes per step (uniform random
positions, finite new values: the patch way cannot carry a NaN).

    python3 bindings/python/bench/gpu_layout_apply.py LAYOUT.json LAYERS [--steps 6]
        [--frac 0.015] [--experts N] [--out FILE.json] [--device cpu]
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import statistics
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
# layout.py and layout_apply.py are plain Python (numpy, torch, Triton): loaded from the source
# tree as a package of their own, no native module needed.
_pkg = types.ModuleType("dc_integrations")
_pkg.__path__ = [str(HERE.parent / "python" / "deltacast" / "integrations")]
sys.modules["dc_integrations"] = _pkg
L = importlib.import_module("dc_integrations.layout")
A = importlib.import_module("dc_integrations.layout_apply")

LAYER0 = "model.layers.0."


def repeat_layers(d: dict, layers: int) -> dict:
    """The layout JSON with layer 0's slots and parameters repeated for layers 0..layers-1."""

    def expand(items: dict, rename) -> dict:
        out: dict = {}
        group = {k: v for k, v in items.items() if k.startswith(LAYER0)}
        for k, v in items.items():
            if not k.startswith(LAYER0):
                out[k] = v
            elif k == next(iter(group)):
                for i in range(layers):
                    for gk, gv in group.items():
                        out[f"model.layers.{i}." + gk[len(LAYER0):]] = rename(gv, i)
        return out

    def rename_param(p: dict, i: int) -> dict:
        q = dict(p)
        q["blocks"] = [
            {**b, "slot": f"model.layers.{i}." + b["slot"][len(LAYER0):]}
            if b["slot"].startswith(LAYER0) else b
            for b in p["blocks"]
        ]
        return q

    return {
        **d,
        "slots": expand(d["slots"], lambda s, i: s),
        "params": expand(d["params"], rename_param),
    }


def expand_experts(d: dict, experts: int) -> dict:
    """Layer 0 of a learned MoE layout with ``experts`` experts instead of the learned count:
    expert e's slots land where expert 0's do, shifted by e stacked experts (checked on the
    learned experts first), and the router grows by rows."""
    import re

    pat = re.compile(re.escape(LAYER0) + r"mlp\.experts\.(\d+)\.")
    learned = 1 + max(int(m.group(1)) for s in d["slots"] if (m := pat.match(s)))
    slots: dict = {}
    for s, shape in d["slots"].items():
        m = pat.match(s)
        if m is None:
            slots[s] = shape
        elif m.group(1) == "0":
            for e in range(experts):
                slots[pat.sub(f"{LAYER0}mlp.experts.{e}.", s)] = shape
    params: dict = {}
    for name, p in d["params"].items():
        blocks = p["blocks"]
        if any(pat.match(b["slot"]) for b in blocks):
            per = math.prod(p["shape"][1:])
            zero = [b for b in blocks if pat.match(b["slot"]).group(1) == "0"]
            for b in blocks:
                e = int(pat.match(b["slot"]).group(1))
                twin = next(z for z in zero if pat.sub("", z["slot"]) == pat.sub("", b["slot"]))
                if b["dst"] != twin["dst"] + e * per or b["len"] != twin["len"]:
                    raise SystemExit(f"{name}: expert {e} does not follow expert 0's layout")
            blocks = [
                {**z, "slot": pat.sub(f"{LAYER0}mlp.experts.{e}.", z["slot"]),
                 "dst": z["dst"] + e * per}
                for e in range(experts) for z in zero
            ]
            params[name] = {**p, "shape": [experts, *p["shape"][1:]], "blocks": blocks}
        elif name == LAYER0 + "mlp.gate.weight":
            (b,) = blocks
            row = p["shape"][1]
            slots[b["slot"]] = [experts, row]
            params[name] = {**p, "shape": [experts, row], "blocks": [{**b, "len": experts * row}]}
        else:
            params[name] = p
    print(f"experts: {learned} learned, {experts} laid out", flush=True)
    return {**d, "slots": slots, "params": params}


def shape_args(ap: argparse.ArgumentParser, steps: int) -> None:
    """The arguments every engine bench takes: the layout, how many layers and experts it is
    laid out for, the steps and the fraction changed per step, the JSON out."""
    ap.add_argument("layout")
    ap.add_argument("layers", type=int)
    ap.add_argument("--experts", type=int, help="an MoE layout with this many experts per layer")
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--frac", type=float, default=0.015)
    ap.add_argument("--out")


def load_layout(path: str, layers: int, experts: int | None = None) -> L.EngineLayout:
    """The layout JSON at ``path``, its layer 0 repeated for ``layers`` layers (and laid out for
    ``experts`` experts per layer, when given)."""
    raw = json.loads(Path(path).read_text())
    if experts:
        raw = expand_experts(raw, experts)
    return L.EngineLayout.from_json(repeat_layers(raw, layers))


def patch_way(lay, by_slot: dict, params: dict, changes, dev) -> None:
    """The checkpoint-patch way: per touched HF tensor a full-size NaN tensor on the GPU gets the
    changed values, then the engine's loader copies its non-NaN elements (a masked copy per
    block). The same indexed write as the commit's (index_copy_), so the two differ in what they
    touch, not in the primitive."""
    for s, pos, vals in changes:
        full = torch.full(lay.slots[s], float("nan"), dtype=torch.bfloat16, device=dev)
        flat = full.view(-1)
        flat.index_copy_(
            0, pos.to(dev, non_blocking=True).long(), vals.to(dev, non_blocking=True)
        )
        for pname, b in by_slot[s]:
            dst = params[pname].view(-1)
            size = (b.count, b.length)
            d = dst.as_strided(size, (b.dst_stride, 1), dst.storage_offset() + b.dst)
            src = flat.as_strided(size, (b.src_stride, 1), flat.storage_offset() + b.src)
            d.copy_(torch.where(torch.isnan(src), d, src))


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(f) -> float:
    sync()
    t = time.perf_counter()
    f()
    sync()
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser()
    shape_args(ap, steps=6)
    ap.add_argument("--device", default="cuda", help="cpu: a check of this script, no figures")
    ap.add_argument("--profile", action="store_true", help="torch.profiler table of one commit")
    a = ap.parse_args()
    dev = torch.device(a.device)
    name = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"
    lay = load_layout(a.layout, a.layers, a.experts)
    rng = np.random.default_rng(7)
    gen = torch.Generator(device=dev).manual_seed(7)

    # The HF truth (bf16 on the GPU) and three engine copies of it.
    truth = {
        s: torch.randn(shape, generator=gen, device=dev).to(torch.bfloat16)
        for s, shape in lay.slots.items()
    }
    sets = {
        k: {n: torch.zeros(p.shape, dtype=torch.bfloat16, device=dev) for n, p in lay.params.items()}
        for k in ("commit", "commit_dev", "commit_torch", "patch", "reload")
    }
    for params in sets.values():
        for s, t in truth.items():
            A.apply_slot(lay, params, s, t)
    by_slot = lay.by_slot()
    engine_elems = sum(p.numel for p in lay.params.values())
    print(
        f"{Path(a.layout).name} x {a.layers} layers: {len(lay.slots)} HF tensors, "
        f"{len(lay.params)} engine parameters, {engine_elems / 1e9:.2f} G elements on this rank, "
        f"{sum(len(b) for b in by_slot.values())} blocks; {name}",
        flush=True,
    )

    def patch(changes) -> None:
        patch_way(lay, by_slot, sets["patch"], changes, dev)

    def commit(changes) -> None:
        A.apply_deltas(lay, sets["commit"], changes)

    def commit_dev(joined) -> None:
        A.apply_joined(lay, sets["commit_dev"], *joined)

    def commit_torch(joined) -> None:
        os.environ["DELTACAST_NO_TRITON"] = "1"
        try:
            A.apply_joined(lay, sets["commit_torch"], *joined)
        finally:
            del os.environ["DELTACAST_NO_TRITON"]

    def reload() -> None:
        for s, t in truth.items():
            A.apply_slot(lay, sets["reload"], s, t)

    rows = []
    for step in range(a.steps + 1):  # step 0 warms up
        changes, changed = [], 0
        for s, shape in lay.slots.items():
            n = math.prod(shape)
            k = max(1, int(round(n * a.frac)))
            pos = np.sort(rng.choice(n, size=k, replace=False)).astype(np.int64)
            vals = torch.from_numpy(rng.standard_normal(k).astype(np.float32)).to(torch.bfloat16)
            changes.append((s, torch.from_numpy(pos), vals))
            truth[s].view(-1)[torch.from_numpy(pos).to(dev)] = vals.to(dev)
            changed += k
        t_commit = timed(lambda: commit(changes))
        on_dev = (
            [s for s, _, _ in changes],
            [p.numel() for _, p, _ in changes],
            torch.cat([p for _, p, _ in changes]).to(dev),
            torch.cat([v for _, _, v in changes]).to(dev),
        )
        t_commit_dev = timed(lambda: commit_dev(on_dev))
        t_commit_torch = timed(lambda: commit_torch(on_dev))
        t_patch = timed(lambda: patch(changes))
        t_reload = timed(reload)
        ref = sets["reload"]
        for k in ("commit", "commit_dev", "commit_torch", "patch"):
            for n, p in sets[k].items():
                if not torch.equal(p.view(torch.int16), ref[n].view(torch.int16)):
                    raise SystemExit(f"step {step}: {k} differs from the reload in {n}")
        if step:
            rows.append(
                {"step": step, "changed": changed, "commit_ms": t_commit * 1e3,
                 "commit_dev_ms": t_commit_dev * 1e3, "commit_torch_ms": t_commit_torch * 1e3,
                 "patch_ms": t_patch * 1e3, "reload_ms": t_reload * 1e3}
            )
            r = rows[-1]
            print(
                f"step {step}: {changed / 1e6:.2f} M changed: commit {r['commit_ms']:.1f} ms "
                f"(from the device {r['commit_dev_ms']:.2f} ms, "
                f"without Triton {r['commit_torch_ms']:.1f} ms), "
                f"patch {r['patch_ms']:.1f} ms ({r['patch_ms'] / r['commit_ms']:.1f}x), "
                f"reload {r['reload_ms']:.1f} ms; all bit-identical", flush=True
            )
    keys = ("commit_ms", "commit_dev_ms", "commit_torch_ms", "patch_ms", "reload_ms")
    med = {k: statistics.median(r[k] for r in rows) for k in keys}
    if a.profile:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
        with profile(activities=acts) as prof:
            commit_dev(on_dev)
            sync()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))
    changed = statistics.median(r["changed"] for r in rows)
    summary = {
        "layout": Path(a.layout).name, "layers": a.layers, "experts": a.experts, "frac": a.frac,
        "engine_elements": engine_elems, "blocks": sum(len(b) for b in by_slot.values()),
        "device": name, "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "median": med, "ns_per_changed_commit": med["commit_ms"] * 1e6 / changed,
        "ns_per_changed_commit_dev": med["commit_dev_ms"] * 1e6 / changed,
        "triton": A._kernels() is not None and dev.type == "cuda", "rows": rows,
    }
    print(
        f"median: commit {med['commit_ms']:.1f} ms ({summary['ns_per_changed_commit']:.1f} ns per "
        f"changed element), from the device {med['commit_dev_ms']:.1f} ms "
        f"({med['commit_dev_ms'] * 1e6 / changed:.2f} ns per changed element), without Triton "
        f"{med['commit_torch_ms']:.1f} ms, patch {med['patch_ms']:.1f} ms, reload "
        f"{med['reload_ms']:.1f} ms; patch/commit {med['patch_ms'] / med['commit_ms']:.1f}x, "
        f"patch/commit_dev {med['patch_ms'] / med['commit_dev_ms']:.1f}x",
        flush=True,
    )
    if a.out:
        Path(a.out).write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
