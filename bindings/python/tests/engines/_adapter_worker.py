"""One tensor-parallel rank of an engine adapter test, run as its own process:

    python _adapter_worker.py ENGINE TP RANK INIT_FILE WORKDIR [ARCH DTYPE]

ENGINE "vllm": the "deltacast" weight-transfer backend, found through vLLM's own plugin loading
and built by its ``WeightTransferEngineFactory``, driven through its lifecycle calls.
ENGINE "sglang": the custom weight loader, called by SGLang's own
``WeightUpdater.update_weights_from_tensor``.

The tiny Qwen2 in bf16 unless ARCH DTYPE say otherwise (e.g. qwen3_moe float32). Rank 0 runs a
deltacast ``Sender`` over the HF checkpoint and writes each sync as a file; every rank delivers
it to its engine (the same frames, as vLLM and SGLang hand every worker the same update). After
every step each rank compares all its parameters, bit for bit, with a reference model that
loaded the expected full checkpoint with the engine's own ``load_weights``. Steps: a seed,
deltas (edge bit patterns), refusals (a corrupted frame, a frame corrupted on one rank only, one
rank's weights diverged, one rank's copy of a replicated slot diverged, an old sync replayed, a delta to a restarted receiver, for vLLM a
session that ends mid-sync) that must leave the weights of every rank as they were, and the
syncs after them; then a second engine B on the same sender that joins late, restarts and is
re-seeded (``resend_seed``) while the first takes every delta. Writes
WORKDIR/adapter-RANK.json.
"""

from __future__ import annotations

import importlib
import json
import math
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from _worker import as_tensor, random_bits

DTYPE = "bfloat16"


def mutate(rng, ckpt: dict, step: int) -> dict:
    """The next checkpoint: per slot (rotating with the step) untouched, a few elements, about
    a tenth in random order, or all of it, new values with edge patterns."""
    new = {n: b.copy() for n, b in ckpt.items()}
    for k, (n, b) in enumerate(new.items()):
        kind = (k + step) % 4
        if kind == 0:
            continue
        m = {1: min(3, b.size), 2: max(1, b.size // 10), 3: b.size}[kind]
        pos = rng.choice(b.size, size=m, replace=False)
        b[pos] = random_bits(rng, DTYPE, m)
    return new


class VllmDelivery:
    """The backend as vLLM's worker drives it (init, start, update_weights, finish)."""

    def __init__(self, torch, glue, model, cdir, tp, table, workdir, report):
        from vllm.config import set_current_vllm_config
        from vllm.config.weight_transfer import WeightTransferConfig
        from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
        from vllm.plugins import load_general_plugins

        from deltacast.integrations.engine_receiver import table_entries
        from deltacast.integrations.vllm_backend import DeltacastWeightTransferEngine

        # (a) vLLM's own plugin loading registers the backend; nothing here registers it.
        report["registered_before_plugins"] = "deltacast" in WeightTransferEngineFactory._registry
        load_general_plugins()
        report["registered_after_plugins"] = "deltacast" in WeightTransferEngineFactory._registry
        self.vc = glue.config(cdir, tp, DTYPE)
        with set_current_vllm_config(self.vc):
            self.engine = WeightTransferEngineFactory.create_engine(
                WeightTransferConfig(backend="deltacast"), self.vc, torch.device("cpu"), model
            )
        report["engine_class"] = type(self.engine).__name__
        report["is_ours"] = isinstance(self.engine, DeltacastWeightTransferEngine)
        self.init = {"slots": table_entries(table), "layout_cache": str(workdir / "layouts")}
        self.restart()
        report["layout_from_cache"] = self.engine.layout_from_cache

        # update_weights ends with torch.accelerator.synchronize(), which raises where no
        # accelerator is available (a CUDA build of torch without a GPU). With none, no device
        # work can be queued: wait for nothing; with one, synchronize as vLLM does.
        real = torch.accelerator.synchronize

        def synchronize(device=None):
            if not torch.accelerator.is_available():
                return None
            return real(device)

        torch.accelerator.synchronize = synchronize

    def layout(self):
        return self.engine.receiver.layout

    def receiver(self):
        return self.engine.receiver

    def restart(self):
        """As a restarted worker: init_transfer_engine again (a fresh receiver, same layout)."""
        self.engine.init_transfer_engine(self.engine.parse_init_info(self.init))

    def deliver(self, torch, path: Path, frames, how: str):
        eng = self.engine

        def bits():
            params = eng.model.parameters()
            return [t.detach().reshape(-1).view(torch.int16).clone() for t in params]

        start = bits()
        self.changed_before_finish = None
        eng.start_weight_update()
        try:
            if how == "file":
                eng.update_weights({"sync_file": str(path)})
            elif how == "split":  # one sync over two calls, frames as uint8 tensors
                ts = [torch.frombuffer(bytearray(f), dtype=torch.uint8) for f in frames]
                k = max(1, len(ts) // 2)
                eng.update_weights({"frames": ts[:k]})
                eng.update_weights({"frames": ts[k:]})
            elif how == "half":  # the session ends in the middle of the sync
                eng.update_weights({"frames": list(frames[: len(frames) // 2])})
            else:
                eng.update_weights({"frames": list(frames)})
            # Stage, then commit: the weights change only in finish_weight_update.
            self.changed_before_finish = any(
                not torch.equal(a, b) for a, b in zip(start, bits(), strict=True)
            )
        finally:
            eng.finish_weight_update()


class SglangDelivery:
    """The loader as SGLang's WeightUpdater calls it."""

    def __init__(self, torch, glue, model, cdir, tp, table, workdir, report):
        import os

        from sglang.srt.model_executor.model_runner_components.weight_updater import (
            WeightUpdater,
        )

        from deltacast.integrations import sglang as dsg

        os.environ["DELTACAST_LAYOUT_CACHE"] = str(workdir / "layouts")
        self.dsg, self.model, self.table = dsg, model, table
        self.updater = WeightUpdater(
            tp_rank=int(sys.argv[3]),
            device="cpu",
            gpu_id=0,
            model_config=None,
            custom_weight_loaders=[dsg.LOADER],
            get_model=lambda: model,
            update_model_fields=lambda *a, **k: None,
            recapture_cuda_graph=lambda: None,
            get_model_runner=lambda: None,
        )
        self.send_table = True

    def layout(self):
        return self.dsg.receiver_of(self.model).layout

    def receiver(self):
        return self.dsg.receiver_of(self.model)

    def restart(self):
        self.dsg.reset(self.model)
        self.send_table = True

    def deliver(self, torch, path: Path, frames, how: str):
        from deltacast import read_sync_file

        frames = read_sync_file(path) if how == "file" else frames
        named = self.dsg.named_tensors(frames, self.table if self.send_table else None)
        ok, msg = self.updater.update_weights_from_tensor(named, load_format=self.dsg.LOADER)
        assert ok, msg
        self.send_table = False


def main() -> int:
    global DTYPE
    engine, tp, rank, init_file, workdir = sys.argv[1:6]
    arch, DTYPE = (sys.argv[6:8] + ["qwen2", "bfloat16"][len(sys.argv[6:8]) :])[:2]
    tp, rank, workdir = int(tp), int(rank), Path(workdir)
    t0 = time.time()
    glue = importlib.import_module(f"deltacast.integrations.{engine}_model")
    import torch
    import torch.distributed as dist

    import deltacast
    from deltacast.integrations import tiny

    glue.init_distributed(tp, rank, init_file)
    report: dict = {"rank": rank, "steps": [], "ok": False}
    try:
        cdir = tiny.write_config(workdir / arch, arch)
        shapes = tiny.hf_shapes(tiny.CONFIGS[arch])
        names = list(shapes)

        def tensors(ckpt):
            return ((n, as_tensor(torch, ckpt[n], DTYPE, shapes[n])) for n in names)

        model = glue.build_model(cdir, DTYPE)
        ref = glue.build_model(cdir, DTYPE)
        rng = np.random.default_rng(20261203)  # the same checkpoints on every rank
        ckpt = {n: random_bits(rng, DTYPE, math.prod(s)) for n, s in shapes.items()}
        glue.load(model, tensors(ckpt))  # the engine starts from an older checkpoint
        params = dict(model.named_parameters())
        ref_params = dict(ref.named_parameters())
        with torch.no_grad():
            for p, t in ref_params.items():
                t.copy_(params[p])  # what the loader never writes is equal too
        wire = {"bfloat16": "bf16", "float32": "f32"}[DTYPE]
        table = deltacast.SlotTable([(n, wire, s) for n, s in shapes.items()])
        kind = {"vllm": VllmDelivery, "sglang": SglangDelivery}[engine]
        delivery = kind(torch, glue, model, cdir, tp, table, workdir, report)
        report["setup_s"] = round(time.time() - t0, 2)
        sender = deltacast.Sender(table, bucket_size=1 << 12) if rank == 0 else None

        def raw(t):
            t = t.detach().reshape(-1)
            return t.view(torch.int16 if t.element_size() == 2 else torch.int32)

        counter = [0]

        def sync_file(make):
            """Rank 0 makes a sync's frames (``make(sender)``) and writes them; all read."""
            counter[0] += 1
            path = workdir / f"sync-{counter[0]}.dcast"
            if rank == 0:
                frames = make(sender)
                deltacast.write_sync_file(path, frames)
            dist.barrier()
            return path, deltacast.read_sync_file(path)

        def step(name, path, frames, how, expect_error, oracle, d=None, ps=None, tamper=None):
            d, ps = d or delivery, ps or params
            before = {p: raw(t).clone() for p, t in ps.items()}
            undo = tamper() if tamper is not None else None
            err, ours = None, None
            try:
                d.deliver(torch, path, frames, how)
            except Exception as e:  # noqa: BLE001 - the step records what was raised
                err = f"{type(e).__name__}: {e}"[:300]
                ours = isinstance(e, deltacast.DeltacastError)
            if undo is not None:
                undo()  # put back what the test changed behind the receiver's back
            glue.load(ref, tensors(oracle))
            mismatched = [p for p, t in ps.items() if not torch.equal(raw(t), raw(ref_params[p]))]
            changed = sum(int((raw(t) != before[p]).sum()) for p, t in ps.items())
            report["steps"].append(
                {
                    "step": name,
                    "how": how,
                    "frames": len(frames),
                    "expect_error": expect_error,
                    "error": err,
                    "deltacast_error": ours,
                    "mismatched": mismatched,
                    "changed": changed,
                    "changed_before_finish": getattr(d, "changed_before_finish", None),
                }
            )
            dist.barrier()

        def hf(ckpt):
            return {n: ckpt[n].reshape(shapes[n]) for n in names}

        def sync_of(new):
            return lambda s: s.sync(hf(new)).frames

        # A seed of a checkpoint the engine does not hold, then deltas.
        ckpt = {n: random_bits(rng, DTYPE, b.size) for n, b in ckpt.items()}
        path, frames = sync_file(sync_of(ckpt))
        step("seed", path, frames, "file", None, ckpt)
        replay = None
        for i, how in enumerate(("file", "frames", "split" if engine == "vllm" else "file")):
            ckpt = mutate(rng, ckpt, i)
            path, frames = sync_file(sync_of(ckpt))
            replay = replay or (path, frames)
            step(f"delta{i + 1}", path, frames, how, None, ckpt)

        # A corrupted last frame: the flushes before it verified, yet nothing lands.
        new = mutate(rng, ckpt, 7)
        path, frames = sync_file(sync_of(new))
        bad = [bytes(f) for f in frames]
        last = bytearray(bad[-1])
        last[len(last) // 2] ^= 0x40
        bad[-1] = bytes(last)
        step("corrupted", path, bad, "frames", "refused", ckpt)
        if engine == "vllm":
            step("incomplete", path, frames, "half", "IncompleteSyncError", ckpt)
        step("after-refusal", path, frames, "frames", None, new)
        ckpt = new
        # One rank refuses (only the last rank's copy of a frame is corrupted; at TP 1 that is
        # the only rank): every rank of the group drops the sync, nothing lands anywhere; the
        # genuine frames then land.
        new = mutate(rng, ckpt, 8)
        path, frames = sync_file(sync_of(new))
        mine = [bytes(f) for f in frames]
        if rank == tp - 1:
            mid = bytearray(mine[len(mine) // 2])
            mid[len(mid) // 2] ^= 0x01
            mine[len(mine) // 2] = bytes(mid)
        step("one-rank-refuses", path, mine, "frames", "refused", ckpt)
        step("after-group-refusal", path, frames, "frames", None, new)
        ckpt = new
        def diverge(slot):
            """A tamper: the last rank's copy of `slot`'s first element changed behind the
            receiver's back (undone after the step)."""

            def tamper():
                if rank != tp - 1:
                    return None
                pname, block = delivery.layout().by_slot()[slot][0]
                flat = raw(params[pname])
                flat[block.dst] ^= 1  # a view: this writes into the parameter

                def undo():
                    flat[block.dst] ^= 1

                return undo

            return tamper

        # One rank's weights diverged (an element of q_proj, held by that rank alone, changed
        # behind the receiver's back) where the next delta changes them: that rank's part of
        # the digest change is wrong, so the group's sum is, and every rank refuses at settle.
        slot = "model.layers.0.self_attn.q_proj.weight"
        new = mutate(rng, ckpt, (3 - names.index(slot)) % 4)  # the whole slot changes
        path, frames = sync_file(sync_of(new))
        step("diverged-rank-refuses", path, frames, "frames", "refused", ckpt,
             tamper=diverge(slot))
        step("after-divergence", path, frames, "frames", None, new)
        ckpt = new
        # A replicated copy diverged: the final norm is held whole by every rank and counted by
        # rank 0 alone, so the digest never sees the last rank's copy; the replicas'
        # cross-check does, and every rank refuses (at TP 1 the one copy is counted: the digest).
        slot = "model.norm.weight"
        new = mutate(rng, ckpt, (3 - names.index(slot)) % 4)
        path, frames = sync_file(sync_of(new))
        step("replica-diverged-refuses", path, frames, "frames", "refused", ckpt,
             tamper=diverge(slot))
        step("after-replica-divergence", path, frames, "frames", None, new)
        ckpt = new
        # One rank's write fails half way (as a device error would), after the whole group
        # verified the sync: that rank writes its old bits back, and so does every other rank,
        # which had written its share; the genuine frames then land.
        new = mutate(rng, ckpt, 10)
        path, frames = sync_file(sync_of(new))

        def fail_write():
            if rank != tp - 1:
                return None
            rx = delivery.receiver()
            real = rx._write

            def half(changes, use_old=False):
                if use_old:
                    return real(changes, use_old=True)
                real(changes[: max(1, len(changes) // 2)])
                raise RuntimeError("injected: the device failed half way through the write")

            rx._write = half

            def undo():
                del rx._write

            return undo

        step("one-rank-write-fails", path, frames, "frames", "refused", ckpt, tamper=fail_write)
        step("after-write-failure", path, frames, "frames", None, new)
        ckpt = new
        # An old sync again: the wrong version.
        step("replayed", replay[0], replay[1], "file", "refused", ckpt)
        # A restarted receiver holds no version: a delta is refused, a seed lands.
        delivery.restart()
        new = mutate(rng, ckpt, 9)
        path, frames = sync_file(sync_of(new))
        step("delta-to-restarted", path, frames, "file", "refused", ckpt)

        def reseed(s):
            s.request_seed()
            return s.sync(hf(new)).frames

        path, frames = sync_file(reseed)
        step("reseed", path, frames, "file", None, new)
        ckpt = new

        # Two engines on one sender: B joins late (a seed of the version the sender holds,
        # resend_seed: the sender does not move on), restarts mid-run and is re-seeded the
        # same way, while A takes every delta and never stops.
        model_b = glue.build_model(cdir, DTYPE)
        params_b = dict(model_b.named_parameters())
        with torch.no_grad():
            for p, t in params_b.items():
                t.copy_(params[p])
        glue.load(model_b, tensors({n: random_bits(rng, DTYPE, b.size) for n, b in ckpt.items()}))
        delivery_b = kind(torch, glue, model_b, cdir, tp, table, workdir, {})
        B = {"d": delivery_b, "ps": params_b}

        def resend(cur):
            return lambda s: s.resend_seed(hf(cur)).frames

        path, frames = sync_file(resend(ckpt))
        step("B-joins", path, frames, "file", None, ckpt, **B)
        for i in range(2):
            new = mutate(rng, ckpt, 11 + i)
            path, frames = sync_file(sync_of(new))
            step(f"A-delta{i}", path, frames, "file", None, new)
            if i == 0:
                step(f"B-delta{i}", path, frames, "file", None, new, **B)
                delivery_b.restart()  # B restarts; the sender and A go on
            else:
                step("B-delta-restarted", path, frames, "file", "refused", ckpt, **B)
                path, frames = sync_file(resend(new))
                step("B-reseed", path, frames, "file", None, new, **B)
            ckpt = new
        new = mutate(rng, ckpt, 13)
        path, frames = sync_file(sync_of(new))
        step("A-after", path, frames, "file", None, new)
        step("B-after", path, frames, "file", None, new, **B)
        report["ok"] = True
    except Exception:
        report["error"] = traceback.format_exc()
    report["seconds"] = round(time.time() - t0, 2)
    (workdir / f"adapter-{rank}.json").write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
