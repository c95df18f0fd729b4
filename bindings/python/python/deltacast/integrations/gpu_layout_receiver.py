"""A deltacast GPU receiver that writes into an engine's own parameters where the layout lets
it: every HF slot lands whole, as one run, in one parameter.

At tensor-parallel size 1 that is what vLLM and SGLang do with every slot of a dense or MoE
model: fused ``qkv_proj`` / ``gate_up_proj`` rows and stacked experts (``w13``, ``w2``) hold
each HF tensor as consecutive elements, and a padded vocabulary starts with the HF rows. So a
flat view of the parameter at the slot's first element *is* the slot, and the GPU receiver
(``deltacast.cuda.GpuReceiver``) can decode, check and apply each sync straight into it: the
frames cross to the GPU once, the decoders run there, nothing O(model) is touched. Where a slot
lands in pieces (a row-parallel slice at TP >= 2, a tied copy in a second parameter),
``slot_views`` refuses it with its name, and ``LayoutReceiver`` (host decode, any layout,
TP groups) is the receiver to use.

The pause: ``GpuReceiver`` applies stage by stage as it receives (journaled, all or nothing),
so the whole ``receive_all`` is the pause; there is no separate commit."""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

from .. import cuda as dcc
from .engine_receiver import _frame_arg, _torch_dtype, slot_table
from .layout import EngineLayout, LayoutError


def slot_views(layout: EngineLayout, params: Mapping[str, Any]) -> dict[str, Any]:
    """Per slot of ``layout``, a view of the engine parameter that holds the whole slot as one
    run, shaped as the slot (row-major, as the sender's slot table has it). Raises
    ``LayoutError`` naming the first slot that lands in several places, partly or not in one
    run, or in a parameter that is not contiguous."""
    by_slot = layout.by_slot()
    views = {}
    for slot, shape in layout.slots.items():
        n = math.prod(shape)
        lands = by_slot.get(slot, [])
        if len(lands) != 1:
            raise LayoutError(
                f"{slot} lands in {len(lands)} blocks ({sorted({p for p, _ in lands})}); a "
                "slot must land whole in one run of one parameter here: use LayoutReceiver"
            )
        pname, b = lands[0]
        one_run = b.count == 1 or (b.src_stride == b.length and b.dst_stride == b.length)
        if b.src != 0 or b.elements != n or not one_run:
            raise LayoutError(
                f"{slot} lands in {pname} as {b.count} run(s) of {b.length} of its {n} "
                "elements (a tensor-parallel slice?): use LayoutReceiver"
            )
        p = params[pname]
        p = getattr(p, "data", p)
        if not p.is_contiguous():
            raise LayoutError(f"{pname} (where {slot} lands) is not contiguous")
        if b.dst + n > p.numel():
            raise LayoutError(f"{slot} lands past the end of {pname}")
        views[slot] = p.view(-1)[b.dst : b.dst + n].view(shape)
    return views


class GpuLayoutReceiver:
    """Receives syncs that arrive as frames on the host (a CPU ``Sender``'s, a socket's, a
    sync file's) and applies them on the GPU straight into ``params`` through ``layout``,
    when every slot of the sender's table lands whole in one run (``slot_views``): TP 1.

    ``slots``: the sender's table, each slot in the layout with the same shape and the dtype of
    the parameter it lands in. The first sync must be a seed."""

    def __init__(
        self,
        slots: Any,
        layout: EngineLayout,
        params: Mapping[str, Any],
        *,
        device: int | None = None,
        timeout_s: float = 300.0,
    ) -> None:
        if layout.world != 1:
            raise LayoutError(
                f"a layout of rank {layout.rank} of {layout.world}: the GPU receiver writes "
                "whole slots (TP 1); use LayoutReceiver for a tensor-parallel group"
            )
        self.table = slot_table(slots)
        views = slot_views(layout, params)
        named = []
        for s in self.table:
            if s.name not in views:
                raise LayoutError(f"the sender's slot {s.name!r} is not in the engine's layout")
            v = views[s.name]
            if tuple(v.shape) != tuple(s.shape):
                raise LayoutError(
                    f"{s.name}: the sender's shape {tuple(s.shape)}, the engine's {tuple(v.shape)}"
                )
            if v.dtype != _torch_dtype(s.dtype):
                raise LayoutError(
                    f"{s.name} is {s.dtype} on the wire but lands in a parameter of {v.dtype}: "
                    "send the engine's dtype"
                )
            named.append((s.name, v))
        dev = named[0][1].device.index if named and device is None else device
        self.feed = dcc.FrameFeed(0 if dev is None else int(dev))
        self.receiver = dcc.GpuReceiver(self.feed, named, device=dev, timeout_s=timeout_s)

    @property
    def version(self) -> int | None:
        return self.receiver.version

    def receive_all(self, frames: Iterable[Any]) -> list[dict]:
        """Applies the whole syncs whose frames are given (bytes, uint8 arrays), in order; the
        report of each. A refused sync raises (what it had applied is undone) and its unread
        frames are dropped; frames that end inside a sync are refused."""
        for f in frames:
            self.feed.push(_frame_arg(f))
        out = []
        try:
            while self.feed.pending_bytes:
                report = self.receiver.receive()
                if report is None:
                    break
                out.append(report)
        finally:
            self.feed.clear()
        return out

    def verify(self) -> None:
        """Recomputes the digests of the weights held (``DigestMismatchError`` if they were
        changed behind the receiver)."""
        self.receiver.verify()

