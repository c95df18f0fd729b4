"""Writing HF elements into an engine's own parameters through an ``EngineLayout``.

A sync changes a few elements of every tensor; an engine rank holds hundreds of parameters, and
a block per (slot, parameter) is a mask, a compaction and a copy per block: on a GPU thousands of
kernel launches per commit, and the launches, not the copies, are the time. ``ApplyPlan``
compiles the layout against one set of parameters once: every slot's elements get one global
index (slot base + flat position), the blocks become a sorted device table per parameter dtype,
and a commit handles every changed element of every slot at once: a binary search per element
finds its block, then one kernel per block level computes where it lands and writes it (Triton,
where the parameters live on a CUDA device and Triton is there; otherwise the same arithmetic as
torch ops and one ``index_copy_`` per touched parameter). The number of launches no longer grows
with the number of tensors.

Blocks of one slot may overlap in HF coordinates (a tied embedding lands in two parameters; a
rank holding two column ranges of a row has two interleaved strided blocks): the blocks are split
into levels whose spans do not overlap, and every level is mapped and written on its own."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from .layout import EngineLayout, LayoutError

_INTS = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}
_FIELDS = 7  # start, count, stride, length, dst, dst_stride, param id


def _ints(dtype: Any) -> Any:
    """The same-width integer dtype: values travel and land as bit copies (NaN payloads kept)."""
    import torch

    return getattr(torch, _INTS[dtype.itemsize])


def _flat(target: Any) -> Any:
    data = target.data if hasattr(target, "data") else target
    return data.view(-1).view(_ints(data.dtype))


@dataclass
class _Group:
    """The parameters of one dtype on one device, and the layout's blocks that land in them."""

    dtype: Any
    device: Any
    names: list[str]  # per parameter id
    table: Any = None  # per parameter id: its address (for the Triton kernels)
    levels: list[tuple[Any, Any]] | None = None  # per level: (starts, fields), sorted by start


@dataclass
class _Slot:
    base: int  # the slot's first global index
    numel: int
    group: tuple[Any, Any] | None  # (dtype, device) of the parameters it lands in; None: none
    refusal: str | None  # why values of this slot cannot be written here


class ApplyPlan:
    """``layout`` compiled against ``params`` (this rank's engine parameters by name): valid for
    parameters of the same storage addresses, dtypes and sizes, which ``plan_for`` checks before
    every use. It holds no reference to the parameters (an engine that reallocates its weights
    frees the old ones): ``apply`` and ``read`` take them again."""

    def __init__(self, layout: EngineLayout, params: Mapping[str, Any]) -> None:
        import torch

        self.layout = layout
        self.slots: dict[str, _Slot] = {}
        groups: dict[tuple[Any, Any], _Group] = {}
        rows: dict[tuple[Any, Any], list[list[int]]] = {}
        pid: dict[str, tuple[tuple[Any, Any], int]] = {}
        base = 0
        for slot, shape in layout.slots.items():
            numel = math.prod(shape)
            refusal, keys = None, set()
            for pname, b in layout.by_slot()[slot]:
                if pname not in params:
                    refusal = f"{slot} lands in {pname!r}, not among the parameters"
                    continue
                data = params[pname].data if hasattr(params[pname], "data") else params[pname]
                if not data.is_contiguous():
                    refusal = f"{pname} is not contiguous"
                    continue
                key = (data.dtype, data.device)
                keys.add(key)
                g = groups.get(key)
                if g is None:
                    g = groups[key] = _Group(data.dtype, data.device, [])
                    rows[key] = []
                if pname not in pid:
                    pid[pname] = (key, len(g.names))
                    g.names.append(pname)
                stride = b.src_stride if b.count > 1 else b.length
                span = (b.count - 1) * stride + b.length
                rows[key].append(
                    [base + b.src, b.count, stride, b.length, b.dst, b.dst_stride,
                     pid[pname][1], span]
                )
            if len(keys) > 1:
                kinds = sorted(str(k[0]) + " on " + str(k[1]) for k in keys)
                refusal = refusal or f"{slot} lands in parameters of {', '.join(kinds)}"
            self.slots[slot] = _Slot(base, numel, next(iter(keys)) if keys else None, refusal)
            base += numel
        for key, g in groups.items():
            g.levels = [
                (torch.tensor(starts, device=g.device), torch.tensor(fields, device=g.device))
                for starts, fields in _levels(rows[key])
            ]
            if g.device.type == "cuda":
                g.table = torch.tensor(
                    [params[n].data_ptr() for n in g.names], dtype=torch.int64, device=g.device
                )
        self.groups = groups

    def _spec(self, slot: str) -> _Slot:
        spec = self.slots.get(slot)
        if spec is None:
            raise LayoutError(f"unknown HF slot {slot!r}")
        if spec.refusal is not None:
            raise LayoutError(spec.refusal)
        return spec

    def apply(self, params: Mapping[str, Any], changes: Iterable[tuple[str, Any, Any]]) -> int:
        """Writes every ``(slot, positions, values)``: checked first (a bad slot, count, dtype
        or position writes nothing), then written. Positions are flat HF indices, unique per
        slot; values the parameters' dtype, bits copied as they are. Returns the number of
        parameter elements written. ``prepare`` then ``write``."""
        return self.write(params, self.prepare(changes))

    def write(self, params: Mapping[str, Any], jobs: list[tuple]) -> int:
        """Writes what ``prepare`` made ready: a few launches per dtype, no host work."""
        return _sum([self._write(params, *job) for job in jobs])

    def prepare(self, changes: Iterable[tuple[str, Any, Any]]) -> list[tuple]:
        """``apply``'s checks and transfers without the write: the jobs ``write`` takes (per
        dtype, the changes' global indices and bits joined on the parameters' device; host
        ones through one pinned buffer, as ``apply_joined`` takes them). A receiver prepares
        while the engine still serves the version it holds, so that its commit is the write
        alone. The jobs hold device memory of ~10 bytes per change until dropped."""
        import torch

        todo: dict[tuple[Any, Any], tuple[list[_Slot], list[Any], list[Any]]] = {}
        for slot, positions, values in changes:
            spec = self._spec(slot)
            pos = torch.as_tensor(positions, dtype=torch.int64).reshape(-1)
            vals = torch.as_tensor(values).reshape(-1)
            _check_values(slot, spec, pos.numel(), vals)
            if pos.numel() == 0:
                continue
            if spec.group is None:  # this rank holds none of it: only checked
                if int(pos.min()) < 0 or int(pos.max()) >= spec.numel:
                    raise LayoutError(f"{slot}: a position outside 0..{spec.numel}")
                continue
            specs, ps, vs = todo.setdefault(spec.group, ([], [], []))
            specs.append((slot, spec))
            ps.append(pos)
            vs.append(vals.view(_ints(vals.dtype)))
        return [
            self._checked(self.groups[key], specs, [p.numel() for p in ps], _joined(ps, key[1]),
                          _joined(vs, key[1]))
            for key, (specs, ps, vs) in todo.items()
        ]

    def apply_joined(
        self, params: Mapping[str, Any], slots: Sequence[str], counts: Sequence[int],
        positions: Any, values: Any,
    ) -> int:
        """``apply`` of changes already joined, as a decoder on the device holds them: the
        positions of ``slots[0]`` (``counts[0]`` of them), then those of ``slots[1]``, ...
        in one int64 tensor, their values in one tensor of the parameters' dtype, both on the
        parameters' device. A few launches whatever the number of slots."""
        import torch

        specs = [(slot, self._spec(slot)) for slot in slots]
        n = sum(int(c) for c in counts)
        if len(counts) != len(specs) or positions.numel() != n or values.numel() != n:
            raise LayoutError(
                f"{len(specs)} slots, {len(counts)} counts adding up to {n}, "
                f"{positions.numel()} positions, {values.numel()} values"
            )
        keys = {spec.group for _, spec in specs}
        if len(keys) != 1 or None in keys:
            raise LayoutError("apply_joined: slots of one dtype and device, all held here")
        (key,) = keys
        for slot, spec in specs:
            _check_values(slot, spec, None, values)
        if positions.dtype != torch.int64:
            raise LayoutError(f"positions of {positions.dtype}, not int64")
        if positions.device != key[1] or values.device != key[1]:
            raise LayoutError(
                f"positions on {positions.device}, values on {values.device}, the "
                f"parameters on {key[1]}"
            )
        g = self.groups[key]
        job = self._checked(
            g, specs, list(counts), positions.reshape(-1), values.reshape(-1).view(_ints(values.dtype))
        )
        return _sum([self._write(params, *job)])

    def _checked(self, g: _Group, specs: list, counts: list[int], pos: Any, bits: Any) -> tuple:
        """The joined positions as global indices, once all are known to be in range."""
        import torch

        if len(specs) == 1:
            base, limit = specs[0][1].base, specs[0][1].numel
        else:
            base, limit = _per_element(specs, counts, pos.numel(), pos.device)
        bad = (pos < 0) | (pos >= limit)
        if bool(bad.any()):  # the one wait before anything is written
            first = int(bad.nonzero()[0, 0])
            slot, spec = specs[int(np.searchsorted(np.cumsum(counts), first, side="right"))]
            raise LayoutError(f"{slot}: a position outside 0..{spec.numel}")
        return g, pos + base, bits

    def _write(self, params: Mapping[str, Any], g: _Group, gpos: Any, bits: Any) -> Any:
        """Writes checked global indices; the number of elements written (on the device)."""
        return sum(_scatter(g, params, starts, fields, gpos, bits) for starts, fields in g.levels)

    def read(
        self, params: Mapping[str, Any], slot: str, positions: Any, dtype: Any
    ) -> tuple[Any, Any]:
        """The bits this rank holds at HF flat ``positions`` of ``slot`` (host int64, in range)
        as a host tensor of ``dtype``'s width (zeros where it holds none), and which it holds."""
        old, held = self.read_many(params, [(slot, positions, dtype)])
        return old.view(_ints(dtype)), held

    def read_many(
        self, params: Mapping[str, Any], requests: Sequence[tuple[str, Any, Any]]
    ) -> tuple[Any, Any]:
        """``read`` of every ``(slot, positions, dtype)`` request, joined in request order: the
        old bits as one host uint8 tensor (each request's elements at its dtype's width) and
        one host bool tensor of which are held. Per dtype and device one transfer each way and
        one gather per block level, whatever the number of slots (a receiver reads every slot
        of a frame at once)."""
        import torch

        parts: list[Any] = [None] * len(requests)  # per request: (old bytes, held)
        todo: dict[tuple[Any, Any], tuple[list[int], list[Any]]] = {}
        for k, (slot, positions, dtype) in enumerate(requests):
            spec = self._spec(slot)
            pos = torch.as_tensor(positions, dtype=torch.int64).reshape(-1)
            if spec.group is None or pos.numel() == 0:
                n = pos.numel()
                parts[k] = (
                    torch.zeros(n * dtype.itemsize, dtype=torch.uint8),
                    torch.zeros(n, dtype=torch.bool),
                )
                continue
            if dtype != spec.group[0]:
                raise LayoutError(f"{slot}: read as {dtype}, its parameters are {spec.group[0]}")
            ks, ps = todo.setdefault(spec.group, ([], []))
            ks.append(k)
            ps.append(pos + spec.base)
        for key, (ks, ps) in todo.items():
            g = self.groups[key]
            gpos = _joined(ps, key[1])
            old = torch.zeros(gpos.numel(), dtype=_ints(g.dtype), device=key[1])
            held = torch.zeros(gpos.numel(), dtype=torch.uint8, device=key[1])
            for starts, fields in g.levels:
                _gather(g, params, starts, fields, gpos, old, held)
            old, held = old.cpu().view(torch.uint8), held.cpu().bool()
            if len(ks) == len(requests):  # one dtype, every slot held here: already joined
                return old, held
            sizes = [p.numel() for p in ps]
            width = g.dtype.itemsize
            for k, o, h in zip(ks, old.split([n * width for n in sizes]), held.split(sizes)):
                parts[k] = (o, h)
        if not parts:
            return torch.zeros(0, dtype=torch.uint8), torch.zeros(0, dtype=torch.bool)
        return torch.cat([o for o, _ in parts]), torch.cat([h for _, h in parts])


def _params_key(layout: EngineLayout, params: Mapping[str, Any]) -> tuple:
    out = []
    for name in layout.params:
        t = params.get(name)
        if t is None:
            out.append((name, None))
            continue
        data = t.data if hasattr(t, "data") else t
        out.append((name, data.data_ptr(), data.dtype, data.device, data.numel()))
    return tuple(out)


def _levels(rows: list[list[int]]) -> list[tuple[list[int], list[list[int]]]]:
    """Blocks split into levels of disjoint spans [start, start + span), each sorted by start:
    in a level, the block that may hold a global index is the last one starting at or before
    it."""
    levels: list[tuple[list[int], list[list[int]], list[int]]] = []  # starts, fields, [end]
    for r in sorted(rows, key=lambda r: r[0]):
        start, end = r[0], r[0] + r[7]
        for starts, fields, last in levels:
            if last[0] <= start:
                break
        else:
            starts, fields, last = [], [], [0]
            levels.append((starts, fields, last))
        starts.append(start)
        fields.append(r[:_FIELDS])
        last[0] = end
    return [(s, f) for s, f, _ in levels]


def _locate(starts: Any, fields: Any, gpos: Any) -> tuple[Any, Any]:
    """Per global index: the id of the parameter that level's block puts it in (-1: none) and
    its flat index there."""
    import torch

    i = torch.searchsorted(starts, gpos, right=True) - 1
    before = i < 0
    f = fields[i.clamp(min=0)]
    q = gpos - f[:, 0]
    run = torch.div(q, f[:, 2], rounding_mode="floor")
    j = q - run * f[:, 2]
    hit = ~before & (run < f[:, 1]) & (j < f[:, 3])
    dst = f[:, 4] + run * f[:, 5] + j
    return torch.where(hit, f[:, 6], -1), dst


def _joined(tensors: list[Any], device: Any) -> Any:
    """The tensors joined, on ``device``. Host tensors bound for a CUDA device travel together:
    one copy into a pinned buffer (torch's caching host allocator reuses it), one transfer."""
    import torch

    if device.type != "cuda" or any(t.device.type != "cpu" for t in tensors):
        return torch.cat([t.to(device) for t in tensors])
    buf = torch.empty(sum(t.numel() for t in tensors), dtype=tensors[0].dtype, pin_memory=True)
    torch.cat(tensors, out=buf)
    return buf.to(device, non_blocking=True)


def _check_values(slot: str, spec: _Slot, count: int | None, vals: Any) -> None:
    if count is not None and count != vals.numel():
        raise LayoutError(f"{slot}: {count} positions but {vals.numel()} values")
    if spec.group is not None and vals.dtype != spec.group[0]:
        raise LayoutError(f"{slot}: values are {vals.dtype}, its parameters {spec.group[0]}")


def _per_element(specs: list, counts: list[int], n: int, device: Any) -> tuple[Any, Any]:
    """Per joined element, its slot's base and size: a mark where each slot's elements begin,
    summed up, picks them (one small transfer and a few launches, whatever the slots)."""
    import torch

    keep = [k for k, c in enumerate(counts) if c]  # a slot with no elements begins nothing
    begins = np.cumsum([counts[k] for k in keep])[:-1]
    small = np.concatenate([
        begins, [specs[k][1].base for k in keep], [specs[k][1].numel for k in keep]
    ]).astype(np.int64)
    small = torch.from_numpy(small).to(device)
    at, bases, numels = torch.split(small, [len(begins), len(keep), len(keep)])
    marks = torch.zeros(n, dtype=torch.int32, device=device)
    marks[at] = 1
    seg = torch.cumsum(marks, 0, dtype=torch.int32)
    return bases[seg], numels[seg]


def _sum(counts: list[Any]) -> int:
    return int(sum(int(c) for c in counts))


# --- the writes: one Triton kernel per dtype on CUDA, one index_copy_ per parameter elsewhere ---


def _use_triton(g: _Group) -> bool:
    return g.table is not None and os.environ.get("DELTACAST_NO_TRITON") != "1" and _kernels()


def _scatter(
    g: _Group, params: Mapping[str, Any], starts: Any, fields: Any, gpos: Any, bits: Any
) -> Any:
    """Writes the elements of one level; how many it wrote (on the device)."""
    import torch

    if gpos.numel() == 0:
        return 0
    if _use_triton(g):
        written = torch.zeros(1, dtype=torch.int64, device=gpos.device)
        block = torch.searchsorted(starts, gpos, right=True) - 1
        n = gpos.numel()
        _kernels()[0][((n + 1023) // 1024,)](
            g.table, block, fields, gpos, bits, written, n, BLOCK=1024
        )
        return written
    ids, dst = _locate(starts, fields, gpos)
    for k, sel in _by_param(ids, len(g.names)):
        _flat(params[g.names[k]]).index_copy_(0, dst[sel], bits[sel])
    return (ids >= 0).sum()


def _gather(
    g: _Group, params: Mapping[str, Any], starts: Any, fields: Any, gpos: Any, out: Any,
    held: Any,
) -> None:
    """Reads the elements one level holds into ``out``, marks them in ``held`` (uint8)."""
    import torch

    if gpos.numel() == 0:
        return
    if _use_triton(g):
        block = torch.searchsorted(starts, gpos, right=True) - 1
        n = gpos.numel()
        _kernels()[1][((n + 1023) // 1024,)](
            g.table, block, fields, gpos, out, held, n, BLOCK=1024
        )
        return
    ids, dst = _locate(starts, fields, gpos)
    for k, sel in _by_param(ids, len(g.names)):
        out[sel] = _flat(params[g.names[k]])[dst[sel]]
    held[ids >= 0] = 1


def _by_param(ids: Any, count: int) -> list[tuple[int, Any]]:
    """Per parameter id that occurs in ``ids``, the indices of its elements."""
    import torch

    order = torch.argsort(ids, stable=True)
    sizes = torch.bincount(ids + 1, minlength=count + 1).tolist()
    parts = torch.split(order, sizes)
    return [(k, sel) for k, sel in enumerate(parts[1:]) if sel.numel()]


_KERNELS: list[Any] = []


def _kernels() -> Any:
    """(scatter, gather) Triton kernels, or None where Triton cannot be imported."""
    if not _KERNELS:
        try:
            import triton
            import triton.language as tl
        except ImportError:
            _KERNELS.append(None)
            return None

        # Both do _locate's arithmetic per element, on the block the search found (-1: none
        # starts at or before it), then move the element: locate and move in one launch.
        @triton.jit
        def located(block, fields, gpos, offs, m):
            i = tl.load(block + offs, mask=m, other=-1)
            m = m & (i >= 0)
            f = fields + i * 7
            q = tl.load(gpos + offs, mask=m, other=0) - tl.load(f, mask=m, other=0)
            stride = tl.load(f + 2, mask=m, other=1)
            run = q // stride  # q >= 0: the block starts at or before the element
            j = q - run * stride
            m = m & (run < tl.load(f + 1, mask=m, other=0)) & (j < tl.load(f + 3, mask=m, other=0))
            dst = tl.load(f + 4, mask=m, other=0) + run * tl.load(f + 5, mask=m, other=0) + j
            return m, tl.load(f + 6, mask=m, other=0), dst

        @triton.jit
        def scatter(table, block, fields, gpos, bits, written, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
            m, k, dst = located(block, fields, gpos, offs, offs < n)
            base = tl.load(table + k, mask=m, other=0).to(tl.pointer_type(bits.dtype.element_ty))
            tl.store(base + dst, tl.load(bits + offs, mask=m), mask=m)
            tl.atomic_add(written, tl.sum(m.to(tl.int64)))

        @triton.jit
        def gather(table, block, fields, gpos, out, held, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
            m, k, dst = located(block, fields, gpos, offs, offs < n)
            base = tl.load(table + k, mask=m, other=0).to(tl.pointer_type(out.dtype.element_ty))
            tl.store(out + offs, tl.load(base + dst, mask=m), mask=m)
            tl.store(held + offs, 1, mask=m)

        _KERNELS.append((scatter, gather))
    return _KERNELS[0]


# --- the functions users call ---


_KEPT_PLANS = 4


def plan_for(layout: EngineLayout, params: Mapping[str, Any]) -> ApplyPlan:
    """The layout's plan for ``params``: one it keeps, if built on these parameters, else a new
    one (it keeps the last few)."""
    key = _params_key(layout, params)
    plan = layout._plans.pop(key, None) or ApplyPlan(layout, params)
    layout._plans[key] = plan  # the most recent last
    while len(layout._plans) > _KEPT_PLANS:
        layout._plans.pop(next(iter(layout._plans)))
    return plan


def apply_delta(
    layout: EngineLayout,
    params: Mapping[str, Any],
    slot: str,
    positions: Any,
    values: Any,
) -> int:
    """Writes new values of HF elements into this rank's engine parameters, in place.

    ``positions``: flat (row-major) indices into HF slot ``slot``, unique; ``values``: the new
    values, one per position, as a torch tensor (or numpy array) of the parameter's dtype, whose
    bits are copied as they are. Only the positions of this rank's share are written. Returns
    the number of elements written. ``apply_deltas`` does many slots in the same launches."""
    return apply_deltas(layout, params, [(slot, positions, values)])


def apply_deltas(
    layout: EngineLayout, params: Mapping[str, Any], changes: Iterable[tuple[str, Any, Any]]
) -> int:
    """``apply_delta`` of every ``(slot, positions, values)`` in ``changes``, through the
    layout's plan for ``params`` (``ApplyPlan.apply``): all checked before anything is written,
    then every slot in the same few launches."""
    return plan_for(layout, params).apply(params, changes)


def apply_joined(
    layout: EngineLayout,
    params: Mapping[str, Any],
    slots: Sequence[str],
    counts: Sequence[int],
    positions: Any,
    values: Any,
) -> int:
    """``apply_deltas`` of changes already joined on the parameters' device
    (``ApplyPlan.apply_joined``): what a receiver that decodes on the GPU hands over."""
    return plan_for(layout, params).apply_joined(params, slots, counts, positions, values)


def apply_slot(layout: EngineLayout, params: Mapping[str, Any], slot: str, values: Any) -> int:
    """Writes a whole HF slot (``values``: the slot's full tensor, any shape with its number of
    elements, the parameters' dtype) into this rank's engine parameters, in place, as bit copies.

    The same result as ``apply_delta`` with every position of the slot, without building the
    positions: each block is one strided copy. Returns the number of elements written."""
    import torch

    blocks = layout.by_slot().get(slot)
    if blocks is None:
        raise LayoutError(f"unknown HF slot {slot!r}")
    vals = torch.as_tensor(values)
    numel = math.prod(layout.slots[slot])
    if vals.numel() != numel:
        raise LayoutError(f"{slot}: {vals.numel()} values for a slot of {numel} elements")
    if not vals.is_contiguous():
        raise LayoutError(f"{slot}: the values are not contiguous")
    written = 0
    for pname, b in blocks:
        target = params[pname]
        data = target.data if hasattr(target, "data") else target
        if vals.dtype != data.dtype:
            raise LayoutError(f"{slot} -> {pname}: values are {vals.dtype}, the parameter {data.dtype}")
        if not data.is_contiguous():
            raise LayoutError(f"{pname} is not contiguous")
        dst, src = _flat(data), vals.reshape(-1).view(_ints(vals.dtype))
        size = (b.count, b.length)
        # as_strided takes offsets into the storage, not into the view.
        d = dst.as_strided(size, (b.dst_stride, 1), dst.storage_offset() + b.dst)
        s = src.as_strided(size, (b.src_stride, 1), src.storage_offset() + b.src)
        d.copy_(s.to(d.device))
        written += b.elements
    return written
