"""fp32 masters into bf16 slots: ``Sender.sync`` takes float32 arrays for bf16 slots and
rounds them during the diff. Oracle: round-to-nearest-even written here in numpy (NaN → the
documented 0xFFFF of torch's contiguous CPU kernel), and torch itself when it is installed."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import deltacast as dc

EDGES = np.array(
    [
        0x00000000, 0x80000000,  # ±0
        0x00000001, 0x807FFFFF, 0x00008000, 0x00018000,  # fp32 subnormals, ties among them
        0x7F800000, 0xFF800000,  # ±inf
        0x7FC00000, 0x7F800001, 0xFFC00123, 0x7FFFFFFF,  # NaNs with payloads and signs
        0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF,  # max finite (rounds to inf), its tie, below it
        0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF,  # ties to even, and either side
        0x00800000, 0x007FFFFF, 0x007F8000,  # smallest normal, largest subnormal, rounding up
    ],
    dtype=np.uint32,
)


def rne_bf16(x: np.ndarray) -> np.ndarray:
    """bf16 bits of float32 ``x``: round to nearest, ties to even; every NaN → 0xFFFF."""
    u = x.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    rounded[(u & 0x7FFFFFFF) > 0x7F800000] = 0xFFFF
    return rounded


def fp32_with_edges(rng: np.random.Generator, n: int) -> np.ndarray:
    x = (rng.standard_normal(n) * 10.0 ** rng.integers(-40, 38, n)).astype(np.float32)
    if n:
        k = min(n, len(EDGES))
        x.view(np.uint32)[rng.choice(n, k, replace=False)] = EDGES[:k]
    return x


def test_the_oracle_itself_on_hand_checked_values():
    got = rne_bf16(EDGES.view(np.float32))
    want = [0x0000, 0x8000, 0x0000, 0x8080, 0x0000, 0x0002, 0x7F80, 0xFF80, 0xFFFF, 0xFFFF,
            0xFFFF, 0xFFFF, 0x7F80, 0x7F80, 0x7F7F, 0x3F80, 0x3F82, 0x3F81, 0x3F80, 0x0080,
            0x0080, 0x0080]
    assert [int(v) for v in got] == want


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # inf and NaN arithmetic, on purpose
@pytest.mark.parametrize("n", [0, 1, 7, 4095, 4096, 4097, 100_003])
def test_seed_and_deltas_from_fp32_equal_the_rounding(n):
    rng = np.random.default_rng(n)
    table = dc.SlotTable([("w", "bf16", (n,)), ("norm", "f32", (3,))])
    sender = dc.Sender(table, chunk_elems=1024)
    rx = dc.Receiver(table, table.zeros())
    w = fp32_with_edges(rng, n)
    norm = np.array([1.0, -0.0, np.nan], dtype=np.float32)
    last = None
    for step in range(4):
        if step:
            moved = rng.random(n) < 0.1
            w[moved] += np.float32(1e-3) * rng.standard_normal(int(moved.sum())).astype(np.float32)
            if n and step == 2:
                w[0] = np.nan
        r = sender.sync({"w": w, "norm": norm})
        for f in r.frames:
            o = rx.receive(f)
        want = rne_bf16(w)
        assert rx.arrays["w"].tobytes() == want.tobytes()
        assert rx.arrays["norm"].tobytes() == norm.tobytes()
        assert o.state_digest == r.state_digest
        if last is not None:
            assert r.kind == "delta" and r.changed == int((want != last).sum())
        last = want.copy()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_the_fp32_sync_matches_a_bf16_sync_of_the_rounded_values():
    rng = np.random.default_rng(5)
    table = dc.SlotTable([("w", "bf16", (999,))])
    a, b = dc.Sender(table), dc.Sender(table)
    w = fp32_with_edges(rng, 999)
    for step in range(3):
        w[rng.random(999) < 0.2] *= np.float32(1.001)
        ra, rb = a.sync({"w": w}), b.sync({"w": rne_bf16(w)})
        assert (ra.kind, ra.changed, ra.state_digest) == (rb.kind, rb.changed, rb.state_digest)
        assert [bytes(f) for f in ra.frames] == [bytes(f) for f in rb.frames]


def test_resend_seed_from_the_snapshot_after_fp32_syncs():
    rng = np.random.default_rng(9)
    table = dc.SlotTable([("w", "bf16", (300,))])
    sender = dc.Sender(table)
    w = fp32_with_edges(rng, 300)
    sender.sync({"w": w})
    w[:50] += np.float32(0.5)
    sender.sync({"w": w})
    late = dc.Receiver(table, table.zeros())
    for f in sender.resend_seed().frames:
        o = late.receive(f)
    assert o.version == 2 and late.arrays["w"].tobytes() == rne_bf16(w).tobytes()
    with pytest.raises(dc.InvalidArgumentError, match="own dtype"):
        sender.resend_seed({"w": w})


def test_other_sources_are_refused():
    table = dc.SlotTable([("w", "bf16", (4,)), ("f", "f16", (4,))])
    sender = dc.Sender(table)
    ok = {"w": np.zeros(4, np.uint16), "f": np.zeros(4, np.float16)}
    for bad in (
        {"w": np.zeros(4, np.float16)},  # a float16 array would be reinterpreted
        {"w": np.zeros(4, np.float64)},
        {"w": np.zeros(5, np.float32)},  # wrong shape
        {"f": np.zeros(4, np.float32)},  # fp32 → f16 does not convert
    ):
        with pytest.raises(dc.InvalidArgumentError):
            sender.sync({**ok, **bad})
    assert sender.sync(ok).kind == "seed"


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_against_torch():
    import torch

    rng = np.random.default_rng(11)
    w = fp32_with_edges(rng, 50_001)
    table = dc.SlotTable([("w", "bf16", (50_001,))])
    rx = dc.Receiver(table, table.zeros())
    for f in dc.Sender(table).sync({"w": torch.from_numpy(w)}).frames:
        rx.receive(f)
    want = torch.from_numpy(w).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert rx.arrays["w"].tobytes() == want.tobytes()
