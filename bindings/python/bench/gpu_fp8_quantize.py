"""Block-FP8 quantization on the GPU: deltacast's kernel (what a GpuSender with FP8 wire dtypes
runs before each sync) against the same rule in plain torch ops and against a device copy of
the fp32 bytes, on the projections of a Qwen2.5-0.5B- or 3B-shaped model, side by side in one
run (CUDA events, median of --reps). Each rep checks the kernel's bits against torch's.

    python bindings/python/bench/gpu_fp8_quantize.py --model 0.5b --reps 10 --out DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from deltacast import _native

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from fp8_reference import reference  # noqa: E402

# (hidden, intermediate, layers, heads, kv heads) of the Qwen2.5 models.
SHAPES = {"0.5b": (896, 4864, 24, 14, 2), "3b": (2048, 11008, 36, 16, 2)}


def projections(model: str) -> list[tuple[int, int]]:
    h, i, layers, heads, kv = SHAPES[model]
    head = h // heads
    one = [(h, h), (kv * head, h), (kv * head, h), (h, h), (i, h), (i, h), (h, i)]
    return one * layers


def timed(fn, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(SHAPES), default="0.5b")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    torch.manual_seed(0)
    src = [torch.randn(s, device="cuda") * 0.02 for s in projections(a.model)]
    q = [torch.empty(s.shape, dtype=torch.uint8, device="cuda") for s in src]
    sc = [torch.empty((-(-s.shape[0] // 128), -(-s.shape[1] // 128)), device="cuda") for s in src]
    quant = _native.Fp8Quantizer(0, [(s.data_ptr(), d.data_ptr(), c.data_ptr(), list(s.shape))
                                     for s, d, c in zip(src, q, sc)])
    stream = torch.cuda.current_stream().cuda_stream
    copies = [torch.empty_like(s) for s in src]

    def kernel():
        quant.run(stream)

    def plain_torch():
        for s in src:
            reference(s)

    def copy():
        for s, c in zip(src, copies):
            c.copy_(s)

    for f in (kernel, plain_torch, copy):  # warm-up
        f()
    runs = {"deltacast kernel": [], "plain torch": [], "fp32 device copy": []}
    for _ in range(a.reps):
        runs["deltacast kernel"] += timed(kernel, 1)
        runs["plain torch"] += timed(plain_torch, 1)
        runs["fp32 device copy"] += timed(copy, 1)
        for s, d, c in zip(src[:7], q, sc):  # one layer checked each rep
            wq, ws = reference(s)
            assert torch.equal(d, wq) and torch.equal(c.view(torch.int32), ws.view(torch.int32))
    elements = sum(s.numel() for s in src)
    med = {k: statistics.median(v) for k, v in runs.items()}
    result = {
        "model": a.model,
        "elements": elements,
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "median_ms": med,
        "all_ms": runs,
        "kernel_over_copy": med["deltacast kernel"] / med["fp32 device copy"],
        "kernel_over_torch": med["deltacast kernel"] / med["plain torch"],
    }
    print(json.dumps({k: v for k, v in result.items() if k != "all_ms"}, indent=1))
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / f"fp8_quantize_{a.model}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
