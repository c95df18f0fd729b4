"""A trainer's GPU sync straight into an engine's own weights over CUDA IPC, against the
checkpoint-patch way on the same changes (issue 25's whole-sync figure for a trainer and a
rollout engine sharing a GPU, as verl's colocated mode has them).

- ``deltacast``: a trainer process holds the HF checkpoint on the GPU and syncs it with a
  ``deltacast.cuda.GpuSender`` over an ``IpcComm``; the engine process (this one) holds
  engine-shaped weights (the layout's parameters) and a ``GpuReceiver`` on their views
  (``slot_views``: TP 1) committing on demand. The whole sync is the sender's call (diff,
  encode, the copy, the receiver's decode and checks, the ack: the engine could keep generating
  through it) plus the receiver's commit (the pause).
- ``patch``: what verl's delta consumers and vLLM's patch API do, from changes already on the
  GPU: per touched HF tensor a full-size NaN tensor gets the changed values and the engine's
  loader copies the non-NaN elements (a masked copy per block). All of it is a pause.

Both processes draw the same changes from the same seed. After every step both sets of weights
must be equal, and at the end equal to the HF truth written whole through the layout.

    PYTHONPATH=SITE python3 bindings/python/bench/gpu_engine_ipc.py LAYOUT.json LAYERS
        [--experts N] [--steps 4] [--frac 0.015] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_layout_apply as G  # noqa: E402  (its layout JSON helpers and the patch way)
from gpu_engine_sync import changes_of, truth_of, write_out  # noqa: E402  (shared with it)
from gpu_sync import free_port  # noqa: E402


def trainer(a, address: str, secret: str, results, go) -> None:
    """Rank 0: the HF checkpoint on the GPU, a GpuSender, one sync per step (each once the
    engine says go, so that nothing of the trainer's runs during the engine's timings)."""
    import deltacast.cuda as dcc

    lay = G.load_layout(a.layout, a.layers, a.experts)
    truth = truth_of(lay)
    hf = {
        s: torch.from_numpy(t.view(np.int16)).view(torch.bfloat16).cuda() for s, t in truth.items()
    }
    del truth
    comm = dcc.IpcComm(address, 2, 0, 0, timeout_s=300, secret=secret)
    sender = dcc.GpuSender(comm, list(hf.items()), device=0, root=0)
    results.put(("seed", sender.seed()))
    rng = np.random.default_rng(3)
    for step in range(a.steps + 1):
        go.get(timeout=600)
        for s, pos, vals in changes_of(lay, rng, a.frac):
            hf[s].view(-1).index_copy_(0, torch.from_numpy(pos).cuda(), vals.cuda())
        torch.cuda.synchronize()
        results.put((step, sender.sync()))
    sender.close()


def main() -> int:
    import deltacast
    import deltacast.cuda as dcc
    import torch.multiprocessing as mp
    from deltacast.integrations import layout_apply as A
    from deltacast.integrations.gpu_layout_receiver import slot_views

    ap = argparse.ArgumentParser()
    G.shape_args(ap, steps=4)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("SKIPPED: no CUDA device", flush=True)
        return 0
    dev = torch.device("cuda", 0)
    lay = G.load_layout(a.layout, a.layers, a.experts)
    truth = truth_of(lay)
    table = deltacast.SlotTable([(s, "bf16", list(shape)) for s, shape in lay.slots.items()])
    sets = {
        k: {n: torch.zeros(p.shape, dtype=torch.bfloat16, device=dev) for n, p in lay.params.items()}
        for k in ("deltacast", "patch")
    }
    for s, t in truth.items():
        A.apply_slot(lay, sets["patch"], s, torch.from_numpy(t.view(np.int16)).view(torch.bfloat16))
    by_slot = lay.by_slot()

    ctx = mp.get_context("spawn")
    results, go = ctx.Queue(), ctx.Queue()
    address, secret = f"127.0.0.1:{free_port()}", dcc.IpcComm.generate_secret()
    child = ctx.Process(target=trainer, args=(a, address, secret, results, go))
    child.start()
    try:
        comm = dcc.IpcComm(address, 2, 1, 0, timeout_s=300, secret=secret)
        views = slot_views(lay, sets["deltacast"])
        rx = dcc.GpuReceiver(comm, [(s.name, views[s.name]) for s in table], device=0, root=0,
                             commit_on_demand=True)
        t = time.perf_counter()
        rx.receive()
        rx.commit()
        seed_s = time.perf_counter() - t
        _, seed = results.get(timeout=600)
        rng = np.random.default_rng(3)
        rows = []
        for step in range(a.steps + 1):  # step 0 warms up
            changes = changes_of(lay, rng, a.frac)
            for s, pos, vals in changes:
                truth[s].reshape(-1)[pos] = vals.view(torch.int16).numpy().view(np.uint16)
            on_gpu = [(s, torch.from_numpy(pos).to(dev), vals.to(dev)) for s, pos, vals in changes]
            torch.cuda.synchronize()
            go.put(step)
            got = rx.receive()
            t0 = time.perf_counter()
            done = rx.commit()
            torch.cuda.synchronize()
            commit_ms = (time.perf_counter() - t0) * 1e3
            _, sent = results.get(timeout=600)
            t0 = time.perf_counter()
            G.patch_way(lay, by_slot, sets["patch"], on_gpu, dev)
            torch.cuda.synchronize()
            patch_ms = (time.perf_counter() - t0) * 1e3
            for n, p in sets["deltacast"].items():
                if not torch.equal(p.view(torch.int16), sets["patch"][n].view(torch.int16)):
                    raise SystemExit(f"step {step}: deltacast and patch differ in {n}")
            if not step:
                continue
            r = {
                "step": step,
                "changed": sum(len(p) for _, p, _ in changes),
                "kind": sent["kind"],
                "sync_ms": sent["time_ms"],
                "commit_ms": commit_ms,
                "commit_receiver_ms": done["time_ms"],
                "whole_ms": sent["time_ms"] + commit_ms,
                "patch_ms": patch_ms,
                "payload_bytes": sent["payload_bytes"],
                "patch_bytes": sum(len(p) for _, p, _ in changes) * 6,
                "sender_phases_ms": sent.get("phases_ms", {}),
                "receiver_phases_ms": got.get("phases_ms", {}),
            }
            rows.append(r)
            print(
                f"step {step}: {r['changed'] / 1e6:.2f} M changed ({r['kind']}): deltacast sync "
                f"{r['sync_ms']:.2f} ms + commit {commit_ms:.2f} ms = {r['whole_ms']:.2f} ms "
                f"({r['payload_bytes'] / 1e6:.1f} MB), patch {patch_ms:.1f} ms; equal",
                flush=True,
            )
        if rx.receive() is not None:  # the trainer's close
            raise SystemExit("a sync after the last step")
        child.join(timeout=120)
    finally:
        if child.is_alive():
            child.kill()
    for s, t in truth.items():
        A.apply_slot(lay, sets["patch"], s, torch.from_numpy(t.view(np.int16)).view(torch.bfloat16))
    for n, p in sets["deltacast"].items():
        if not torch.equal(p.view(torch.int16), sets["patch"][n].view(torch.int16)):
            raise SystemExit(f"deltacast differs from the HF truth in {n}")
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0] if isinstance(rows[0][k], (int, float))}
    name = torch.cuda.get_device_name()
    print(
        f"{Path(a.layout).name} x {a.layers} layers{f', {a.experts} experts' if a.experts else ''}, "
        f"{name}: median deltacast {med['whole_ms']:.2f} ms (sync {med['sync_ms']:.2f} + commit "
        f"{med['commit_ms']:.2f}), patch {med['patch_ms']:.1f} ms: whole sync "
        f"{med['patch_ms'] / med['whole_ms']:.1f}x, pause {med['patch_ms'] / med['commit_ms']:.0f}x "
        f"shorter; seed {seed['time_ms']:.0f} ms (trainer) / {seed_s * 1e3:.0f} ms (engine); every "
        "set equal to the HF truth",
        flush=True,
    )
    if a.out:
        write_out(a, name, seed=seed, median=med, rows=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
