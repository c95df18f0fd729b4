"""Shared helpers: random bit patterns per dtype (NaN payloads, ±0, infinities, subnormals
included, since they are just bits) and small models."""

from __future__ import annotations

import numpy as np
import pytest

import deltacast as dc

# The numpy dtype that carries each slot dtype's bits in these tests.
CARRIER = {
    "bf16": np.uint16,
    "f16": np.float16,
    "f32": np.float32,
    "f8_e4m3": np.uint8,
    "f8_e5m2": np.uint8,
}
BITS = {np.uint16: np.uint16, np.float16: np.uint16, np.float32: np.uint32, np.uint8: np.uint8}


def random_array(rng: np.random.Generator, dtype: str, shape) -> np.ndarray:
    """Uniformly random bit patterns viewed as the carrier dtype."""
    carrier = CARRIER[dtype]
    bits = BITS[carrier]
    raw = rng.integers(0, np.iinfo(bits).max, size=shape, dtype=bits, endpoint=True)
    return raw.view(carrier)


def bits_of(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(bits_of(a), bits_of(b))


def perturb(rng: np.random.Generator, a: np.ndarray, fraction: float) -> None:
    """Changes about `fraction` of the elements in place: mostly ±1 in the bit pattern (a ULP
    step), some random patterns, so both value codecs get work."""
    flat = a.reshape(-1).view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.itemsize])
    n = flat.size
    k = max(1, int(n * fraction)) if n else 0
    if k == 0:
        return
    idx = rng.choice(n, size=min(k, n), replace=False)
    step = rng.choice(np.array([1, flat.dtype.type(-1 % (1 << (8 * a.itemsize)))], dtype=flat.dtype), size=idx.size)
    flat[idx] = flat[idx] + step
    wild = idx[: max(1, idx.size // 10)]
    flat[wild] = rng.integers(0, np.iinfo(flat.dtype).max, size=wild.size, dtype=flat.dtype, endpoint=True)


def model(rng: np.random.Generator, dtypes=("bf16", "f16", "f32", "f8_e4m3", "f8_e5m2")):
    """A small model: one 2-D weight and one vector per dtype, plus a scalar and an empty slot."""
    slots, arrays = [], {}
    for i, d in enumerate(dtypes):
        for name, shape in ((f"layer{i}.weight", (37, 29)), (f"layer{i}.bias", (41,))):
            slots.append(dc.Slot(name, d, shape))
            arrays[name] = random_array(rng, d, shape)
    slots.append(dc.Slot("scale", "f32", ()))
    arrays["scale"] = np.array(1.5, dtype=np.float32)
    slots.append(dc.Slot("empty", "bf16", (0, 8)))
    arrays["empty"] = np.zeros((0, 8), dtype=np.uint16)
    return dc.SlotTable(slots), arrays


def deliver(receiver: dc.Receiver, frames) -> dc.SyncOutcome:
    outcome = None
    for i, f in enumerate(frames):
        got = receiver.receive(f)
        if i + 1 < len(frames):
            assert got is None, "a sync completed before its final flush"
        outcome = got
    assert outcome is not None
    return outcome


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12345)
