"""The rollout side of deltacast's verl checkpoint engine (see ``deltacast.integrations.verl``).

One worker: a link to every trainer rank, a host mirror of the model in the wire dtype, one
``ChangeReceiver`` per trainer rank over that rank's parts of the mirror. A step is checked
whole (every rank's sync verified against the mirror) before the first flush is yielded; the
flushes are verl's ``delta_flush`` items (``verl.checkpoint_engine.delta_sync``); the acks go
out only after verl's consumer took the last one."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from .verl import _MAX_POSITION, _WIRE_TO_TORCH, CONTROL, EngineOptions, Part

# Bits of each wire dtype as the mirror holds them.
_BITS = {"bf16": np.uint16, "f16": np.uint16, "f32": np.uint32}
# The ChangeReceiver's share code for "held, and counted here" (one worker holds everything).
_COUNTED = 2


def _is_nan(bits: np.ndarray, wire: str) -> np.ndarray:
    """NaN elements of ``bits`` (the wire dtype's bit patterns)."""
    if wire == "bf16":
        return (bits & 0x7FFF) > 0x7F80
    if wire == "f16":
        return (bits & 0x7FFF) > 0x7C00
    return (bits & 0x7FFFFFFF) > 0x7F800000


@dataclass
class _Link:
    """Trainer rank ``rank``'s link, its parts and its receiver over them."""

    rank: int
    client: Any
    parts: list[Part] = field(default_factory=list)
    receiver: Any = None
    views: dict[str, np.ndarray] = field(default_factory=dict)

    def read(self, requests: list[tuple[str, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
        """The ``ChangeReceiver``'s owner read: the mirror's bits at every ``(slot, positions)``
        request, joined in order, each counted here (this worker holds whole slots)."""
        olds = [self.views[slot][positions].view(np.uint8) for slot, positions in requests]
        n = sum(len(positions) for _, positions in requests)
        old = np.concatenate(olds) if olds else np.zeros(0, dtype=np.uint8)
        return old, np.full(n, _COUNTED, dtype=np.uint8)


@dataclass
class _Piece:
    """Part of a flush: elements ``[a, b)`` of one parameter's changes (or of the whole
    parameter, for a dense flush)."""

    name: str
    a: int
    b: int


class Rollout:
    """One rollout worker's end of the engine."""

    def __init__(self, opts: EngineOptions, bucket_size: int) -> None:
        self.opts = opts
        self.bucket_size = max(int(bucket_size), 1)
        self.rank = -1
        self.trainers: list[tuple[str, str | None]] = []
        self.links: list[_Link] = []
        self.wire = opts.wire_dtype
        self.mirror: dict[str, np.ndarray] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.order: list[str] = []

    # --- links ---

    def connect(self, rank: int, trainers: list[tuple[str, str | None]]) -> None:
        """Connects to every trainer rank, once: later calls with the same trainers keep the
        links (verl calls this before every sync)."""
        from deltacast.net import FrameClient

        self.rank = rank
        if trainers == self.trainers and self.links:
            return
        self.close()
        configured = self.opts.secret()
        links = []
        for r, (address, token) in enumerate(trainers):
            secret = configured if configured is not None else (token or "").encode() or None
            client = FrameClient(address, secret=secret, timeout_s=self.opts.timeout_s)
            links.append(_Link(r, client))
        self.trainers, self.links = list(trainers), links

    def close(self) -> None:
        for link in self.links:
            try:
                link.client.close("the rollout worker closed its links")
            except Exception:  # closing a link that already failed
                pass
        self.links, self.trainers = [], []

    # --- one step ---

    def receive(self, global_steps: int | None) -> Iterator[tuple[list[tuple[str, Any]], bool]]:
        if not self.links:
            raise RuntimeError("deltacast: receive_weights before init_process_group")
        staged: list[tuple[_Link, list]] = []
        written: list[tuple[_Link, list]] = []
        yielded = False
        try:
            seeded = False
            for link in self.links:
                changes, was_seed = self._stage(link)
                staged.append((link, changes))
                seeded |= was_seed
            for link, changes in staged:
                self._write(link, changes, new=True)
                written.append((link, changes))
            plan = self._dense_plan(self.order) if seeded else self._delta_plan(staged)
            for i, (kind, pieces) in enumerate(plan):
                item = self._flush(kind, pieces, is_last=i == len(plan) - 1)
                yielded = True
                yield item, i == len(plan) - 1
            for link, _ in staged:
                o = link.receiver.commit()
                link.client.send_ack(o.version, o.state_digest, True, "")
        except BaseException as e:
            self._fail(staged, written, yielded, e)
            raise

    def _fail(self, staged: list, written: list, yielded: bool, e: BaseException) -> None:
        """Drops the step on this worker and tells every trainer rank. Before any flush was
        yielded the mirror is rolled back and each part keeps its version; after, the engine
        may hold part of the step, so every part is dropped (the next sync must be a seed)."""
        for link, changes in written:
            try:
                self._write(link, changes, new=False)
            except Exception:
                yielded = True
        for link in self.links:
            if link.receiver is None:
                continue
            if yielded:
                link.receiver.lose()
            else:
                link.receiver.abort_sync()
        why = f"rollout worker {self.rank} dropped the sync: {type(e).__name__}: {e}"
        for link in self.links:
            try:
                link.client.send_ack(0, 0, False, why)
            except Exception:  # that link failed: its trainer rank learns it from the socket
                pass

    def _stage(self, link: _Link) -> tuple[list, bool]:
        """Reads trainer rank ``link.rank``'s step: its control message, then its syncs (a
        worker that joined late first takes the last version whole, committed at once), the
        last one verified and left staged. Its changes, and whether a seed came."""
        import deltacast

        ctl = self._control(link)
        seeded = False
        changes: list = []
        for k in range(int(ctl["syncs"])):
            kind = None
            while True:
                frame = link.client.recv_frame()
                if kind is None:
                    kind = deltacast.frame_header(frame)["kind"]
                if link.receiver.receive(frame, link.read):
                    break
            seeded |= kind == "seed"
            link.receiver.settle(link.receiver.part)
            changes = link.receiver.changes()
            if k + 1 < int(ctl["syncs"]):
                self._write(link, changes, new=True)
                link.receiver.commit()
        return changes, seeded

    def _control(self, link: _Link) -> dict:
        """The step's control message from ``link``'s trainer rank; sets up its parts the
        first time (or when a restarted trainer sends them again)."""
        data = bytes(link.client.recv_frame())
        if not data.startswith(CONTROL):
            raise RuntimeError(
                f"deltacast: trainer rank {link.rank} sent a frame where its step message was "
                "expected (the link lost its place)"
            )
        try:
            ctl = json.loads(data[len(CONTROL) :])
        except ValueError as e:
            raise RuntimeError(f"deltacast: trainer rank {link.rank}: bad step message: {e}") from e
        if ctl.get("rank") != link.rank or ctl.get("world") != len(self.links):
            raise RuntimeError(
                f"deltacast: the link of trainer rank {link.rank} of {len(self.links)} speaks "
                f"for rank {ctl.get('rank')} of {ctl.get('world')}"
            )
        if "parts" in ctl:
            self._set_parts(link, ctl)
        if link.receiver is None:
            raise RuntimeError(f"deltacast: trainer rank {link.rank} sent no part table")
        if int(ctl.get("syncs", 0)) not in (1, 2):
            raise RuntimeError(f"deltacast: trainer rank {link.rank}: {ctl.get('syncs')} syncs")
        return ctl

    def _set_parts(self, link: _Link, ctl: dict) -> None:
        import deltacast
        from deltacast import _native

        wire = ctl.get("wire_dtype")
        if wire != self.wire:
            raise RuntimeError(f"deltacast: trainer rank {link.rank} sends {wire}, this worker "
                               f"expects {self.wire} (engine_kwargs.deltacast.wire_dtype)")
        parts = [Part(n, d, tuple(s), int(lo), int(hi)) for n, d, s, lo, hi in ctl["parts"]]
        order = [p.name for p in parts]
        if self.order and order != self.order:
            raise RuntimeError(f"deltacast: trainer rank {link.rank} syncs other tensors than "
                               "the others")
        for p in parts:
            if not (0 <= p.lo <= p.hi <= p.numel):
                raise RuntimeError(f"deltacast: {p.name}: part [{p.lo}, {p.hi}) out of range")
            if p.name not in self.mirror:
                self.mirror[p.name] = np.zeros(p.numel, dtype=_BITS[self.wire])
                self.shapes[p.name] = p.shape
            elif self.shapes[p.name] != p.shape:
                raise RuntimeError(f"deltacast: {p.name} changed shape")
        self.order = order
        held = [p for p in parts if p.hi > p.lo]
        if link.parts != held or link.receiver is None:
            link.parts = held
            link.views = {p.name: self.mirror[p.name][p.lo : p.hi] for p in held}
            table = deltacast.SlotTable([(p.name, self.wire, (p.hi - p.lo,)) for p in held])
            link.receiver = _native.ChangeReceiver(table)

    def _write(self, link: _Link, changes: list, new: bool) -> None:
        """Writes a part's changes (or, ``new=False``, their old bits back) into the mirror."""
        bits = _BITS[self.wire]
        for name, pos, values, old in changes:
            link.views[name][pos] = (values if new else old).view(bits)

    # --- flushes ---

    def _budget(self) -> int:
        width = np.dtype(_BITS[self.wire]).itemsize
        return max(self.bucket_size // (4 + width), 1)

    def _delta_plan(self, staged: list) -> list[tuple[str, list[_Piece]]]:
        """Flushes of the step's changes, parameter by parameter in the trainer's order:
        ``indices`` flushes of at most a bucket each; a parameter with a NaN among its new
        values goes in a dense flush of its own (verl's consumers read NaN as unchanged)."""
        self._joined = self._join(staged)
        plan: list[tuple[str, list[_Piece]]] = []
        cur: list[_Piece] = []
        room = budget = self._budget()
        for name in self.order:
            if name not in self._joined:
                continue
            pos, values = self._joined[name]
            if bool(_is_nan(values, self.wire).any()):
                plan.append(("dense", [_Piece(name, 0, len(self.mirror[name]))]))
                continue
            a = 0
            while a < len(pos):
                b = min(len(pos), a + room)
                cur.append(_Piece(name, a, b))
                room -= b - a
                a = b
                if room == 0:
                    plan.append(("indices", cur))
                    cur, room = [], budget
        if cur:
            plan.append(("indices", cur))
        return plan

    def _join(self, staged: list) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Each changed parameter's flat positions (ascending: parts in rank order) and new bits."""
        by: dict[str, tuple[list, list]] = {}
        bits = _BITS[self.wire]
        for link, changes in staged:
            lo = {p.name: p.lo for p in link.parts}
            for name, pos, values, _old in changes:
                ps, vs = by.setdefault(name, ([], []))
                ps.append(pos + lo[name])
                vs.append(values.view(bits))
        out = {}
        for name, (ps, vs) in by.items():
            pos = np.concatenate(ps)
            if len(self.mirror[name]) - 1 > _MAX_POSITION:
                raise RuntimeError(f"deltacast: {name} has more elements than verl's int32 positions hold")
            out[name] = (pos.astype(np.int32), np.concatenate(vs))
        return out

    def _dense_plan(self, names: list[str]) -> list[tuple[str, list[_Piece]]]:
        """Every parameter whole, in flushes of at most a bucket (a larger one alone)."""
        width = np.dtype(_BITS[self.wire]).itemsize
        plan: list[tuple[str, list[_Piece]]] = []
        cur: list[_Piece] = []
        used = 0
        for name in names:
            n = len(self.mirror[name])
            if cur and used + n * width > self.bucket_size:
                plan.append(("dense", cur))
                cur, used = [], 0
            cur.append(_Piece(name, 0, n))
            used += n * width
        if cur:
            plan.append(("dense", cur))
        return plan

    def _device(self) -> Any:
        import torch

        if self.opts.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        return self.opts.device

    def _flush(self, kind: str, pieces: list[_Piece], is_last: bool) -> list:
        """One ``delta_flush`` item's named tensors, as verl's consumers decode them."""
        import torch
        from verl.checkpoint_engine.delta_sync import DeltaParam, checksum

        torch_dtype = _WIRE_TO_TORCH[self.wire]
        dt = getattr(torch, torch_dtype)
        signed = np.int16 if np.dtype(_BITS[self.wire]).itemsize == 2 else np.int32
        params, vals, poss = [], [], []
        v_off = p_off = 0
        for pc in pieces:
            n = pc.b - pc.a
            if kind == "dense":
                bits = self.mirror[pc.name]
            else:
                pos, bits = self._joined[pc.name]
                bits = bits[pc.a : pc.b]
                poss.append(pos[pc.a : pc.b])
            vals.append(bits)
            params.append(
                DeltaParam(
                    name=pc.name,
                    dtype=torch_dtype,
                    shape=list(self.shapes[pc.name]),
                    pos_start=p_off if kind != "dense" else 0,
                    pos_end=p_off + 4 * n if kind != "dense" else 0,
                    pos_width=4,
                    val_start=v_off,
                    val_end=v_off + n,
                )
            )
            v_off += n
            if kind != "dense":
                p_off += 4 * n
        device = self._device()
        values = torch.from_numpy(np.concatenate(vals).view(signed)).view(dt).to(device)
        if kind == "dense":
            positions = torch.empty(0, dtype=torch.uint8, device=device)
            spec = {"encoding": "dense", "verify": False, "is_last": is_last}
        else:
            positions = torch.from_numpy(np.concatenate(poss)).view(torch.uint8).to(device)
            spec = {"encoding": "indices"}
        spec["params"] = [vars(p) for p in params]
        spec["checksum"] = int(checksum(positions, values))
        text = json.dumps(spec).encode()
        named = [("__delta_spec__", torch.frombuffer(bytearray(text), dtype=torch.uint8).to(device))]
        if kind != "dense":
            named.append(("__positions__", positions))
        named.append(("__values__", values))
        return named
