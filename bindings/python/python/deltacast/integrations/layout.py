"""Engine layouts learned from the engine's own loader, and an apply through them.

An inference engine does not keep Hugging Face tensors as they are: on tensor-parallel rank r of
T it fuses q/k/v rows into one parameter, keeps only its share of rows or columns, stacks
experts, pads the vocabulary. Instead of a hand-written table per architecture, ``learn_layout``
asks the engine: it feeds the model's own ``load_weights`` fp32 tensors whose every element
encodes its own HF slot and position, reads the parameters back and decodes, for each element of
each engine parameter, which HF element landed there. Runs of consecutive elements are folded
into strided blocks, so the result is small plain data (``EngineLayout.to_json``) that a
receiver applies through (``layout_apply``): work per changed HF element, not per tensor.

Encoding (exact in fp32, any model size): a slot pass stores ``-(slot index + 1)`` in every
element of a slot; position passes store one 23-bit digit of the element's flat index, plus 1
(positive). Before every pass each parameter is filled with NaN, so an element the loader does
not write reads back as NaN. An element written with the same value in every pass comes from
no HF element (e.g. zeroed vocabulary padding). Anything else that does not decode, an element
that decodes out of range, and an HF element landing twice on one rank are refused: the loader
transforms values rather than moves them, and a layout cannot express it. A last pass loads
random bit patterns (NaN payloads included) and checks that the layout reproduces every
written element bit for bit.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

FORMAT = 1
"""Version of the JSON form; part of every cache key."""

DIGIT_BITS = 23
"""Bits of a position per pass: digit + 1 <= 2**23 is an exact fp32 integer."""

MAX_SLOTS = (1 << 24) - 1


class LayoutError(ValueError):
    """The engine's loader does something a layout cannot express (or the probe was misused)."""


@dataclass(frozen=True)
class Block:
    """``count`` runs of ``length`` consecutive elements: run i reads the HF slot's flat elements
    ``src + i*src_stride ...`` and writes the parameter's flat elements ``dst + i*dst_stride ...``.
    Flat indices are row-major. ``count == 1`` is a plain run (strides 0)."""

    slot: str
    src: int
    dst: int
    length: int
    count: int = 1
    src_stride: int = 0
    dst_stride: int = 0

    @property
    def elements(self) -> int:
        return self.length * self.count

    def to_json(self) -> dict[str, Any]:
        return {
            "slot": self.slot,
            "src": self.src,
            "dst": self.dst,
            "len": self.length,
            "count": self.count,
            "src_stride": self.src_stride,
            "dst_stride": self.dst_stride,
        }

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Block:
        return Block(
            str(d["slot"]),
            int(d["src"]),
            int(d["dst"]),
            int(d["len"]),
            int(d["count"]),
            int(d["src_stride"]),
            int(d["dst_stride"]),
        )

    def sources(self) -> np.ndarray:
        """Every source flat index, in destination order."""
        i = np.arange(self.count, dtype=np.int64)[:, None]
        j = np.arange(self.length, dtype=np.int64)[None, :]
        return (self.src + i * self.src_stride + j).reshape(-1)

    def destinations(self) -> np.ndarray:
        i = np.arange(self.count, dtype=np.int64)[:, None]
        j = np.arange(self.length, dtype=np.int64)[None, :]
        return (self.dst + i * self.dst_stride + j).reshape(-1)


@dataclass
class ParamLayout:
    """Where HF elements land in one engine parameter.

    ``untouched``: elements the loader never writes; ``constant``: elements it writes with a
    value that depends on no HF element (vocabulary padding). Neither is touched by an apply.
    ``replicated``: the parameter holds whole HF slots (every rank holds the same)."""

    shape: tuple[int, ...]
    blocks: list[Block]
    untouched: int = 0
    constant: int = 0

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def replicated(self, slot_shapes: Mapping[str, Sequence[int]]) -> bool:
        got: dict[str, int] = {}
        for b in self.blocks:
            got[b.slot] = got.get(b.slot, 0) + b.elements
        return bool(got) and all(n == math.prod(slot_shapes[s]) for s, n in got.items())


@dataclass
class EngineLayout:
    """The layout of one engine model on one tensor-parallel rank."""

    rank: int
    world: int
    slots: dict[str, tuple[int, ...]]
    params: dict[str, ParamLayout]
    key: dict[str, Any] = field(default_factory=dict)
    _by_slot: dict[str, list[tuple[str, Block]]] | None = field(
        default=None, repr=False, compare=False
    )
    # layout_apply's plans compiled from it, by the parameters they were built on
    _plans: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)
    """What ``layout_apply`` compiled from it, kept for the next apply."""

    def by_slot(self) -> dict[str, list[tuple[str, Block]]]:
        """Per HF slot, the (engine parameter, block) pairs it lands in on this rank."""
        if self._by_slot is None:
            idx: dict[str, list[tuple[str, Block]]] = {s: [] for s in self.slots}
            for name, p in self.params.items():
                for b in p.blocks:
                    idx[b.slot].append((name, b))
            self._by_slot = idx
        return self._by_slot

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "rank": self.rank,
            "world": self.world,
            "key": self.key,
            "slots": {s: list(shape) for s, shape in self.slots.items()},
            "params": {
                name: {
                    "shape": list(p.shape),
                    "replicated": p.replicated(self.slots),
                    "untouched": p.untouched,
                    "constant": p.constant,
                    "blocks": [b.to_json() for b in p.blocks],
                }
                for name, p in self.params.items()
            },
        }

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> EngineLayout:
        if d.get("format") != FORMAT:
            raise LayoutError(f"layout format {d.get('format')!r}, this package reads {FORMAT}")
        slots = {s: tuple(int(x) for x in shape) for s, shape in d["slots"].items()}
        params = {}
        for name, p in d["params"].items():
            blocks = [Block.from_json(b) for b in p["blocks"]]
            shape = tuple(int(x) for x in p["shape"])
            for b in blocks:
                if b.slot not in slots:
                    raise LayoutError(f"{name}: a block reads the unknown slot {b.slot!r}")
                _check_block(name, b, math.prod(shape), math.prod(slots[b.slot]))
            params[name] = ParamLayout(shape, blocks, int(p["untouched"]), int(p["constant"]))
        return EngineLayout(int(d["rank"]), int(d["world"]), slots, params, dict(d.get("key", {})))


def _check_block(name: str, b: Block, numel: int, slot_numel: int) -> None:
    """A block read from outside must decode (strides cover a run) and stay inside both
    tensors, so an apply through it cannot divide by zero or write out of bounds."""
    ok = b.length > 0 and b.count >= 1 and b.src >= 0 and b.dst >= 0
    if ok and b.count > 1:
        ok = b.src_stride >= b.length and b.dst_stride >= b.length
    last = b.count - 1
    ok = ok and b.src + last * b.src_stride + b.length <= slot_numel
    ok = ok and b.dst + last * b.dst_stride + b.length <= numel
    if not ok:
        raise LayoutError(f"{name}: a block that does not fit its tensors: {b.to_json()}")


def _param_dict(model: Any) -> dict[str, Any]:
    # named_parameters drops the second name of a tied parameter: one entry per storage.
    return dict(model.named_parameters())


def _runs(dst: np.ndarray, slot: np.ndarray, pos: np.ndarray) -> list[tuple[int, int, int, int]]:
    """(slot, src, dst, length) of each maximal run, dst sorted ascending."""
    if dst.size == 0:
        return []
    cont = (np.diff(dst) == 1) & (np.diff(slot) == 0) & (np.diff(pos) == 1)
    starts = np.concatenate(([0], np.nonzero(~cont)[0] + 1))
    ends = np.concatenate((starts[1:], [dst.size]))
    return [
        (int(slot[a]), int(pos[a]), int(dst[a]), int(b - a))
        for a, b in zip(starts, ends, strict=True)
    ]


def _fold(runs: list[tuple[int, int, int, int]], names: Sequence[str]) -> list[Block]:
    """Greedy left to right: consecutive runs of one slot and length whose source and
    destination starts advance by constant strides become one block."""
    blocks: list[Block] = []
    k = 0
    while k < len(runs):
        s, src, dst, n = runs[k]
        count, ss, ds = 1, 0, 0
        k += 1
        while k < len(runs):
            s2, src2, dst2, n2 = runs[k]
            if s2 != s or n2 != n:
                break
            step_s, step_d = src2 - (src + (count - 1) * ss), dst2 - (dst + (count - 1) * ds)
            if count == 1:
                if step_s < n:  # a source stride below the run length would not decode
                    break
                ss, ds = step_s, step_d
            elif (step_s, step_d) != (ss, ds):
                break
            count += 1
            k += 1
        blocks.append(
            Block(names[s], src, dst, n, count, ss if count > 1 else 0, ds if count > 1 else 0)
        )
    return blocks


def learn_layout(
    model: Any,
    hf_shapes: Mapping[str, Sequence[int]],
    *,
    rank: int = 0,
    world: int = 1,
    load: Callable[[Any, Iterable[tuple[str, Any]]], Any] | None = None,
    seed: int = 0,
) -> EngineLayout:
    """Learns where every HF element lands in ``model``'s parameters on this rank.

    ``model``: the engine's model object, built in float32 (torch module with
    ``named_parameters``); ``hf_shapes``: HF checkpoint names and shapes, in checkpoint order;
    ``load(model, named_tensors)``: how the engine loads a checkpoint (default
    ``model.load_weights``). The model's parameters are overwritten."""
    import torch

    load = load or (lambda m, it: m.load_weights(it))
    names = list(hf_shapes)
    shapes = {n: tuple(int(x) for x in hf_shapes[n]) for n in names}
    if len(names) > MAX_SLOTS:
        raise LayoutError(f"{len(names)} slots: the slot pass encodes at most {MAX_SLOTS}")
    params = _param_dict(model)
    for pname, p in params.items():
        if p.dtype != torch.float32:
            raise LayoutError(f"{pname} is {p.dtype}: build the probe model in float32")
        if not p.is_contiguous():
            raise LayoutError(f"{pname} is not contiguous: a flat layout cannot address it")
    max_numel = max((math.prod(s) for s in shapes.values()), default=1)
    digits = max(1, math.ceil(max(1, (max_numel - 1).bit_length()) / DIGIT_BITS))

    def run_pass(make: Callable[[int, str], torch.Tensor]) -> dict[str, np.ndarray]:
        with torch.no_grad():
            for p in params.values():
                p.data.fill_(float("nan"))

        def tensors() -> Iterator[tuple[str, torch.Tensor]]:
            for i, n in enumerate(names):  # one full tensor alive at a time
                yield n, make(i, n)

        with torch.no_grad():
            load(model, tensors())
        return {pname: p.detach().reshape(-1).cpu().numpy().copy() for pname, p in params.items()}

    slot_pass = run_pass(lambda i, n: torch.full(shapes[n], -(i + 1.0), dtype=torch.float32))
    digit_passes = []
    mask = (1 << DIGIT_BITS) - 1
    for d in range(digits):

        def pos_digit(i: int, n: str, d: int = d) -> torch.Tensor:
            idx = torch.arange(math.prod(shapes[n]), dtype=torch.int64)
            return ((idx >> (DIGIT_BITS * d)) & mask).add_(1).to(torch.float32).reshape(shapes[n])

        digit_passes.append(run_pass(pos_digit))

    layouts: dict[str, ParamLayout] = {}
    seen_keys, seen_where = [], []
    for pname, p in params.items():
        vs = slot_pass[pname]
        vds = [dp[pname] for dp in digit_passes]
        nan = np.isnan(vs)
        for vd in vds:
            if not np.array_equal(np.isnan(vd), nan):
                raise LayoutError(
                    f"{pname}: the loader writes different elements on different passes"
                )
        same = ~nan
        for vd in vds:
            same &= vd.view(np.uint32) == vs.view(np.uint32)
        code_s = -vs - 1
        ok = ~nan & ~same & (code_s == np.round(code_s)) & (code_s >= 0) & (code_s < len(names))
        pos = np.zeros(vs.size, dtype=np.int64)
        for d, vd in enumerate(vds):
            ok &= (vd == np.round(vd)) & (vd >= 1) & (vd <= mask + 1)
            pos |= (np.where(ok, vd, 1).astype(np.int64) - 1) << (DIGIT_BITS * d)
        slot = np.where(ok, code_s, 0).astype(np.int64)
        numel = np.array([math.prod(shapes[n]) for n in names], dtype=np.int64)
        ok_range = ok & (pos < numel[slot])
        bad = ~nan & ~same & ~ok_range
        if bad.any():
            i = int(np.nonzero(bad)[0][0])
            raise LayoutError(
                f"{pname}: {int(bad.sum())} elements hold values that encode no HF element "
                f"(first: flat index {i}, slot pass {vs[i]!r}, position passes "
                f"{[float(vd[i]) for vd in vds]}): the loader transforms values, not only moves "
                "them"
            )
        dst = np.nonzero(ok_range)[0]
        s_of, p_of = slot[dst], pos[dst]
        seen_keys.append(np.stack([s_of, p_of], axis=1))
        seen_where.append((pname, dst))
        layouts[pname] = ParamLayout(
            tuple(int(x) for x in p.shape),
            _fold(_runs(dst, s_of, p_of), names),
            untouched=int(nan.sum()),
            constant=int(same.sum()),
        )
    _refuse_duplicates(seen_keys, seen_where, names)
    layout = EngineLayout(rank, world, shapes, layouts)
    _verify(layout, model, params, names, shapes, load, seed)
    return layout


def _refuse_duplicates(
    keys: list[np.ndarray], where: list[tuple[str, np.ndarray]], names: Sequence[str]
) -> None:
    allk = np.concatenate(keys) if keys else np.zeros((0, 2), np.int64)
    if allk.shape[0] == 0:
        return
    uniq, counts = np.unique(allk, axis=0, return_counts=True)
    if (counts > 1).any():
        s, p = uniq[np.nonzero(counts > 1)[0][0]]
        places = []
        for (pname, dst), k in zip(where, keys, strict=True):
            m = (k[:, 0] == s) & (k[:, 1] == p)
            places += [f"{pname}[{int(i)}]" for i in dst[m]]
        raise LayoutError(
            f"HF element {int(p)} of {names[int(s)]} lands {int(counts.max())} times on one rank "
            f"({', '.join(places[:4])}): a layout maps each HF element to one place per rank"
        )


_EDGES = np.array(
    [
        0x80000000,
        0x7F800001,
        0xFFC00123,
        0x00000001,
        0x807FFFFF,
        0x7F800000,
        0xFF800000,
        0x7FBFFFFF,
    ],
    dtype=np.uint32,
)


def _verify(
    layout: EngineLayout, model: Any, params: Mapping[str, Any], names, shapes, load, seed: int
) -> None:
    """Loads random bit patterns and checks the layout reproduces every element it claims."""
    import torch

    rng = np.random.default_rng(seed)
    src = {}
    for n in names:
        bits = rng.integers(0, 1 << 32, size=math.prod(shapes[n]), dtype=np.uint32)
        # A quarter of the elements (at least the first few) get the patterns arithmetic or a
        # cast would change: -0, signalling and negative NaNs with payloads, subnormals, inf.
        edge = rng.random(bits.size) < 0.25
        edge[: len(_EDGES)] = True
        bits[edge] = np.resize(_EDGES, int(edge.sum()))
        src[n] = bits.view(np.float32)
    with torch.no_grad():
        load(model, ((n, torch.from_numpy(src[n]).reshape(shapes[n])) for n in names))
    for pname, p in layout.params.items():
        got = params[pname].detach().reshape(-1).cpu().numpy().view(np.uint32)
        for b in p.blocks:
            want = src[b.slot][b.sources()].view(np.uint32)
            if not np.array_equal(got[b.destinations()], want):
                raise LayoutError(
                    f"{pname}: random bit patterns loaded through the engine do not land as the "
                    f"probe says (block from {b.slot}): the loader changes values"
                )


def cache_path(key: Mapping[str, Any], cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where the layout for ``key`` (engine, version, architecture, config, rank, world) lives."""
    base = Path(
        cache_dir
        or os.environ.get("DELTACAST_LAYOUT_CACHE")
        or Path.home() / ".cache" / "deltacast" / "layouts"
    )
    text = json.dumps({"format": FORMAT, **key}, sort_keys=True, separators=(",", ":"))
    return base / (hashlib.sha256(text.encode()).hexdigest()[:32] + ".json")


def cached_layout(
    key: Mapping[str, Any],
    learn: Callable[[], EngineLayout],
    cache_dir: str | os.PathLike[str] | None = None,
) -> tuple[EngineLayout, bool]:
    """The layout for ``key`` from the cache, or learned by ``learn()`` and stored.
    Returns (layout, whether it came from the cache). ``key`` must be JSON-able."""
    path = cache_path(key, cache_dir)
    want = json.loads(json.dumps(dict(key), sort_keys=True))
    if path.exists():
        d = json.loads(path.read_text())
        if d.get("key") == want:
            return EngineLayout.from_json(d), True
    layout = learn()
    layout.key = want
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(layout.to_json()))
    os.replace(tmp, path)
    return layout, False
