"""One tensor-parallel rank of an engine layout test, run as its own process:

    python _worker.py ENGINE TP RANK INIT_FILE WORKDIR ARCH[,ARCH...]

For each architecture: learns the layout from a float32 model (through the layout cache, twice:
the second must come from the cache and be equal), then for bf16 and fp32 models loads a random
base checkpoint with the engine's own ``load_weights``, applies a random HF-coordinate delta
through the layout, and compares every parameter bit for bit with a copy of the base state that
loaded the full new checkpoint instead. Writes WORKDIR/result-ARCH-RANK.json and the layout as
WORKDIR/layout-ARCH-RANK.json; the parent test reads them."""

from __future__ import annotations

import importlib
import json
import math
import sys
import traceback
from pathlib import Path

import numpy as np

# Bit patterns at the edges of each dtype: ±0, smallest and largest subnormals, ±inf, quiet and
# signalling NaNs with payloads, negative NaN, the largest finite, one.
EDGES = {
    "bfloat16": [
        0x0000,
        0x8000,
        0x0001,
        0x807F,
        0x7F80,
        0xFF80,
        0x7FC0,
        0x7F81,
        0xFFC1,
        0x7FFF,
        0x7F7F,
        0x3F80,
    ],
    "float32": [
        0x00000000,
        0x80000000,
        0x00000001,
        0x807FFFFF,
        0x7F800000,
        0xFF800000,
        0x7FC00000,
        0x7F800001,
        0xFFC00123,
        0x7FFFFFFF,
        0x7F7FFFFF,
        0x3F800000,
    ],
}
BITS = {"bfloat16": np.uint16, "float32": np.uint32}


def random_bits(rng: np.random.Generator, dtype: str, n: int) -> np.ndarray:
    """Random patterns, about a third of them edge cases."""
    u = BITS[dtype]
    out = rng.integers(0, np.iinfo(u).max, size=n, dtype=u, endpoint=True)
    edge = rng.random(n) < 0.33
    out[edge] = rng.choice(np.array(EDGES[dtype], dtype=u), size=int(edge.sum()))
    return out


def as_tensor(torch, bits: np.ndarray, dtype: str, shape):
    t = torch.from_numpy(bits.copy())
    t = t.view(torch.int16) if dtype == "bfloat16" else t.view(torch.int32)
    return t.view(getattr(torch, dtype)).reshape(shape)


def main() -> int:
    engine, tp, rank, init_file, workdir, archs = sys.argv[1:7]
    tp, rank, workdir = int(tp), int(rank), Path(workdir)
    glue = importlib.import_module(f"deltacast.integrations.{engine}_model")
    import torch

    from deltacast.integrations import layout as L
    from deltacast.integrations import tiny

    archs = archs.split(",")
    glue.init_distributed(tp, rank, init_file)
    for arch in archs:
        result: dict = {"arch": arch, "rank": rank, "checks": []}
        try:
            cdir = tiny.write_config(workdir / arch, arch)
            cfg = tiny.CONFIGS[arch]
            shapes = tiny.hf_shapes(cfg)
            key = {
                "engine": engine,
                "engine_version": glue.version(),
                "architecture": cfg["architectures"][0],
                "config": cfg,
                "rank": rank,
                "world": tp,
            }

            def learn(cdir=cdir, shapes=shapes):
                model = glue.build_model(cdir, "float32")
                return L.learn_layout(model, shapes, rank=rank, world=tp, load=glue.load)

            cache = workdir / "layout-cache"
            lay, hit = L.cached_layout(key, learn, cache)
            lay2, hit2 = L.cached_layout(key, learn, cache)
            assert not hit and hit2, (hit, hit2)
            assert lay2.to_json() == lay.to_json(), "the cached layout differs from the learned one"
            (workdir / f"layout-{arch}-{rank}.json").write_text(json.dumps(lay.to_json()))

            for dtype in ("bfloat16", "float32"):
                result["checks"].append(
                    check_dtype(torch, glue, L, lay2, cdir, shapes, dtype, rank)
                )
            result["post_load"] = check_post_load(torch, glue, cdir, shapes)
            result["ok"] = True
        except Exception:
            result["ok"] = False
            result["error"] = traceback.format_exc()
        (workdir / f"result-{arch}-{rank}.json").write_text(json.dumps(result))
    return 0


def check_dtype(torch, glue, L, lay, cdir, shapes, dtype, rank) -> dict:
    from deltacast.integrations import layout_apply as A

    # Same seed on every rank: all ranks see the same checkpoints and deltas.
    rng = np.random.default_rng(20261201 + (dtype == "float32"))
    base = {n: random_bits(rng, dtype, math.prod(s)) for n, s in shapes.items()}
    new = {n: b.copy() for n, b in base.items()}
    deltas = []
    names = list(shapes)
    for k, n in enumerate(names):
        size = base[n].size
        kind = k % 4  # untouched, a few elements, about a tenth, all of it
        if kind == 0:
            continue
        m = {1: min(3, size), 2: max(1, size // 10), 3: size}[kind]
        pos = np.sort(rng.choice(size, size=m, replace=False)).astype(np.int64)
        if kind == 2:
            rng.shuffle(pos)  # the apply must not need sorted positions
        vals = random_bits(rng, dtype, m)
        new[n][pos] = vals
        deltas.append((n, pos, vals))

    model = glue.build_model(cdir, dtype)
    params = dict(model.named_parameters())
    glue.load(model, ((n, as_tensor(torch, base[n], dtype, shapes[n])) for n in names))
    start = {p: t.detach().clone() for p, t in params.items()}

    written = 0
    for n, pos, vals in deltas:
        written += A.apply_delta(
            lay, params, n, torch.from_numpy(pos), as_tensor(torch, vals, dtype, (-1,))
        )
    applied = {p: t.detach().clone() for p, t in params.items()}

    # The whole new checkpoint written through the slots' views (what GpuLayoutReceiver
    # applies into): at TP 1 every slot lands whole in one run; at TP 2 some do not, and
    # slot_views must refuse.
    from deltacast.integrations.gpu_layout_receiver import slot_views

    viewed, views_refused = None, None
    with torch.no_grad():
        for p, t in params.items():
            t.copy_(start[p])
        try:
            views = slot_views(lay, params)
        except L.LayoutError as e:
            views_refused = str(e)
        else:
            for n in names:
                views[n].copy_(as_tensor(torch, new[n], dtype, shapes[n]))
            viewed = {p: t.detach().clone() for p, t in params.items()}

    with torch.no_grad():
        for p, t in params.items():
            t.copy_(start[p])
    glue.load(model, ((n, as_tensor(torch, new[n], dtype, shapes[n])) for n in names))

    def raw(t):
        return t.contiguous().view(-1).view(torch.int16 if t.element_size() == 2 else torch.int32)

    mismatched, views_mismatched = [], []
    changed = views_changed = 0
    for p, t in params.items():
        diff = int((raw(applied[p]) != raw(t.detach())).sum())
        if diff:
            mismatched.append([p, diff, t.numel()])
        changed += int((raw(applied[p]) != raw(start[p])).sum())
        if viewed is not None:
            diff = int((raw(viewed[p]) != raw(t.detach())).sum())
            if diff:
                views_mismatched.append([p, diff, t.numel()])
            views_changed += int((raw(viewed[p]) != raw(start[p])).sum())
    return {
        "dtype": dtype,
        "param_dtypes": sorted({str(t.dtype) for t in params.values()}),
        "written": written,
        "changed": changed,
        "mismatched": mismatched,
        "views_refused": views_refused,
        "views_changed": views_changed,
        "views_mismatched": views_mismatched,
    }


def check_post_load(torch, glue, cdir, shapes) -> dict:
    """Whether the engine's step after load_weights keeps the parameters the layout describes
    (same names, shapes, dtypes and bits). Its kernels may be absent from a CPU install: then
    it says so (``missing``) instead of a verdict."""
    rng = np.random.default_rng(5)
    dtype = "bfloat16"
    model = glue.build_model(cdir, dtype)
    glue.load(
        model,
        (
            (n, as_tensor(torch, random_bits(rng, dtype, math.prod(s)), dtype, s))
            for n, s in shapes.items()
        ),
    )
    before = {p: t.detach().clone() for p, t in model.named_parameters()}
    try:
        glue.post_load(model, cdir, dtype)
    except (AttributeError, RuntimeError, NotImplementedError) as e:
        text = f"{type(e).__name__}: {e}"
        # torch.ops namespaces without the op: the engine's CPU kernels are not in this install.
        if "_OpNamespace" in text or "No such operator" in text:
            return {"missing": text[:400]}
        raise
    after = dict(model.named_parameters())
    changed = sorted(
        p
        for p in before
        if p not in after
        or after[p].shape != before[p].shape
        or after[p].dtype != before[p].dtype
        or not torch.equal(
            after[p].detach().view(-1).view(torch.int16), before[p].view(-1).view(torch.int16)
        )
    )
    return {"changed": changed, "added": sorted(set(after) - set(before))}


if __name__ == "__main__":
    sys.exit(main())
