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

The pause: by default ``GpuReceiver`` applies stage by stage as it receives (journaled, all or
nothing), so the whole receive is the pause. With ``commit_on_demand`` the sync is received,
decoded and checked on the GPU while the engine keeps generating from the weights it holds, and
only ``commit()`` writes it: the same stage / commit / abort as ``LayoutReceiver``, frame by
frame (``receive``), so the engine adapters can take either."""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

from .. import _native
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
    the parameter it lands in. The first sync must be a seed. ``commit_on_demand``: a sync's
    last frame verifies it whole but writes nothing until ``commit()`` (see the module)."""

    def __init__(
        self,
        slots: Any,
        layout: EngineLayout,
        params: Mapping[str, Any],
        *,
        device: int | None = None,
        timeout_s: float = 300.0,
        commit_on_demand: bool = False,
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
        self.receiver = dcc.GpuReceiver(
            self.feed, named, device=dev, timeout_s=timeout_s, commit_on_demand=commit_on_demand
        )

    @property
    def version(self) -> int | None:
        return self.receiver.version

    @property
    def commit_on_demand(self) -> bool:
        return self.receiver.commit_on_demand

    @property
    def awaits_commit(self) -> bool:
        """Whether a verified sync waits for ``commit()``."""
        return self.receiver.awaits_commit

    @property
    def is_staging(self) -> bool:
        """Whether frames of a sync whose last frame has not come are held."""
        return self.feed.pending_bytes > 0

    def receive(self, frame: Any) -> dict | None:
        """Takes one frame (bytes, a uint8 array or tensor). At a sync's last frame the sync is
        received on the GPU: applied, or, with ``commit_on_demand``, verified and kept for
        ``commit()``; its report. None before that. A refused sync raises and its frames are
        dropped (nothing of it was written)."""
        if self.receiver.awaits_commit:
            raise RuntimeError("deltacast: a verified sync waits for commit() or abort_sync()")
        f = _frame_arg(frame)
        try:
            last = bool(_native.frame_header(f)["is_final"])
        except Exception:
            self.feed.clear()
            raise
        self.feed.push(f)
        if not last:
            return None
        try:
            return self.receiver.receive()
        finally:
            self.feed.clear()

    def commit(self) -> dict:
        """Writes the verified sync into the engine's parameters; its report (``time_ms``: the
        commit's own time, the only part that needs the engine paused)."""
        return self.receiver.commit()

    def abort_sync(self) -> None:
        """Drops a half-received sync, or one that awaits its commit (nothing of it reached
        the engine)."""
        self.feed.clear()
        self.receiver.abort_sync()

    def receive_all(self, frames: Iterable[Any]) -> list[dict]:
        """Applies the whole syncs whose frames are given (bytes, uint8 arrays), in order; the
        report of each. A refused sync raises (what it had applied is undone) and its unread
        frames are dropped; frames that end inside a sync are refused. (Committing on demand,
        one sync at a time: ``receive`` frame by frame, then ``commit``.)"""
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



def engine_receiver(
    slots: Any,
    layout: EngineLayout,
    params: Mapping[str, Any],
    *,
    group: Any = None,
    commit_on_demand: bool = False,
) -> Any:
    """The receiver an engine adapter uses for ``params``: a ``GpuLayoutReceiver`` (decode,
    checks and commit on the GPU) where it can take the layout — TP 1, parameters on a CUDA
    device, every slot whole in one run, a GPU build of deltacast — else ``LayoutReceiver``
    (host decode; any layout, TP groups, CPU parameters). ``$DELTACAST_ENGINE_RECEIVER``:
    ``host`` forces ``LayoutReceiver``, ``gpu`` makes a GPU receiver required (its reason
    raised when it cannot be had)."""
    import os

    from .engine_receiver import LayoutReceiver

    want = os.environ.get("DELTACAST_ENGINE_RECEIVER", "auto")
    if want not in ("auto", "host", "gpu"):
        raise ValueError(f"DELTACAST_ENGINE_RECEIVER={want!r}: auto, host or gpu")
    why = _why_not_gpu(layout, params) if want != "host" else "DELTACAST_ENGINE_RECEIVER=host"
    if why is None:
        try:
            return GpuLayoutReceiver(slots, layout, params, commit_on_demand=commit_on_demand)
        except LayoutError as e:
            why = str(e)
    if want == "gpu":
        raise LayoutError(f"deltacast: no GPU receiver for this engine rank: {why}")
    return LayoutReceiver(
        slots, layout, params, commit_on_demand=commit_on_demand, group=group
    )


def _why_not_gpu(layout: EngineLayout, params: Mapping[str, Any]) -> str | None:
    """Why ``GpuLayoutReceiver`` cannot serve ``params``, or None."""
    if layout.world != 1:
        return f"tensor-parallel rank {layout.rank} of {layout.world}"
    devices = {getattr(getattr(p, "device", None), "type", None) for p in params.values()}
    if devices != {"cuda"}:
        return f"parameters on {sorted(str(d) for d in devices)}"
    ok, reason = dcc.available()
    return None if ok else reason
