"""fp32 masters into block-FP8 slots: ``Sender.sync`` quantizes float32 sources for
``f8_e4m3`` slots during the diff and derives their ``_scale_inv`` slots. Two oracles, both
independent of deltacast's code:

- a quantizer written in plain torch from the rule (tests/fp8_reference.py: per 128x128
  block, amax at least 1e-4, scale = amax / 448, ``x * (1 / scale)`` clamped to ±448, torch's
  ``.to(float8_e4m3fn)``; a block with a NaN pinned to scale 0x7FC00000 and elements 0x7F),
  on every kind of block;
- vLLM's own ``per_block_cast_to_fp8(x, [128, 128], use_ue8m0=False)`` on blocks without NaN
  or Inf (where torch's own result is defined the same on every platform).

Runs in the vLLM venv (torch and vLLM from PyPI), on the CPU."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
torch = pytest.importorskip("torch")

import deltacast as dc  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fp8_reference import BLOCK, masters  # noqa: E402
from fp8_reference import reference as torch_reference  # noqa: E402


def reference(x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    q, s = torch_reference(x)
    return q.numpy(), s.numpy()


def sync_and_check(sender, rx, arrays, names, want):
    r = sender.sync(arrays)
    for f in r.frames:
        o = rx.receive(f)
    assert o.state_digest == r.state_digest
    for name in names:
        q, s = want[name]
        assert rx.arrays[name].tobytes() == q.tobytes(), name
        got = rx.arrays[name + "_scale_inv"]
        assert got.view(np.uint32).tobytes() == s.view(np.uint32).tobytes(), name
    return r


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_seed_and_deltas_equal_the_torch_quantizer_on_every_kind_of_block():
    rng = np.random.default_rng(2026)
    shapes = {"proj.weight": (300, 257), "experts.w13_weight": (3, 130, 64), "tiny.weight": (1, 1)}
    table = dc.SlotTable(
        [(k, "f8_e4m3", s) for k, s in shapes.items()]
        + [(k + "_scale_inv", "f32", (*s[:-2], -(-s[-2] // BLOCK), -(-s[-1] // BLOCK))) for k, s in shapes.items()]
    )
    sender = dc.Sender(table, chunk_elems=4096)
    rx = dc.Receiver(table, table.zeros())
    w = {k: masters(rng, s) for k, s in shapes.items()}
    last = None
    for step in range(5):
        if step:
            for k, x in w.items():
                x += np.float32(1e-4) * rng.standard_normal(x.shape).astype(np.float32) * np.abs(x)
            if step == 2:
                w["proj.weight"][5, 5] = np.nan
                w["experts.w13_weight"][1, 3, 3] = np.inf
                w["experts.w13_weight"][2, 3, 3] = -np.inf
            if step == 3:
                w["proj.weight"][5, 5] = 0.25
        want = {k: reference(torch.from_numpy(x)) for k, x in w.items()}
        # Scale slots: None in a dict, or left out.
        arrays = dict(w)
        if step % 2:
            arrays.update({k + "_scale_inv": None for k in w})
        r = sync_and_check(sender, rx, arrays, list(w), want)
        if last is not None:
            moved = sum(
                int((q != last[k][0]).sum()) + int((s.view(np.uint32) != last[k][1].view(np.uint32)).sum())
                for k, (q, s) in want.items()
            )
            assert r.kind == "delta" and r.changed == moved
            assert 0 < moved < sum(x.size for x in w.values()) / 2
        if step == 2:  # the pinned forms were compared above; make sure they were there
            assert want["proj.weight"][1].view(np.uint32)[0, 0] == 0x7FC00000
            assert np.isinf(want["experts.w13_weight"][1][1:, 0, 0]).all()
        last = want


def test_the_torch_quantizer_equals_vllms_on_finite_blocks():
    from vllm.utils.deep_gemm import per_block_cast_to_fp8

    rng = np.random.default_rng(7)
    for shape in [(128, 128), (300, 257), (129, 1), (1, 385)]:
        x = masters(rng, shape)
        q, s = reference(torch.from_numpy(x))
        vq, vs = per_block_cast_to_fp8(torch.from_numpy(x), [BLOCK, BLOCK], use_ue8m0=False)
        assert vq.view(torch.uint8).numpy().tobytes() == q.tobytes(), shape
        assert vs.numpy().view(np.uint32).tobytes() == s.view(np.uint32).tobytes(), shape
        # And deltacast's seed equals both.
        table = dc.SlotTable([("w", "f8_e4m3", shape), ("w_scale_inv", "f32", tuple(vs.shape))])
        rx = dc.Receiver(table, table.zeros())
        for f in dc.Sender(table).sync({"w": x}).frames:
            rx.receive(f)
        assert rx.arrays["w"].tobytes() == q.tobytes(), shape
        assert rx.arrays["w_scale_inv"].tobytes() == s.tobytes(), shape


def test_every_e4m3_rounding_case_against_torch():
    """One block per probe set: x · (1 / scale) hits every E4M3FN value, every midpoint and
    its fp32 neighbours, subnormals and the saturation edge; deltacast equals torch."""
    grid = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    mids = (grid[:-1] + grid[1:]) / 2
    near = torch.cat([mids, torch.nextafter(mids, torch.tensor(0.0)), torch.nextafter(mids, torch.tensor(1e9))])
    probes = torch.cat([grid, near, -grid, -near, torch.tensor([448.0, -448.0])])
    # A second row of 448s: every block's amax is 448, so the scale is 1 and x · inv = x.
    n = probes.numel()
    x = torch.full((2, n), 448.0)
    x[0] = probes
    q, s = reference(x)
    assert s.view(np.uint32).ravel().tolist() == [0x3F800000] * s.size
    assert q[0].tolist() == probes.to(torch.float8_e4m3fn).view(torch.uint8).tolist()
    table = dc.SlotTable([("w", "f8_e4m3", (2, n)), ("w_scale_inv", "f32", s.shape)])
    rx = dc.Receiver(table, table.zeros())
    for f in dc.Sender(table).sync({"w": x.numpy()}).frames:
        rx.receive(f)
    assert rx.arrays["w"].tobytes() == q.tobytes()


def test_a_scale_slot_given_bits_of_its_own_is_refused():
    table = dc.SlotTable([("w", "f8_e4m3", (4, 4)), ("w_scale_inv", "f32", (1, 1))])
    with pytest.raises(dc.SlotMismatchError, match="no source of its own"):
        dc.Sender(table).sync({"w": np.ones((4, 4), np.float32), "w_scale_inv": np.ones((1, 1), np.float32)})
