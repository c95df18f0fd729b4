#!/usr/bin/env python3
"""Regenerates crates/deltacast/tests/data/torch_placements.txt, the golden DTensor layouts of
crates/deltacast/tests/sharded_oracle.rs (`matches_torch_compute_local_shape_and_global_offset`).

Golden placements from torch itself: for each layout, every rank's (local_shape, global_offset)
from torch's _compute_local_shape_and_global_offset, and the indices each rank really holds per
dim, from the placements' own _split_tensor on an arange (what distribute_tensor does).

One line per layout: `shape;mesh;placements;ranks`, dims joined by `x` (an empty shape is
empty), placements `R` (Replicate), `S<dim>` (Shard) or `T<dim>/<split_factor>` (_StridedShard)
joined by `,`, and per rank in row-major mesh order `local_shape@global_offset`, with `!` where
the indices that rank holds are not one contiguous range per dim.

Usage (CPU only, no GPU or process group needed; torch from PyPI, e.g. in a venv:
`python3 -m venv /tmp/torch && /tmp/torch/bin/pip install torch==2.11.0`):

    /tmp/torch/bin/python scripts/torch-placements.py 1 crates/deltacast/tests/data/torch_placements.txt

The arguments are the seed of the random layouts (1) and the output file. With torch 2.11.0
(2.11.0+cu130 from PyPI) this reproduces the committed file byte for byte (checked when the file
was moved out of the test). Other versions may differ where torch's layouts changed; the test
then says which layout and rank. It prints the torch version, the private function's signature,
any SIZE/OFFSET MISMATCH between torch's answer and the indices held, and the case count (900)
to stderr.
"""
import random, sys, inspect, torch
from torch.distributed.tensor.placement_types import Shard, Replicate, _StridedShard
from torch.distributed.tensor import _utils as U

def enc_p(p):
    if isinstance(p, _StridedShard): return f"T{p.dim}/{p.split_factor}"
    if isinstance(p, Shard): return f"S{p.dim}"
    return "R"

def held(shape, mesh, coord, pls, t):
    idx = torch.arange(shape[t])
    for m, p in enumerate(pls):
        if isinstance(p, Shard) and p.dim == t:   # _StridedShard is matched too where it subclasses
            v = idx.view([1] * t + [idx.numel()] + [1] * (len(shape) - t - 1))
            parts, _ = p._split_tensor(v, mesh[m], with_padding=False, contiguous=True)
            idx = parts[coord[m]].reshape(-1)
        elif isinstance(p, _StridedShard) and p.dim == t:
            v = idx.view([1] * t + [idx.numel()] + [1] * (len(shape) - t - 1))
            parts, _ = p._split_tensor(v, mesh[m], with_padding=False, contiguous=True)
            idx = parts[coord[m]].reshape(-1)
    return idx.tolist()

def coords(mesh):
    out = [[]]
    for s in mesh:
        out = [c + [i] for c in out for i in range(s)]
    return out

def divisors(n): return [d for d in range(1, n + 1) if n % d == 0]

rng = random.Random(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
cases = set()
for world in range(1, 9):
    for tp in divisors(world):
        for n in list(range(0, 14)) + [25, 31]:
            cases.add(((n, 3), (world // tp, tp), (_StridedShard(0, split_factor=tp), Shard(0))))
            cases.add(((n, 3), (world // tp, tp), (Shard(0), Shard(0))))
        for n in range(0, 10):
            cases.add(((n,), (world,), (Shard(0),)))
while len(cases) < 900:
    world = rng.randint(1, 8)
    mesh = []
    left = world
    for _ in range(rng.randint(0, 2)):
        f = rng.choice(divisors(left)); mesh.append(f); left //= f
    mesh.append(left)
    nd = rng.randint(1, 3)
    shape = tuple(rng.randint(0, 13) for _ in range(nd))
    pls = []
    for m in mesh:
        k = rng.random(); d = rng.randrange(nd)
        if k < 0.15: pls.append(Replicate())
        elif k < 0.45: pls.append(_StridedShard(d, split_factor=rng.randint(1, 4)))
        else: pls.append(Shard(d))
    cases.add((shape, tuple(mesh), tuple(pls)))

sig = inspect.signature(U._compute_local_shape_and_global_offset)
print("# torch", torch.__version__, "sig", sig, file=sys.stderr)
lines = []
for shape, mesh, pls in sorted(cases, key=repr):
    ranks = []
    for c in coords(mesh):
        ls, off = U._compute_local_shape_and_global_offset(list(shape), list(mesh), list(c), list(pls))
        cont = True
        for t in range(len(shape)):
            h = held(shape, mesh, c, pls, t)
            if h != list(range(h[0], h[0] + len(h))) if h else False: cont = False
            if len(h) != ls[t]: cont = False; print("SIZE MISMATCH", shape, mesh, pls, c, t, h, ls, file=sys.stderr)
            if h and h[0] != off[t]: print("OFFSET MISMATCH", shape, mesh, pls, c, t, h, off, file=sys.stderr)
        ranks.append("x".join(map(str, ls)) + "@" + "x".join(map(str, off)) + ("" if cont else "!"))
    lines.append(";".join(["x".join(map(str, shape)), "x".join(map(str, mesh)), ",".join(enc_p(p) for p in pls), " ".join(ranks)]))
open(sys.argv[2], "w").write("\n".join(lines) + "\n")
print(len(lines), "cases", file=sys.stderr)
