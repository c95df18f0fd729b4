"""Python overhead per sync: wall time of `Sender.sync` / `Receiver.receive` seen from Python
against the time spent inside the Rust core (`rust_seconds`), on a synthetic BF16 model.

    python bench/overhead.py [--elements 80e6] [--steps 6] [--changed 0.02]
                             [--bucket-size 512e6] [--frame-type bytes|numpy] [--json]

The overhead is (python wall - rust_seconds) / python wall; it includes argument checks,
releasing and retaking the GIL, and copying frames into `bytes` (none with numpy frames).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

import deltacast as dc


def build(elements: float, hidden: int = 768):
    """A GPT-like stack of BF16 tensors (as uint16 bits) with about `elements` elements."""
    shapes = {"embed.weight": (32000, hidden)}
    per_layer = {
        "attn.q.weight": (hidden, hidden), "attn.k.weight": (hidden, hidden),
        "attn.v.weight": (hidden, hidden), "attn.o.weight": (hidden, hidden),
        "mlp.up.weight": (4 * hidden, hidden), "mlp.down.weight": (hidden, 4 * hidden),
        "attn.q.bias": (hidden,), "mlp.up.bias": (4 * hidden,),
        "ln1.weight": (hidden,), "ln2.weight": (hidden,),
    }
    layer = sum(int(np.prod(s)) for s in per_layer.values())
    layers = max(1, int((elements - 32000 * hidden) // layer))
    for i in range(layers):
        for k, s in per_layer.items():
            shapes[f"layers.{i}.{k}"] = s
    shapes["norm.weight"] = (hidden,)
    rng = np.random.default_rng(0)
    arrays = {}
    for name, s in shapes.items():
        # Plausible BF16 weights: small normals, truncated to their upper 16 bits.
        w = (rng.standard_normal(s, dtype=np.float32) * 0.02).view(np.uint32)
        arrays[name] = (w >> 16).astype(np.uint16)
    table = dc.SlotTable([dc.Slot(n, "bf16", s) for n, s in shapes.items()])
    return table, arrays


def step(rng, arrays, fraction):
    """±1 ULP on `fraction` of each tensor's elements (what an AdamW step mostly does)."""
    for a in arrays.values():
        flat = a.reshape(-1)
        k = max(1, int(flat.size * fraction))
        idx = rng.choice(flat.size, size=k, replace=False)
        flat[idx] += rng.choice(np.array([1, 0xFFFF], dtype=np.uint16), size=k)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--elements", type=float, default=80e6)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--changed", type=float, default=0.02)
    ap.add_argument("--bucket-size", type=float, default=dc.DEFAULT_BUCKET_SIZE)
    ap.add_argument("--frame-type", choices=["bytes", "numpy"], default="bytes")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    table, src = build(args.elements)
    sender = dc.Sender(table, bucket_size=int(args.bucket_size), frame_type=args.frame_type)
    receiver = dc.Receiver(table, table.zeros())
    rng = np.random.default_rng(1)
    rows = []
    for i in range(args.steps + 1):
        if i:
            step(rng, src, args.changed)
        t0 = time.perf_counter()
        result = sender.sync(src)
        send_wall = time.perf_counter() - t0
        recv_wall = 0.0
        for f in result.frames:
            t0 = time.perf_counter()
            outcome = receiver.receive(f)
            recv_wall += time.perf_counter() - t0
        assert outcome is not None and outcome.state_digest == result.state_digest
        recv_rust = outcome.rust_seconds  # summed over the sync's flushes
        rows.append({
            "kind": result.kind, "changed_ratio": result.changed_ratio,
            "wire_bytes": result.wire_bytes, "flushes": result.flushes,
            "send_wall_s": send_wall, "send_rust_s": result.rust_seconds,
            "send_overhead": (send_wall - result.rust_seconds) / send_wall,
            "recv_wall_s": recv_wall, "recv_rust_s": recv_rust,
            "recv_overhead": (recv_wall - recv_rust) / recv_wall,
        })
        if args.json:
            print(json.dumps(rows[-1]))
        else:
            r = rows[-1]
            print(f"{r['kind']:5} changed {r['changed_ratio']:.3%} wire {r['wire_bytes'] / 1e6:8.2f} MB "
                  f"send {r['send_wall_s'] * 1e3:8.2f} ms (rust {r['send_rust_s'] * 1e3:8.2f}, overhead {r['send_overhead']:.2%}) "
                  f"recv {r['recv_wall_s'] * 1e3:8.2f} ms (rust {r['recv_rust_s'] * 1e3:8.2f}, overhead {r['recv_overhead']:.2%})")
    deltas = [r for r in rows if r["kind"] == "delta"]
    summary = {
        "frame_type": args.frame_type,
        "elements": table.total_elements, "tensors": len(table),
        "median_delta_send_overhead": statistics.median(r["send_overhead"] for r in deltas),
        "median_delta_recv_overhead": statistics.median(r["recv_overhead"] for r in deltas),
        "seed_send_overhead": rows[0]["send_overhead"],
        "median_delta_send_wall_ms": statistics.median(r["send_wall_s"] for r in deltas) * 1e3,
        "median_delta_overhead_ms": statistics.median(r["send_wall_s"] - r["send_rust_s"] for r in deltas) * 1e3,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
