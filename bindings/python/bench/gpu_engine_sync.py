"""A whole delta sync into an engine's GPU weights, received, checked and committed, against the
checkpoint-patch way, side by side on the same changes (issue 25's whole-sync figure).

- ``deltacast``: the trainer's ``Sender`` codes the step (host); the engine rank's
  ``LayoutReceiver`` (``commit_on_demand``) stages the frames — decodes them on the host, reads
  the old bits of the changed positions from the GPU weights through the layout, checks the
  digests — while generation could go on, then ``commit()`` writes them (the only pause).
- ``gpu``: the same frames handed one by one to a ``GpuLayoutReceiver`` (TP 1: every slot
  lands whole in one run of an engine parameter) committing on demand, as the engine adapters
  use it: at the sync's last frame it copies the frames to the GPU, decodes and checks them
  there (stage: generation could go on), then ``commit()`` writes them straight into the
  engine's weights (the only pause).
- ``patch``: what verl's delta consumers and vLLM's patch API do with the same changes: per
  touched HF tensor the int32 positions and the values cross to the GPU, a full-size NaN tensor
  gets them, and the engine's loader copies the non-NaN elements (a masked copy per block). All
  of it is a pause.

Both start from bytes on the engine's host (the link is the same for both and left out). After
every step both sets of weights must equal the HF truth loaded whole.

    PYTHONPATH=SITE python3 bindings/python/bench/gpu_engine_sync.py LAYOUT.json LAYERS
        [--experts N] [--steps 4] [--frac 0.015] [--receivers host,gpu] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_layout_apply as G  # noqa: E402  (its layout JSON helpers and the patch way)


def truth_of(lay) -> dict:
    """The HF checkpoint's bits (uint16 per slot), the same from run to run."""
    gen = torch.Generator().manual_seed(3)
    return {
        s: torch.randn(shape, generator=gen).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
        for s, shape in lay.slots.items()
    }


def changes_of(lay, rng, frac: float) -> list:
    """One step's changes: per slot, ``frac`` of its elements at random positions (sorted
    int64) with new finite BF16 values, in slot order."""
    out = []
    for s, shape in lay.slots.items():
        n = math.prod(shape)
        k = max(1, int(round(n * frac)))
        pos = np.sort(rng.choice(n, size=k, replace=False)).astype(np.int64)
        vals = torch.from_numpy(rng.standard_normal(k).astype(np.float32)).to(torch.bfloat16)
        out.append((s, pos, vals))
    return out


def write_out(a, device: str, **fields) -> None:
    """The run's JSON at `a.out`: the shape and machine, then the bench's own `fields`."""
    Path(a.out).write_text(json.dumps({
        "layout": Path(a.layout).name, "layers": a.layers, "experts": a.experts,
        "frac": a.frac, "device": device, "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **fields,
    }, indent=1, default=str))


def main() -> int:
    import deltacast
    from deltacast.integrations import layout_apply as A
    from deltacast.integrations.engine_receiver import LayoutReceiver

    ap = argparse.ArgumentParser()
    G.shape_args(ap, steps=4)
    ap.add_argument("--receivers", default="host,gpu",
                    help="which deltacast receivers run: host (LayoutReceiver), gpu (GpuLayoutReceiver)")
    ap.add_argument("--device", default="cuda", help="cpu: a check of this script, no figures")
    a = ap.parse_args()
    dev = torch.device(a.device)
    name = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    lay = G.load_layout(a.layout, a.layers, a.experts)
    rng = np.random.default_rng(3)
    truth = truth_of(lay)
    table = deltacast.SlotTable([(s, "bf16", list(shape)) for s, shape in lay.slots.items()])
    use = set(a.receivers.split(","))
    if not use or not use <= {"host", "gpu"}:
        raise SystemExit(f"--receivers {a.receivers!r}: host, gpu or both")
    kinds = [k for k, on in (("deltacast", "host" in use), ("gpu", "gpu" in use), ("patch", True)) if on]
    sets = {
        k: {n: torch.zeros(p.shape, dtype=torch.bfloat16, device=dev) for n, p in lay.params.items()}
        for k in kinds
    }
    for s, t in truth.items():
        A.apply_slot(lay, sets["patch"], s, torch.from_numpy(t.view(np.int16)).view(torch.bfloat16))
    sender = deltacast.Sender(table)
    rx = LayoutReceiver(table, lay, sets["deltacast"], commit_on_demand=True) if "host" in use else None
    grx = None
    if "gpu" in use:
        from deltacast.integrations.gpu_layout_receiver import GpuLayoutReceiver

        grx = GpuLayoutReceiver(table, lay, sets["gpu"], commit_on_demand=True)
    t = time.perf_counter()
    seed = sender.sync(truth).frames
    if rx is not None:
        rx.receive_all(seed)
        rx.commit()
    if grx is not None:
        for f in seed:
            grx.receive(f)
        grx.commit()
    del seed
    sync()
    seed_s = time.perf_counter() - t
    by_slot = lay.by_slot()
    print(
        f"{Path(a.layout).name} x {a.layers} layers: {len(lay.slots)} HF tensors, "
        f"{sum(p.numel for p in lay.params.values()) / 1e9:.2f} G elements; seed {seed_s:.1f} s; "
        f"{name}",
        flush=True,
    )

    def patch(changes) -> None:
        G.patch_way(lay, by_slot, sets["patch"], changes, dev)

    rows = []
    for step in range(a.steps + 1):  # step 0 warms up
        changes, changed = [], 0
        for s, pos, vals in changes_of(lay, rng, a.frac):
            truth[s].reshape(-1)[pos] = vals.view(torch.int16).numpy().view(np.uint16)
            changes.append((s, torch.from_numpy(pos.astype(np.int32)), vals))
            changed += len(pos)
        t0 = time.perf_counter()
        frames = sender.sync(truth).frames
        t1 = time.perf_counter()
        r = {"step": step, "changed": changed, "encode_ms": (t1 - t0) * 1e3}
        if rx is not None:
            rx.receive_all(frames)
            sync()
            t2 = time.perf_counter()
            rx.commit()
            sync()
            t3 = time.perf_counter()
            r |= {"stage_ms": (t2 - t1) * 1e3, "commit_ms": (t3 - t2) * 1e3}
        if grx is not None:
            t3 = time.perf_counter()
            got = [g for g in (grx.receive(f) for f in frames) if g is not None]
            sync()
            t4 = time.perf_counter()
            done = grx.commit()
            sync()
            t5 = time.perf_counter()
            assert [g["kind"] for g in got] == ["delta"], got
            r |= {
                "gpu_stage_ms": (t4 - t3) * 1e3,
                "gpu_commit_ms": (t5 - t4) * 1e3,
                "gpu_ms": (t5 - t3) * 1e3,
                # The receiver's own time in the stage (the rest: frames handed over from
                # Python), and where it went (wait: the frames read and cut into the GPU's
                # parts; manifest, payload: copies to the GPU; decode, apply: kernels, the
                # apply only checking here; ack).
                "gpu_receiver_ms": got[0].get("time_ms"),
                "gpu_phases_ms": got[0].get("phases_ms", {}),
                "frames": len(frames),
            }
        t3 = time.perf_counter()
        patch(changes)
        sync()
        r["patch_ms"] = (time.perf_counter() - t3) * 1e3
        for k in kinds[:-1]:
            for n, p in sets[k].items():
                if not torch.equal(p.view(torch.int16), sets["patch"][n].view(torch.int16)):
                    raise SystemExit(f"step {step}: {k} and patch differ in {n}")
        if step:
            r |= {"frame_bytes": sum(len(f) for f in frames), "patch_bytes": changed * 6}
            rows.append(r)
            host = (
                f"host stage {r['stage_ms']:.0f} ms + commit {r['commit_ms']:.1f} ms, "
                if rx is not None else ""
            )
            gpu = ""
            if grx is not None:
                parts = ", ".join(f"{k} {v:.1f}" for k, v in r["gpu_phases_ms"].items())
                gpu = (
                    f"gpu receiver stage {r['gpu_stage_ms']:.1f} ms ({r['frames']} frames; "
                    f"receiver {r['gpu_receiver_ms']:.1f}: {parts}) + commit "
                    f"{r['gpu_commit_ms']:.2f} ms, "
                )
            print(
                f"step {step}: {changed / 1e6:.2f} M changed: deltacast {host}{gpu}"
                f"({r['frame_bytes'] / 1e6:.1f} MB; trainer's encode {r['encode_ms']:.0f} ms), "
                f"patch {r['patch_ms']:.1f} ms ({r['patch_bytes'] / 1e6:.1f} MB); equal",
                flush=True,
            )
    reload = {n: torch.zeros(p.shape, dtype=torch.bfloat16, device=dev) for n, p in lay.params.items()}
    for s, t in truth.items():
        A.apply_slot(lay, reload, s, torch.from_numpy(t.view(np.int16)).view(torch.bfloat16))
    for k in kinds[:-1]:
        for n, p in reload.items():
            if not torch.equal(p.view(torch.int16), sets[k][n].view(torch.int16)):
                raise SystemExit(f"{k} differs from the HF truth in {n}")
    med = {
        k: statistics.median(r[k] for r in rows)
        for k, v in rows[0].items()
        if k != "step" and isinstance(v, (int, float))
    }
    if rx is not None:
        whole = med["stage_ms"] + med["commit_ms"]
        print(
            f"median: host receiver stage {med['stage_ms']:.0f} + commit {med['commit_ms']:.1f} ms = "
            f"{whole:.0f} ms, patch {med['patch_ms']:.0f} ms: whole sync {med['patch_ms'] / whole:.1f}x, "
            f"pause {med['patch_ms'] / med['commit_ms']:.1f}x shorter",
            flush=True,
        )
    if grx is not None:
        print(
            f"median: gpu receiver stage {med['gpu_stage_ms']:.1f} + commit "
            f"{med['gpu_commit_ms']:.2f} ms = {med['gpu_ms']:.1f} ms, patch {med['patch_ms']:.1f} "
            f"ms: whole sync {med['patch_ms'] / med['gpu_ms']:.1f}x, pause "
            f"{med['patch_ms'] / med['gpu_commit_ms']:.1f}x shorter",
            flush=True,
        )
    print(
        f"bytes {med['patch_bytes'] / med['frame_bytes']:.1f}x fewer than the patch's; every "
        "set equal to the HF truth",
        flush=True,
    )
    if a.out:
        write_out(a, name, receivers=a.receivers, seed_s=seed_s, median=med, rows=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
