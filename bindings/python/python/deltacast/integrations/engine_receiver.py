"""A deltacast receiver in Hugging Face coordinates that writes straight into an engine's own
parameters, through the ``EngineLayout`` learned from the engine's ``load_weights``.

The sender speaks HF checkpoint slots; an engine rank holds fused, sliced, padded parameters.
``LayoutReceiver`` runs the native ``ChangeReceiver`` (the core's frame checks, decoder and
receiver state machine: version gate, base digests, digests settled against the sender's) with
the engine's parameters as the bits it checks against: for each frame it reads the old bits of
every position the frame changes from the parameters through the layout, in one read (zeros and
"not held" where this rank holds none), the core decodes the new values and keeps only the
changes of the positions this rank holds, and once the whole group agreed they go to the
parameters' device, ready to be written through the layout (the commit: the only part that
needs the engine paused). No host copy of the checkpoint, no full-size temporary, no
``load_weights`` per sync: memory and work O(changed elements) per sync (a seed: O(this rank's
share)).

Tensor parallelism (``group``: a ``torch.distributed`` process group of the engine's TP ranks,
gloo or any backend that sums int64 tensors on the CPU): each HF element is *counted* in the
digest by exactly one rank, the lowest rank that holds it (replicated parameters and KV heads
shared by several ranks are held by several; the ranks' layouts are exchanged once, at
construction, to know which). Per frame the ranks all-reduce a small vector (a refusal flag,
a completion flag, and when every rank completed the sync its per-slot digest parts as 16-bit
limbs, so the sum is exact mod 2^64); the sums are settled against the sender's digests on
every rank, and a second all-reduce of the settle results makes the sync all or nothing across
the group. That second all-reduce also cross-checks the copies the digest does not count: each
rank hashes (slot, position, old bits) of every change it holds, and of every change it counts
times the number of ranks holding it; the two sums differ over the group when a replica's old
bits are not the counting rank's (``ReplicaMismatchError`` on every rank). So if any rank
refused (a bad frame, a wrong version, a digest that does not come out, a diverged replica),
every rank drops the sync and nothing is written anywhere. The commit is agreed the same way:
a rank whose write fails (a device error) writes its old bits back, and so does every rank,
before anyone counts the sync. Every rank must be fed the same frames in the same calls.

Used by ``deltacast.integrations.vllm`` (weight-transfer backend) and
``deltacast.integrations.sglang`` (custom weight loader); it imports no engine."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from .. import _native
from .._errors import DeltacastError
from .layout import EngineLayout, LayoutError
from .layout_apply import plan_for

NOT_HELD, HELD, COUNTED = 0, 1, 2
_LIMBS = 4  # 16-bit limbs per u64 digest part: exact sums for up to 2^47 ranks


class CommitFailedError(DeltacastError):
    """This rank could not write a verified sync into the engine; the group dropped it."""


class ReplicaMismatchError(DeltacastError):
    """The TP group's copies of replicated elements disagree where the sync changes them (a
    rank's weights changed behind the receiver): every rank dropped the sync; reseed."""


class GroupRefusedError(DeltacastError):
    """Another rank of the tensor-parallel group refused the sync (its own error is raised
    there): this rank dropped it too, nothing was written."""


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


def _held_runs(layout: EngineLayout) -> dict[str, list[tuple[int, int]]]:
    """Per slot, the HF element runs ``[start, end)`` this rank holds, sorted and merged."""
    out: dict[str, list[tuple[int, int]]] = {}
    for slot, blocks in layout.by_slot().items():
        runs = []
        for _, b in blocks:
            for i in range(b.count):
                s = b.src + i * b.src_stride
                runs.append((s, s + b.length))
        out[slot] = _merge(runs)
    return out


def _merge(runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[list[int]] = []
    for s, e in sorted(runs):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return [(s, e) for s, e in merged]


def _as_runs(runs: list[tuple[int, int]]) -> tuple[Any, Any]:
    """Sorted disjoint runs as (starts, ends) int64 tensors, for ``_in_runs``."""
    import torch

    return (
        torch.tensor([a for a, _ in runs], dtype=torch.int64),
        torch.tensor([b for _, b in runs], dtype=torch.int64),
    )


_MIX = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))


def _replica_hash(slot: int, pos: np.ndarray, old: np.ndarray, width: int) -> np.ndarray:
    """A 64-bit hash per change of (slot, position, old bits), wrapping uint64 arithmetic:
    the replicas' cross-check (``LayoutReceiver._replica_sums``)."""
    kind = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[width]
    x = old.view(kind).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    x ^= pos.astype(np.uint64) + (np.uint64(slot + 1) << np.uint64(40))
    for m in _MIX:  # the splitmix64 finalizer
        x ^= x >> np.uint64(30)
        x *= m
    return x ^ (x >> np.uint64(31))


def _limbs(value: int) -> list[int]:
    return [(value >> (16 * k)) & 0xFFFF for k in range(_LIMBS)]


def _unlimb(raw: list[int]) -> int:
    return sum(raw[k] << (16 * k) for k in range(_LIMBS)) % (1 << 64)


def _in_runs(pos: Any, runs: tuple[Any, Any]) -> Any:
    """Which of ``pos`` (int64 tensor) lie in the sorted disjoint runs (starts, ends)."""
    import torch

    starts, ends = runs
    if starts.numel() == 0:
        return torch.zeros(pos.shape, dtype=torch.bool)
    i = torch.searchsorted(starts, pos, right=True) - 1
    ok = i >= 0
    i = i.clamp(min=0)
    return ok & (pos < ends[i])


class LayoutReceiver:
    """Receives deltacast syncs of HF slots and writes their changes into ``params`` (this
    rank's engine parameters, by name) through ``layout``.

    ``slots``: the sender's table (HF names, dtypes, shapes): a subset of the layout's slots,
    shapes equal, each dtype the dtype of every parameter it lands in. The first sync must be a
    seed (a fresh receiver holds no version): a new or restarted engine worker never trusts
    that its weights equal what the sender last sent.

    ``group``: the TP group's process group (None: this rank alone, then ``layout.world`` must
    be 1). Constructing it is a collective over the group.

    ``commit_on_demand``: a sync's last frame verifies it whole (on every rank) but nothing is
    written until ``commit()``; meanwhile ``awaits_commit`` is True and the engine keeps the
    version it holds."""

    def __init__(
        self,
        slots: Any,
        layout: EngineLayout,
        params: Mapping[str, Any],
        *,
        commit_on_demand: bool = False,
        group: Any = None,
    ) -> None:
        import torch

        self.table = slot_table(slots)
        self.layout = layout
        self.params = dict(params)
        self.group = group
        self.commit_on_demand = commit_on_demand
        by_slot = layout.by_slot()
        self._dtypes = {}
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
            self._dtypes[s.name] = want
        self.rank, self.world = self._rank_world()
        if self.group is None and layout.world != 1:
            raise LayoutError(
                f"a layout of rank {layout.rank} of {layout.world} needs its TP group"
            )
        # The runs the ranks below this one hold: what this rank holds there is not counted.
        mine = _held_runs(layout)
        everyone = [mine]
        if self.group is not None and self.world > 1:
            import torch.distributed as dist

            everyone = [None] * self.world
            dist.all_gather_object(everyone, mine, group=self.group)
        self._lower = {
            s.name: _as_runs(_merge([r for q in everyone[: self.rank] for r in q.get(s.name, [])]))
            for s in self.table
        }
        # Per slot, what each higher rank holds: how many copies the elements counted here have.
        self._higher = {
            s.name: [_as_runs(q.get(s.name, [])) for q in everyone[self.rank + 1 :]]
            for s in self.table
        }
        self._fresh_receiver()

    def _rank_world(self) -> tuple[int, int]:
        if self.group is None:
            return 0, 1
        import torch.distributed as dist

        return dist.get_rank(self.group), dist.get_world_size(self.group)

    def _fresh_receiver(self) -> None:
        self.receiver = _native.ChangeReceiver(self.table)
        # The verified sync's changes and their prepared writes (``_prepare``), until its
        # commit or abort.
        self._ready: tuple[list, list] | None = None

    @property
    def awaits_commit(self) -> bool:
        return self.receiver.awaits_commit

    @property
    def version(self) -> int | None:
        return self.receiver.version

    @property
    def is_staging(self) -> bool:
        return self.receiver.is_staging

    # --- the bits the core checks against: the engine's parameters, through the layout ---

    def _read(self, requests: list) -> tuple[np.ndarray, np.ndarray]:
        """Old bits and shares (see ``ChangeReceiver``) at the HF flat positions of every
        ``(slot, positions)`` request, joined in order: one read of the parameters per frame."""
        import torch

        old, held = plan_for(self.layout, self.params).read_many(
            self.params,
            [(slot, torch.from_numpy(pos), self._dtypes[slot]) for slot, pos in requests],
        )
        share = torch.where(held, COUNTED, NOT_HELD).to(torch.uint8)
        at = 0
        for slot, pos in requests:
            n = len(pos)
            if self._lower[slot][0].numel():  # a lower rank counts what it also holds here
                h = held[at : at + n]
                lower = h & _in_runs(torch.from_numpy(pos), self._lower[slot])
                share[at : at + n][lower] = HELD
            at += n
        return old.numpy(), share.numpy()

    def _replica_sums(self) -> tuple[int, int]:
        """This rank's terms of the replicas' cross-check over the settled sync's changes:
        Σ h(slot, position, old bits) over every change it holds, and the same over the changes
        it counts, each times the number of ranks holding it. Summed over the group the two
        agree when every copy of every changed element held the counting rank's old bits; the
        digest itself sees only the counted copy."""
        import torch

        held_sum = counted_sum = 0
        index = {s.name: i for i, s in enumerate(self.table)}
        for name, pos, _values, old in self.receiver.changes():
            h = _replica_hash(index[name], pos, old, self._dtypes[name].itemsize)
            held_sum += int(h.sum(dtype=np.uint64))
            p = torch.from_numpy(pos)
            mine = (~_in_runs(p, self._lower[name])).numpy()
            copies = torch.ones(p.shape, dtype=torch.int64)
            for runs in self._higher[name]:
                copies += _in_runs(p, runs).to(torch.int64)
            weighted = h[mine] * copies.numpy()[mine].astype(np.uint64)
            counted_sum += int(weighted.sum(dtype=np.uint64))
        return held_sum % (1 << 64), counted_sum % (1 << 64)

    def _prepare(self, changes: list, use_old: bool = False) -> list:
        """The plan's jobs for ``changes`` (their new bits, or the old ones to undo): checked
        and on the parameters' device, ready to write."""
        import torch

        bits = [
            (
                name,
                torch.from_numpy(pos),
                torch.from_numpy(old if use_old else values).view(self._dtypes[name]),
            )
            for name, pos, values, old in changes
        ]
        return plan_for(self.layout, self.params).prepare(bits)

    def _write(self, changes: list, use_old: bool = False) -> int:
        """Writes ``changes`` (or their old bits) into the parameters; the new bits of the
        verified sync's own changes were prepared when it was verified (``_ready``), so the
        commit is the write alone."""
        ready = self._ready
        if not use_old and ready is not None and ready[0] is changes:
            jobs = ready[1]
        else:
            jobs = self._prepare(changes, use_old)
        return plan_for(self.layout, self.params).write(self.params, jobs)

    # --- the group ---

    def _all_reduce(self, vec: Any) -> Any:
        if self.group is None or self.world == 1:
            return vec
        import torch.distributed as dist

        dist.all_reduce(vec, group=self.group)
        return vec

    def _step(self, frame: Any) -> _native.SyncOutcome | None:
        """One frame on every rank: receive here, agree with the group, settle, commit."""
        import torch

        n = len(self.table)
        error: BaseException | None = None
        complete = False
        try:
            complete = self.receiver.receive(_frame_arg(frame), self._read)
        except Exception as e:  # refused here: the group hears of it, then it is raised
            error = e
        vec = torch.zeros(2 + _LIMBS * n, dtype=torch.int64)
        vec[0] = int(error is not None)
        vec[1] = int(complete)
        if complete:
            part = self.receiver.part
            limbs = [limb for p in part for limb in _limbs(p)]
            vec[2:] = torch.tensor(limbs, dtype=torch.int64)
        vec = self._all_reduce(vec)
        refused, completed = int(vec[0]), int(vec[1])
        if refused or (completed and completed != self.world):
            self.receiver.abort_sync()
            if error is not None:
                raise error
            raise GroupRefusedError(
                f"deltacast: {refused} rank(s) of the TP group refused the sync"
                if refused
                else "deltacast: the TP group's ranks were not fed the same frames"
            )
        if not completed:
            return None
        raw = vec[2:].tolist()
        sums = [_unlimb(raw[i * _LIMBS : (i + 1) * _LIMBS]) for i in range(n)]
        replicas = (0, 0)
        try:
            self.receiver.settle(sums)
            if self.world > 1:
                replicas = self._replica_sums()
        except Exception as e:
            error = e
        ok = self._all_reduce(
            torch.tensor(
                [int(error is not None)] + _limbs(replicas[0]) + _limbs(replicas[1]),
                dtype=torch.int64,
            )
        )
        if int(ok[0]):
            self.receiver.abort_sync()
            if error is not None:
                raise error
            raise GroupRefusedError("deltacast: another rank of the TP group refused the sync")
        raw = ok[1:].tolist()
        if _unlimb(raw[:_LIMBS]) != _unlimb(raw[_LIMBS:]):
            self.receiver.abort_sync()
            raise ReplicaMismatchError(
                "deltacast: the TP group's copies of replicated elements disagree where this "
                "sync changes them (a rank's weights changed behind the receiver): the group "
                "dropped the sync; reseed"
            )
        # Verified by the whole group: the changes go to the device now, while the engine still
        # serves the version it holds, so that the commit (the pause) is the write alone. A rank
        # that cannot prepare fails its commit, which the group agrees on there.
        self._ready = None
        try:
            changes = self.receiver.changes()
            self._ready = (changes, self._prepare(changes))
        except Exception:
            pass
        if self.commit_on_demand:
            return None
        return self.commit()

    def receive(self, frame: Any) -> _native.SyncOutcome | None:
        """Takes one frame (``bytes``, a uint8 numpy array or CPU tensor) — on every rank of
        the group, the same one. Returns the ``SyncOutcome`` when it completed a sync that the
        whole group verified (then written into the engine, unless ``commit_on_demand``),
        None otherwise. A refusal anywhere in the group raises on every rank (the refusing
        rank's own error, ``GroupRefusedError`` elsewhere) and drops the sync everywhere."""
        return self._step(frame)

    def commit(self) -> _native.SyncOutcome:
        """Writes the verified sync's changes into the engine's parameters; its
        ``SyncOutcome``. On every rank of the group, like ``receive``: the ranks agree that
        every one wrote its share before the sync counts. A rank whose write fails writes its
        old bits back and says so; then every rank writes its old bits back and drops the sync
        (``CommitFailedError`` on the failing rank, ``GroupRefusedError`` on the others). A
        rank that cannot even write its old bits back holds nothing (its next sync must be a
        seed)."""
        try:
            return self._commit()
        finally:
            self._ready = None  # its device memory goes with it

    def _commit(self) -> _native.SyncOutcome:
        import torch

        changes = self._ready[0] if self._ready is not None else self.receiver.changes()
        error: Exception | None = None
        try:
            with torch.no_grad():
                self._write(changes)
        except Exception as e:  # the group hears of it, then it is raised
            error = e
        except BaseException:
            self._undo(changes)
            raise
        failed = self._all_reduce(torch.tensor([int(error is not None)], dtype=torch.int64))
        if int(failed[0]):
            self._undo(changes)
            if error is not None:
                raise CommitFailedError(
                    f"deltacast: writing the sync into the engine failed ({error}); this "
                    "rank's weights were written back and the group dropped the sync"
                ) from error
            raise GroupRefusedError(
                f"deltacast: {int(failed[0])} rank(s) of the TP group failed to write the "
                "sync; every rank wrote its old bits back and dropped it"
            )
        outcome = self.receiver.commit()
        self.last_changed_slots = sorted({c[0] for c in changes})
        return outcome

    def _undo(self, changes: list) -> None:
        """Writes the old bits of ``changes`` back and drops the sync; a rank where even that
        fails holds nothing."""
        import torch

        try:
            with torch.no_grad():
                self._write(changes, use_old=True)
            self.receiver.abort_sync()
        except BaseException:
            self.receiver.lose()
            raise

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
        the engine). Local: call it on every rank."""
        self._ready = None
        self.receiver.abort_sync()


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
