#!/usr/bin/env python3
"""How far a coder over a few exponent classes could go below the iid bound (issue 28).

A coder that touches only the changes — per class, the gaps between changed elements in that
class's subsequence — needs few classes to be fast. This prints, for the recorded trace in the
repository, the ideal cost of such a model against the iid bound of docs/codecs.md: per tensor,
the exponent byte of each old element maps to one of K classes (exponents grouped by their
change rate, quantized on a log scale; the map travels at log2 K bits per exponent present, and
each class's count at 20 bits); positions cost Σ_class n·H(k/n), values the empirical entropy of
the ULP step within each class. `K = 256` is every exponent its own class (the `ctx` model
without its adaptation). Ideal costs: a real coder adds its own overhead on top.

    target/pyenv/bin/python scripts/ctx_class_bound.py   # numpy only
"""
import json
import struct
from pathlib import Path

import numpy as np

TRACES = Path(__file__).resolve().parent.parent / "crates/deltacast/tests/data/traces"


def load(path):
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8 : 8 + n])
    dtypes = {"BF16": np.uint16, "I32": np.int32}
    out = {}
    for key, v in head.items():
        if key != "__metadata__":
            s, e = v["data_offsets"]
            out[key] = np.frombuffer(raw[8 + n + s : 8 + n + e], dtype=dtypes[v["dtype"]])
    return out


def h(p):
    p = np.clip(p, 1e-300, 1 - 1e-16)
    return -(p * np.log2(p) + (1 - p) * np.log2(1 - p))


def entropy(x):
    _, c = np.unique(x, return_counts=True)
    return float(-(c * np.log2(c / c.sum())).sum())


def ordered(b):
    b = b.astype(np.int64)
    return np.where(b & 0x8000, (~b) & 0xFFFF, b | 0x8000)


def class_map(expo, idx, k):
    """Exponent byte -> class, grouping exponents by their change rate (log scale)."""
    cnt = np.bincount(expo, minlength=256)
    chg = np.bincount(expo[idx], minlength=256)
    present = np.flatnonzero(cnt)
    if k >= 256:
        return np.arange(256), 0.0
    rate = np.log2((chg[present] + 0.5) / (cnt[present] + 1))
    lo, hi = rate.min(), rate.max()
    cls = np.minimum(((rate - lo) / max(hi - lo, 1e-9) * k).astype(int), k - 1)
    emap = np.zeros(256, dtype=int)
    emap[present] = cls
    return emap, len(present) * np.log2(k) + k * 20


def main():
    base = load(TRACES / "trace_dense_lr1e-06_base.safetensors")
    steps = load(TRACES / "trace_dense_lr1e-06.safetensors")
    ks = (4, 8, 16, 256)
    state = {key.split("::", 1)[1]: v.copy() for key, v in base.items()}
    totals = dict.fromkeys(("iid",) + ks, 0.0)
    print("step  iid bound   " + "  ".join(f"K={k:<3} / iid" for k in ks))
    for step in range(1, 9):
        cost = dict.fromkeys(("iid",) + ks, 0.0)
        for name, cur in state.items():
            key = f"step{step}::{name}::idx"
            if key not in steps:
                continue
            idx = steps[key].astype(np.int64)
            new = steps[f"step{step}::{name}::val"]
            d = ordered(new) - ordered(cur[idx])
            n = cur.size
            cost["iid"] += n * h(len(idx) / n) + entropy(d)
            expo = ((cur >> 7) & 0xFF).astype(int)
            for k in ks:
                emap, params = class_map(expo, idx, k)
                c = emap[expo]
                cn = np.bincount(c, minlength=k)
                ck = np.bincount(c[idx], minlength=k)
                m = cn > 0
                bits = float((cn[m] * h(ck[m] / cn[m])).sum()) + params
                ci = c[idx]
                bits += sum(entropy(d[ci == cc]) for cc in np.unique(ci))
                cost[k] += bits
            cur[idx] = new
        for key in totals:
            totals[key] += cost[key]
        print(f"{step:>4}  {cost['iid'] / 8e3:7.1f} kB  " + "  ".join(f"{cost[k] / cost['iid']:11.3f}" for k in ks))
    print("all   " + f"{totals['iid'] / 8e3:7.1f} kB  " + "  ".join(f"{totals[k] / totals['iid']:11.3f}" for k in ks))


if __name__ == "__main__":
    main()
