"""The GPU receiver writing into an engine's own parameters (``GpuLayoutReceiver``): frames of a
host ``Sender`` pushed through a ``FrameFeed``, decoded and applied on the GPU straight into
engine-shaped weights (SGLang's Qwen2.5-0.5B TP-1 layout, learned from its own
``load_weights``: fused qkv and gate_up rows, one layer). The oracle is the layout's own apply of
the whole checkpoint (``apply_slot``, checked against the engines' ``load_weights`` by the engine
suites). Needs a GPU with torch (scripts/gpu-tests.sh runs it on the device); skips elsewhere."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import deltacast as dc
from deltacast.integrations import layout as L
from deltacast.integrations import layout_apply as A

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_case import require_gpu  # noqa: E402

LAYOUTS = Path(__file__).resolve().parents[1] / "bench" / "layouts"
SPECIAL = np.array([0x0000, 0x8000, 0x0001, 0x807F, 0x7F80, 0xFF80, 0x7FC1, 0xFFFF], np.uint16)



def _layout(name: str) -> L.EngineLayout:
    return L.EngineLayout.from_json(json.loads((LAYOUTS / f"{name}.json").read_text()))


def _oracle(torch, lay, truth):
    """The engine's parameters holding ``truth`` (uint16 bits per slot), written whole through
    the layout's own apply."""
    out = {n: torch.zeros(p.shape, dtype=torch.bfloat16, device="cuda") for n, p in lay.params.items()}
    for s, bits in truth.items():
        A.apply_slot(lay, out, s, torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16).cuda())
    return out


def _same(torch, a, b) -> list[str]:
    return [n for n in a if not torch.equal(a[n].view(torch.int16), b[n].view(torch.int16))]


def _step(rng, truth):
    """Changes ~1 % of every slot: mostly ±1 ULP (the codecs' common case), some random bit
    patterns and special values (NaN payloads, ±0, ±Inf, subnormals)."""
    for bits in truth.values():
        flat = bits.reshape(-1)
        k = max(1, flat.size // 100)
        pos = rng.choice(flat.size, size=k, replace=False)
        step = rng.choice(np.array([1, -1], np.int32), size=k)
        new = (flat[pos].astype(np.int32) + step).astype(np.uint16)
        wild = rng.random(k) < 0.1
        new[wild] = rng.integers(0, 1 << 16, size=int(wild.sum()), dtype=np.uint16)
        new[: min(k, SPECIAL.size)] = SPECIAL[: min(k, SPECIAL.size)]
        keep = new == flat[pos]
        new[keep] ^= 1  # a change is a change
        flat[pos] = new


def test_host_frames_land_in_the_engines_fused_parameters_bit_for_bit():
    from deltacast.integrations.gpu_layout_receiver import GpuLayoutReceiver

    torch = require_gpu()
    lay = _layout("qwen2.5-0.5b-tp1-r0")
    rng = np.random.default_rng(41)
    truth = {s: rng.integers(0, 1 << 16, size=shape, dtype=np.uint16) for s, shape in lay.slots.items()}
    for bits in truth.values():
        bits.reshape(-1)[: SPECIAL.size] = SPECIAL[: bits.size]
    table = dc.SlotTable([(s, "bf16", list(shape)) for s, shape in lay.slots.items()])
    params = {n: torch.zeros(p.shape, dtype=torch.bfloat16, device="cuda") for n, p in lay.params.items()}
    sender = dc.Sender(table)
    rx = GpuLayoutReceiver(table, lay, params)

    got = rx.receive_all(sender.sync(truth).frames)
    assert [r["kind"] for r in got] == ["seed"]
    assert _same(torch, params, _oracle(torch, lay, truth)) == []
    for step in range(3):
        _step(rng, truth)
        got = rx.receive_all(sender.sync(truth).frames)
        assert [r["kind"] for r in got] == ["delta"], got
        assert got[0]["changed"] > 0
        assert _same(torch, params, _oracle(torch, lay, truth)) == [], step
    rx.verify()

    # A frame damaged on the way: refused, the weights as they were; the intact frames of the
    # same sync then apply.
    before = {n: p.clone() for n, p in params.items()}
    version = rx.version
    _step(rng, truth)
    frames = [bytes(f) for f in sender.sync(truth).frames]
    big = max(range(len(frames)), key=lambda i: len(frames[i]))
    bad = bytearray(frames[big])
    bad[len(bad) // 2] ^= 0x40
    damaged = frames[:big] + [bytes(bad)] + frames[big + 1 :]
    with pytest.raises(dc.DeltacastError):
        rx.receive_all(damaged)
    assert rx.version == version
    assert _same(torch, params, before) == []
    got = rx.receive_all(frames)
    assert [r["kind"] for r in got] == ["delta"]
    assert _same(torch, params, _oracle(torch, lay, truth)) == []

    # Frames that stop inside a sync: refused, nothing written.
    _step(rng, truth)
    frames = sender.sync(truth).frames
    before = {n: p.clone() for n, p in params.items()}
    if len(frames) > 1:
        with pytest.raises(dc.DeltacastError):
            rx.receive_all(frames[:-1])
        assert _same(torch, params, before) == []
        assert rx.version == version + 1


def test_stage_then_commit_leaves_the_engine_serving_until_the_commit():
    """Commit on demand, frame by frame as the engine adapters feed it: a sync's last frame
    verifies it with the weights untouched; ``commit`` writes it bit for bit; a sync dropped
    after its check leaves the weights and the version, and the next delta is refused (its base
    was never held) until a seed."""
    from deltacast.integrations.gpu_layout_receiver import GpuLayoutReceiver

    torch = require_gpu()
    lay = _layout("qwen2.5-0.5b-tp1-r0")
    rng = np.random.default_rng(43)
    truth = {s: rng.integers(0, 1 << 16, size=shape, dtype=np.uint16) for s, shape in lay.slots.items()}
    table = dc.SlotTable([(s, "bf16", list(shape)) for s, shape in lay.slots.items()])
    params = {n: torch.zeros(p.shape, dtype=torch.bfloat16, device="cuda") for n, p in lay.params.items()}
    sender = dc.Sender(table)
    rx = GpuLayoutReceiver(table, lay, params, commit_on_demand=True)
    assert rx.commit_on_demand

    def stage(frames):
        before = {n: p.clone() for n, p in params.items()}
        version = rx.version
        out = [r for r in (rx.receive(f) for f in frames) if r is not None]
        assert len(out) == 1 and rx.awaits_commit and not rx.is_staging
        assert _same(torch, params, before) == [], "staged only"
        assert rx.version == version
        with pytest.raises(RuntimeError, match="waits for commit"):
            rx.receive(frames[0])
        return out[0]

    staged = stage(sender.sync(truth).frames)
    assert staged["kind"] == "seed"
    done = rx.commit()
    assert (done["kind"], done["version"]) == ("seed", staged["version"])
    assert not rx.awaits_commit and rx.version == staged["version"]
    assert _same(torch, params, _oracle(torch, lay, truth)) == []
    for step in range(3):
        _step(rng, truth)
        staged = stage(sender.sync(truth).frames)
        assert staged["kind"] == "delta" and staged["changed"] > 0
        rx.commit()
        assert _same(torch, params, _oracle(torch, lay, truth)) == [], step
    rx.verify()

    # Checked, then dropped: nothing written, the version held stays.
    before = {n: p.clone() for n, p in params.items()}
    version = rx.version
    _step(rng, truth)
    stage(sender.sync(truth).frames)
    rx.abort_sync()
    assert not rx.awaits_commit and rx.version == version
    assert _same(torch, params, before) == []
    rx.verify()
    # The sender counts the dropped sync as held: its next delta is refused here.
    _step(rng, truth)
    frames = sender.sync(truth).frames
    with pytest.raises(dc.DeltacastError):
        for f in frames:
            rx.receive(f)
    assert not rx.awaits_commit and not rx.is_staging
    assert _same(torch, params, before) == []
    # A seed brings it back.
    seed = dc.Sender(table)
    stage(seed.sync(truth).frames)
    rx.commit()
    assert _same(torch, params, _oracle(torch, lay, truth)) == []


def test_a_layout_whose_slots_land_in_pieces_is_refused_with_the_slots_name():
    from deltacast.integrations.gpu_layout_receiver import GpuLayoutReceiver, slot_views

    torch = require_gpu()
    lay = _layout("qwen2.5-0.5b-tp2-r0")
    params = {n: torch.zeros(p.shape, dtype=torch.bfloat16, device="cuda") for n, p in lay.params.items()}
    table = dc.SlotTable([(s, "bf16", list(shape)) for s, shape in lay.slots.items()])
    with pytest.raises(L.LayoutError, match="TP 1"):
        GpuLayoutReceiver(table, lay, params)
    with pytest.raises(L.LayoutError, match="use LayoutReceiver"):
        slot_views(lay, params)


def test_the_engine_adapters_get_the_gpu_receiver_at_tp1_on_a_gpu(monkeypatch):
    """``engine_receiver`` (what the vLLM and SGLang adapters call) gives the GPU receiver for
    CUDA parameters at TP 1, committing on demand when asked, and the host one when told."""
    from deltacast.integrations.engine_receiver import LayoutReceiver
    from deltacast.integrations.gpu_layout_receiver import GpuLayoutReceiver, engine_receiver

    torch = require_gpu()
    lay = _layout("qwen2.5-0.5b-tp1-r0")
    table = dc.SlotTable([(s, "bf16", list(shape)) for s, shape in lay.slots.items()])
    params = {n: torch.zeros(p.shape, dtype=torch.bfloat16, device="cuda") for n, p in lay.params.items()}
    monkeypatch.delenv("DELTACAST_ENGINE_RECEIVER", raising=False)
    rx = engine_receiver(table, lay, params, commit_on_demand=True)
    assert type(rx) is GpuLayoutReceiver and rx.commit_on_demand
    monkeypatch.setenv("DELTACAST_ENGINE_RECEIVER", "gpu")
    assert type(engine_receiver(table, lay, params)) is GpuLayoutReceiver
    monkeypatch.setenv("DELTACAST_ENGINE_RECEIVER", "host")
    assert type(engine_receiver(table, lay, params)) is LayoutReceiver
