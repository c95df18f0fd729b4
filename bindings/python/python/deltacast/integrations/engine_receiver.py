"""A deltacast ``Receiver`` in Hugging Face coordinates in front of an engine's own parameters.

The sender speaks HF checkpoint slots; an engine rank holds fused, sliced, padded parameters.
``LayoutReceiver`` keeps a shadow copy of the HF slots (host memory, the engine's dtype) that a
plain ``deltacast.Receiver`` verifies and applies syncs into, all or nothing. Only when a sync
verified (every flush checked, the state digest equal to the sender's) does it write the slots
that changed into the engine's parameters through the learned ``EngineLayout``: every slot on a
seed, on a delta the slots whose digest moved. A refused sync leaves shadow and engine as they
were.

Costs, for now (the CPU path): one host copy of the HF checkpoint per rank, and a delta writes
the whole share of each slot it touches (O(slot), not O(changed elements): the CPU ``Receiver``
applies in place and does not hand out the positions it changed).

Used by ``deltacast.integrations.vllm`` (weight-transfer backend) and
``deltacast.integrations.sglang`` (custom weight loader); it imports no engine."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from .. import _native
from .layout import EngineLayout, LayoutError, apply_slot


def _torch_dtype(name: str) -> Any:
    import torch

    names = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
    if hasattr(torch, "float8_e4m3fn"):
        names["f8_e4m3"] = torch.float8_e4m3fn
        names["f8_e5m2"] = torch.float8_e5m2
    return names[name]


def slot_table(slots: Any) -> _native.SlotTable:
    """A ``SlotTable`` from one, or from ``[name, dtype, shape]`` entries (e.g. parsed JSON)."""
    if isinstance(slots, _native.SlotTable):
        return slots
    return _native.SlotTable([(str(n), str(d), [int(x) for x in s]) for n, d, s in slots])


def table_entries(table: _native.SlotTable) -> list[list[Any]]:
    """The table as plain ``[name, dtype, shape]`` entries (JSON-able); ``slot_table`` reverses
    it."""
    return [[s.name, s.dtype, list(s.shape)] for s in table]


class LayoutReceiver:
    """Receives deltacast syncs of HF slots and applies them into ``params`` (this rank's
    engine parameters, by name) through ``layout``.

    ``slots``: the sender's table (HF names, dtypes, shapes): a subset of the layout's slots,
    shapes equal, each dtype the dtype of every parameter it lands in. The first sync must be a
    seed (a fresh receiver holds no version): a new or restarted engine worker never trusts
    that its weights equal what the sender last sent.

    ``commit_on_demand``: a sync's last frame verifies it whole but nothing is written (to the
    shadow or the engine) until ``commit()``; meanwhile ``awaits_commit`` is True and the
    engine keeps the version it holds."""

    def __init__(
        self,
        slots: Any,
        layout: EngineLayout,
        params: Mapping[str, Any],
        *,
        commit_on_demand: bool = False,
    ) -> None:
        import torch

        self.table = slot_table(slots)
        self.layout = layout
        self.params = dict(params)
        by_slot = layout.by_slot()
        for s in self.table:
            if s.name not in layout.slots:
                raise LayoutError(f"the sender's slot {s.name!r} is not in the engine's layout")
            if tuple(layout.slots[s.name]) != tuple(s.shape):
                raise LayoutError(
                    f"{s.name}: the sender's shape {tuple(s.shape)}, the engine's "
                    f"{tuple(layout.slots[s.name])}"
                )
            want = _torch_dtype(s.dtype)
            for pname, _ in by_slot[s.name]:
                if pname not in self.params:
                    raise LayoutError(f"{s.name} lands in {pname!r}, not among the parameters")
                got = self.params[pname].dtype
                if got != want:
                    raise LayoutError(
                        f"{s.name} is {s.dtype} on the wire but lands in {pname} of {got}: "
                        "send the engine's dtype"
                    )
        self.shadow = {
            s.name: torch.zeros(tuple(s.shape), dtype=_torch_dtype(s.dtype)) for s in self.table
        }
        self.commit_on_demand = commit_on_demand
        self._fresh_receiver()

    def _fresh_receiver(self) -> None:
        # version=None: the next sync must be a seed.
        self.receiver = _native.Receiver(
            self.table, self.shadow, commit_on_demand=self.commit_on_demand
        )
        self._before: dict[str, int] | None = None

    @property
    def awaits_commit(self) -> bool:
        return self.receiver.awaits_commit

    @property
    def version(self) -> int | None:
        return self.receiver.version

    @property
    def is_staging(self) -> bool:
        return self.receiver.is_staging

    def receive(self, frame: Any) -> _native.SyncOutcome | None:
        """Takes one frame (``bytes``, a uint8 numpy array or CPU tensor). Returns the
        ``SyncOutcome`` when it completed a verified sync (then applied to the engine), None
        while a sync is still arriving. A refusal raises the receiver's error; shadow and
        engine are as they were, and the half-received sync is dropped."""
        if not self.receiver.is_staging and not self.receiver.awaits_commit:
            self._before = self.receiver.digests
        outcome = self.receiver.receive(_frame_arg(frame))
        if outcome is None:
            return None
        return self._land(outcome)

    def commit(self) -> _native.SyncOutcome:
        """With ``commit_on_demand``: writes the verified sync that waits into the shadow and
        then the engine; its ``SyncOutcome``."""
        return self._land(self.receiver.commit())

    def _land(self, outcome: _native.SyncOutcome) -> _native.SyncOutcome:
        """The shadow holds the verified sync: write the slots it changed into the engine."""
        before, self._before = self._before or {}, None
        if outcome.kind == "seed":
            changed = list(self.shadow)
        else:
            after = self.receiver.digests
            changed = [n for n in self.shadow if after[n] != before.get(n)]
        try:
            for name in changed:
                apply_slot(self.layout, self.params, name, self.shadow[name])
        except BaseException:
            # The engine may hold part of this sync: trust nothing but a new seed.
            self._fresh_receiver()
            raise
        self.last_changed_slots = changed
        return outcome

    def receive_all(self, frames: Iterable[Any]) -> list[_native.SyncOutcome]:
        """Every frame in order; the outcomes of the syncs they completed."""
        out = []
        for f in frames:
            o = self.receive(f)
            if o is not None:
                out.append(o)
        return out

    def abort_sync(self) -> None:
        """Drops a half-received sync, or one that awaits its commit (nothing of it reached
        shadow or engine)."""
        self.receiver.abort_sync()
        self._before = None


def _frame_arg(frame: Any) -> Any:
    """A uint8 torch tensor as the numpy view the receiver reads; anything else as it is."""
    if hasattr(frame, "numpy") and hasattr(frame, "dtype") and not isinstance(frame, bytes):
        t = frame.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        return t.contiguous().reshape(-1).numpy()
    return frame


def frames_of(
    frames: Sequence[Any] | None = None, sync_file: str | None = None
) -> list[Any]:
    """The frames of an update: given as they are, or read from a sync file
    (``deltacast.write_sync_file``)."""
    out = list(frames or [])
    if sync_file is not None:
        out += _native.read_sync_file(sync_file)
    return out
