"""Block FP8 written from its rule in plain torch, the oracle of the FP8 tests (the CPU
Sender's in tests/engines/test_vllm_fp8.py, the GPU quantizer's in test_cuda_fp8.py): per
128x128 block of the last two dimensions, amax at least 1e-4, scale = amax / 448,
``x * (1 / scale)`` clamped to ±448 and cast by torch's ``.to(float8_e4m3fn)``; every NaN
0x7F, and a block holding a NaN: scale 0x7FC00000, elements 0x7F."""

from __future__ import annotations

import numpy as np

BLOCK = 128


def reference(x):
    """(FP8 bits as a uint8 tensor, scales as a float32 tensor) of fp32 tensor ``x`` (at least
    2-D), on ``x``'s device."""
    import torch

    *lead, m, n = x.shape
    rb, cb = -(-m // BLOCK), -(-n // BLOCK)
    pad = torch.zeros((*lead, rb * BLOCK, cb * BLOCK), dtype=torch.float32, device=x.device)
    pad[..., :m, :n] = x
    blocks = pad.reshape(*lead, rb, BLOCK, cb, BLOCK)
    nan = torch.isnan(blocks).any(dim=-1).any(dim=-2)
    # amax with NaN left out (NaN blocks are pinned below); padding zeros never raise it.
    amax = torch.where(torch.isnan(blocks), 0.0, blocks).abs().amax(dim=(-1, -3)).clamp(min=1e-4)
    # A tensor divisor, not a Python number: CUDA torch computes ``t / 448.0`` as
    # ``t * fp32(1/448)``, which differs from the division in the last bit for some amax.
    scale = amax / torch.tensor(448.0, dtype=torch.float32, device=x.device)
    inv = 1.0 / scale
    scaled = (blocks * inv[..., :, None, :, None]).clamp(-448.0, 448.0)
    q = scaled.to(torch.float8_e4m3fn).view(torch.uint8)
    # Every NaN is 0x7F (torch keeps the NaN's sign, which ∞ · 0 leaves to the platform).
    q[torch.isnan(scaled)] = 0x7F
    q[nan[..., :, None, :, None].expand_as(q)] = 0x7F
    q = q.reshape(pad.shape)[..., :m, :n].contiguous()
    bits = scale.view(torch.int32)
    bits[nan] = 0x7FC00000
    return q, scale


def masters(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    """fp32 weights of many magnitudes, with adversarial blocks: all zero, tiny (amax under
    the floor), fp32 subnormals, amax a power of two times 448, values that scale onto E4M3FN
    ties."""
    x = (rng.standard_normal(shape) * 10.0 ** rng.integers(-6, 3, shape)).astype(np.float32)
    flat = x.reshape(-1, *shape[-2:])
    m, n = shape[-2:]
    if m >= BLOCK and n >= 2:
        flat[0, :BLOCK, : min(n, BLOCK)] = 0.0
    if m > BLOCK and n > BLOCK:
        flat[0, BLOCK:, BLOCK:] *= 1e-7
    flat[-1, -1, :] = np.float32(1e-42) * rng.integers(-5, 5, n).astype(np.float32)
    # amax 448 · 2^-3: the scale is exact, so x · inv lands on ties of the E4M3FN grid.
    flat[-1, 0, 0] = 56.0
    ties = np.array([0.5 + 1 / 32, 17.0, 208.0, 2.0**-10 * 3, -(2.0**-8) * 1.5], dtype=np.float32)
    flat[-1, 0, 1 : 1 + len(ties)] = ties[: n - 1] / 8
    return x
