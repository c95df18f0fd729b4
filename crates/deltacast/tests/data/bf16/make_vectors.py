"""Writes torch_f32_to_bf16.bin: fp32 bit patterns and torch's bf16 results for them.

Run with a Python that has torch and numpy:  python make_vectors.py [--exhaustive]
Layout (little-endian): u32 count n, then n u32 inputs, then n u16 from a contiguous
`.to(torch.bfloat16)` (the vectorised CPU kernel), then n u16 from a strided one (the scalar
kernel). --exhaustive also checks every one of the 2^32 patterns against the rule the Rust
side implements (round to nearest even; NaN -> 0xFFFF vectorised, 0x7FC0 scalar) and prints
the result; it writes nothing more.
"""
import sys
import numpy as np
import torch

def contiguous(bits):
    t = torch.from_numpy(bits.view(np.float32))
    return t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)

def strided(bits):
    # Every other element of a doubled buffer: not contiguous, so the scalar loop runs.
    doubled = np.repeat(bits, 2)
    t = torch.from_numpy(doubled.view(np.float32))[::2]
    assert not t.is_contiguous()
    return t.to(torch.bfloat16).contiguous().view(torch.int16).numpy().view(np.uint16)

def rule(bits, nan):
    b = bits.astype(np.uint64)
    r = ((b + ((b >> 16) & 1) + 0x7FFF) >> 16).astype(np.uint16)
    is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
    return np.where(is_nan, np.uint16(nan), r)

def inputs():
    rng = np.random.default_rng(20261202)
    parts = []
    hi = np.arange(1 << 16, dtype=np.uint32) << 16
    # Every sign/exponent/upper-mantissa pattern at and around the rounding tie, and exact.
    for low in (0x7FFF, 0x8000, 0x8001):
        parts.append(hi | low)
    # NaNs of every sign and many payloads, ±Inf, ±0, subnormal extremes, max finite.
    edges = [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x00000001, 0x80000001,
             0x007FFFFF, 0x807FFFFF, 0x00008000, 0x00018000, 0x007F8000, 0x00800000,
             0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F7FFF, 0x7F7F8000, 0x7F7F8001, 0x7FC00000,
             0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FBFFFFF]
    parts.append(np.array(edges, dtype=np.uint32))
    parts.append(rng.integers(0, 1 << 32, size=60_000, dtype=np.uint64).astype(np.uint32))
    nan_payload = rng.integers(1, 1 << 23, size=4096, dtype=np.uint32)
    sign = rng.integers(0, 2, size=4096, dtype=np.uint32) << 31
    parts.append(sign | 0x7F800000 | nan_payload)
    normals = rng.standard_normal(30_000).astype(np.float32).view(np.uint32)
    parts.append(normals)
    return np.concatenate(parts)

def exhaustive():
    step = 1 << 26
    bad = 0
    for start in range(0, 1 << 32, step):
        bits = np.arange(start, start + step, dtype=np.uint64).astype(np.uint32)
        bad += int((contiguous(bits) != rule(bits, 0xFFFF)).sum())
        bad += int((strided(bits) != rule(bits, 0x7FC0)).sum())
    print(f"exhaustive: {bad} mismatches over 2^32 patterns x 2 kernels")

if __name__ == "__main__":
    print("torch", torch.__version__, "capability", torch.backends.cpu.get_cpu_capability())
    if "--exhaustive" in sys.argv:
        exhaustive()
        sys.exit(0)
    x = inputs()
    c, s = contiguous(x), strided(x)
    print(len(x), "patterns; contiguous vs rule mismatches:", int((c != rule(x, 0xFFFF)).sum()),
          "strided vs rule:", int((s != rule(x, 0x7FC0)).sum()))
    with open("torch_f32_to_bf16.bin", "wb") as f:
        f.write(np.uint32(len(x)).tobytes())
        f.write(x.astype("<u4").tobytes())
        f.write(c.astype("<u2").tobytes())
        f.write(s.astype("<u2").tobytes())
