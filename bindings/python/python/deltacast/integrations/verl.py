"""deltacast as a verl checkpoint engine: ``backend=deltacast``, no patch to verl.

verl imports the module named by
``actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module`` on the driver, on every
trainer rank and on every rollout worker; importing this one registers
``DeltacastCheckpointEngine`` as ``"deltacast"`` in verl's ``CheckpointEngineRegistry``.
Options come from ``engine_kwargs.deltacast.*`` (``EngineOptions``). docs/verl.md has the config
lines, what each option does and what is not supported.

Per sync verl calls ``prepare`` everywhere, ``build_topology`` on the driver,
``init_process_group``, then trainer ``send_weights`` and rollout ``receive_weights`` together,
then ``finalize``. Links and snapshots live across syncs: only the first ``prepare`` binds and
the first ``init_process_group`` connects.

- **Trainer rank r of W** drains verl's generator of full tensors (fp32 on the FSDP engine; it
  is a collective, so every rank drains it) and keeps only its part of each one, elements
  ``[n·r/W, n·(r+1)/W)`` of the flattened tensor, in a host buffer of the source dtype. Its own
  ``deltacast.Sender`` diffs that part against its snapshot of the wire dtype (bf16: rounded
  on the fly, no converted copy) and sends the frames straight to every rollout worker over its
  own authenticated TCP link (``deltacast.net``): no rank funnels through another. It waits
  for every worker's ack of (version, state digest) before ``send_weights`` returns.
- **Each rollout worker** connects to every trainer rank, checks each rank's sync against its
  host mirror of the model (wire dtype; one checked ``ChangeReceiver`` per trainer rank), and
  only when every part verified yields the changes as verl's ``delta_flush`` items, exactly as
  verl's own consumers take them (``verl.checkpoint_engine.delta_sync``: JSON spec, int32
  positions, values, verl's checksum). Parameters whose new values include a NaN (verl's
  consumers read NaN as "unchanged") and seeds go as dense flushes. The worker acks only after
  the consumer took the last flush; a failure anywhere drops the sync on this worker, tells
  every trainer rank (which re-seeds next time) and raises.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import time
from dataclasses import dataclass, fields
from typing import Any, Iterator

from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry

BACKEND = "deltacast"
WIRE_FORMAT = "delta_flush"
# Each step a trainer rank tells each worker what follows (JSON after this prefix; frames
# never start with it).
CONTROL = b"deltacast-verl-step/1\n"
# verl's positions are int32 (DeltaParam.pos_width 4).
_MAX_POSITION = (1 << 31) - 1
_TORCH_TO_WIRE = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}
_WIRE_TO_TORCH = {v: k for k, v in _TORCH_TO_WIRE.items()}


@dataclass
class EngineOptions:
    """``engine_kwargs.deltacast.*``.

    - ``transport``: ``"tcp"`` (the only one so far).
    - ``host``: the address trainer ranks listen on. Loopback by default; another address needs
      a configured secret (``DELTACAST_SECRET`` or ``secret_file``), since the generated token
      travels through verl's driver.
    - ``secret_file``: a file holding the shared secret; without it and without
      ``DELTACAST_SECRET`` each trainer rank makes a token and hands it to the rollout workers
      through ``prepare``/``build_topology`` (verl's driver and Ray's object store).
    - ``codec``: ``"auto"`` (cheapest per chunk) or a fixed ``"POS+VAL"`` pair.
    - ``wire_dtype``: what floating-point tensors become on the rollout (``"bf16"``).
    - ``stage_bytes``: the largest frame a trainer rank sends (0: verl's bucket size).
    - ``chunk_elems``: elements per independently decoded chunk (0: deltacast's default).
    - ``timeout_s``: how long a rank waits for a peer (connect, frames, acks).
    - ``device``: where yielded flushes live: ``"auto"`` (CUDA when present), ``"cpu"``,
      ``"cuda"``.
    """

    transport: str = "tcp"
    host: str = "127.0.0.1"
    secret_file: str | None = None
    codec: str = "auto"
    wire_dtype: str = "bf16"
    stage_bytes: int = 0
    chunk_elems: int = 0
    timeout_s: float = 300.0
    device: str = "auto"

    @classmethod
    def parse(cls, kwargs: dict[str, Any]) -> "EngineOptions":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ValueError(
                f"deltacast: unknown engine_kwargs.deltacast option(s) {unknown}; known: "
                f"{sorted(known)}"
            )
        o = cls(**kwargs)
        if o.transport != "tcp":
            raise ValueError(f"deltacast: transport {o.transport!r} is not supported (use 'tcp')")
        if o.wire_dtype not in ("bf16", "f16", "f32"):
            raise ValueError(f"deltacast: wire_dtype {o.wire_dtype!r}: use bf16, f16 or f32")
        if o.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"deltacast: device {o.device!r}: use auto, cpu or cuda")
        if o.timeout_s <= 0:
            raise ValueError("deltacast: timeout_s must be positive")
        return o

    def secret(self) -> bytes | None:
        """The configured secret (file, then ``DELTACAST_SECRET``), or None."""
        if self.secret_file:
            with open(self.secret_file, "rb") as f:
                data = f.read().strip()
            if not data:
                raise ValueError(f"deltacast: secret file {self.secret_file} is empty")
            return data
        env = os.environ.get("DELTACAST_SECRET")
        return env.encode() if env else None


@dataclass(frozen=True)
class Part:
    """One tensor as a trainer rank holds it: the whole tensor's name, source dtype (torch
    name) and shape, and this rank's flat range ``[lo, hi)``."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    lo: int
    hi: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def part_range(numel: int, rank: int, world: int) -> tuple[int, int]:
    """Rank ``rank``'s flat range of a tensor of ``numel`` elements split over ``world``."""
    return numel * rank // world, numel * (rank + 1) // world


def wire_dtype_of(source: str, wire: str) -> str:
    """The slot dtype a source tensor travels as: floating point as ``wire``."""
    if source not in _TORCH_TO_WIRE:
        raise ValueError(f"deltacast: tensors of {source} are not supported (floating point only)")
    if source == "float32" or _TORCH_TO_WIRE[source] == wire:
        return wire
    raise ValueError(f"deltacast: a {source} tensor cannot travel as {wire} (fp32 sources convert)")


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name, not an address
        return host == "localhost"


class _Trainer:
    """One trainer rank: its parts, its sender, its link to every rollout worker."""

    def __init__(self, opts: EngineOptions, bucket_size: int) -> None:
        self.opts = opts
        self.bucket_size = bucket_size
        self.server: Any = None
        self.token: str | None = None
        self.rank = self.world = self.rollouts = -1
        self.parts: list[Part] | None = None
        self.buffers: dict[str, Any] = {}
        self.sender: Any = None
        # Workers that have the part table (receiver ids of the server).
        self.greeted: set[int] = set()
        self.ids: list[int] = []
        self.fresh: list[int] = []
        self.seen: list[Part] = []

    def prepare(self) -> dict[str, Any]:
        if self.server is None:
            from deltacast.net import FrameServer, generate_token

            secret = self.opts.secret()
            if secret is None:
                if not _is_loopback(self.opts.host):
                    raise ValueError(
                        f"deltacast: host {self.opts.host} is not loopback; set secret_file or "
                        "DELTACAST_SECRET (a generated token would travel through Ray)"
                    )
                self.token = generate_token()
                secret = self.token.encode()
            self.server = FrameServer(
                f"{self.opts.host}:0", secret=secret, timeout_s=self.opts.timeout_s
            )
        return {"deltacast": "trainer", "address": self.server.address, "token": self.token}

    def begin(self) -> None:
        """Before the step's tensors: waits for every worker; one that joined late (or
        restarted) gets the part table and the last version whole while the buffers still
        hold it."""
        self.ids = self.server.wait_for_receivers(self.rollouts, self.opts.timeout_s)
        self.fresh = [i for i in self.ids if i not in self.greeted]
        if self.sender is not None and self.sender.version > 0:
            for i in self.fresh:
                self.server.send_to(i, self._control(syncs=2, greet=True))
                for f in self.sender.resend_seed().frames:
                    self.server.send_to(i, f)
                self.greeted.add(i)
        self.seen: list[Part] = []

    def take(self, name: str, t: Any) -> None:
        """One tensor of verl's generator: this rank's part copied into its buffer."""
        import torch

        dtype = str(t.dtype).removeprefix("torch.")
        shape = tuple(int(d) for d in t.shape)
        lo, hi = part_range(math.prod(shape), self.rank, self.world)
        part = Part(name, dtype, shape, lo, hi)
        if self.parts is not None:
            i = len(self.seen)
            if i >= len(self.parts) or self.parts[i] != part:
                raise ValueError(
                    f"deltacast: the trainer's tensors changed since the first sync at "
                    f"{name!r} {dtype} {shape} (restart the sync session)"
                )
        self.seen.append(part)
        if hi == lo:
            return
        buf = self.buffers.get(name)
        if buf is None:
            wire_dtype_of(dtype, self.opts.wire_dtype)
            buf = torch.empty(hi - lo, dtype=t.dtype)
            self.buffers[name] = buf
        with torch.no_grad():
            buf.copy_(t.detach().reshape(-1)[lo:hi])

    def end(self) -> None:
        """After the last tensor: the parts fixed at the first sync, checked after."""
        if self.parts is None:
            names = [p.name for p in self.seen]
            if len(set(names)) != len(names):
                raise ValueError("deltacast: the trainer's generator named a tensor twice")
            self.parts = self.seen
        elif len(self.seen) != len(self.parts):
            raise ValueError(
                f"deltacast: the trainer sent {len(self.seen)} tensors, {len(self.parts)} at "
                "the first sync (restart the sync session)"
            )

    def _table(self) -> Any:
        import deltacast

        assert self.parts is not None
        return deltacast.SlotTable(
            [
                (p.name, wire_dtype_of(p.dtype, self.opts.wire_dtype), (p.hi - p.lo,))
                for p in self.parts
                if p.hi > p.lo
            ]
        )

    def _control(self, syncs: int, greet: bool) -> bytes:
        """The message before each step's frames: how many syncs follow (2 for a worker that
        joined late: the last version whole, then the step), and the part table for a worker
        that has not seen it."""
        assert self.parts is not None
        body: dict[str, Any] = {"rank": self.rank, "world": self.world, "syncs": syncs}
        if greet:
            body["wire_dtype"] = self.opts.wire_dtype
            body["parts"] = [[p.name, p.dtype, list(p.shape), p.lo, p.hi] for p in self.parts]
        return CONTROL + json.dumps(body, separators=(",", ":")).encode()

    def _arrays(self) -> dict[str, Any]:
        """The parts as the sender reads them: fp32 as float32 (rounded to the wire dtype on
        the fly), 16-bit floats as their bits."""
        import torch

        out = {}
        for name, b in self.buffers.items():
            out[name] = b.numpy() if b.dtype == torch.float32 else b.view(torch.int16).numpy()
        return out

    def finish(self) -> dict:
        """The step's sync to every worker; every ack checked."""
        import deltacast

        t0 = time.perf_counter()
        if self.sender is None:
            kw: dict[str, Any] = {"codec": self.opts.codec}
            kw["bucket_size"] = self.opts.stage_bytes or self.bucket_size
            if self.opts.chunk_elems:
                kw["chunk_elems"] = self.opts.chunk_elems
            self.sender = deltacast.Sender(self._table(), **kw)
        ids, fresh = self.ids, set(self.fresh)
        for i in ids:
            if i not in self.greeted:
                self.server.send_to(i, self._control(syncs=1, greet=True))
                self.greeted.add(i)
            elif i not in fresh:
                self.server.send_to(i, self._control(syncs=1, greet=False))
        result = self.sender.sync(self._arrays())
        for f in result.frames:
            self.server.broadcast(f)
        acks = self.server.collect_acks()
        bad = [
            a
            for a in acks
            if "error" in a
            or not a["ok"]
            or a["version"] != result.version
            or a["state_digest"] != result.state_digest
        ]
        if bad or len(acks) < len(ids):
            self.sender.request_seed()
            raise RuntimeError(
                f"deltacast: trainer rank {self.rank}: sync {result.version} not taken by every "
                f"rollout worker ({len(acks)} of {len(ids)} answered; refused: {bad}); "
                "the next sync is a seed"
            )
        if self.rank != 0:
            return {}
        return {
            "deltacast/seed": float(result.kind == "seed"),
            "deltacast/changed_ratio_rank0": result.changed_ratio,
            "deltacast/wire_bytes_rank0": result.wire_bytes,
            "deltacast/full_bytes_rank0": result.full_bytes,
            "deltacast/sync_s_rank0": time.perf_counter() - t0,
        }


class DeltacastCheckpointEngine(CheckpointEngine):
    """verl's ``CheckpointEngine`` for ``backend=deltacast`` (module docstring)."""

    wire_format = WIRE_FORMAT

    def __init__(self, bucket_size: int, is_master: bool | None = None, **kwargs: Any) -> None:
        # verl builds the trainer's engine with ``is_master``, the rollout workers' without.
        self.opts = EngineOptions.parse(kwargs)
        self.bucket_size = int(bucket_size)
        self.trainer = _Trainer(self.opts, self.bucket_size) if is_master is not None else None
        self.rollout = None if is_master is not None else _rollout_side(self.opts, self.bucket_size)

    def prepare(self) -> dict[str, Any]:
        if self.trainer is not None:
            return self.trainer.prepare()
        return {"deltacast": "rollout"}

    @classmethod
    def build_topology(
        cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict]
    ) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        w, r = actor_wg_world_size, rollout_world_size
        if len(metadata) != w + r:
            raise ValueError(f"deltacast: {len(metadata)} workers prepared, {w} + {r} expected")
        roles = [m.get("deltacast") if isinstance(m, dict) else None for m in metadata]
        if roles != ["trainer"] * w + ["rollout"] * r:
            raise ValueError(
                f"deltacast: prepare() came back as {roles}; every worker must run backend "
                "deltacast (trainer ranks first, then rollout workers)"
            )
        links = [(m["address"], m["token"]) for m in metadata[:w]]
        actor = {"rank": list(range(w)), "world": [w] * w, "rollouts": [r] * w}
        rollout = {"rank": list(range(r)), "world": [w] * r, "trainers": [links] * r}
        return actor, rollout

    def init_process_group(self, **kwargs: Any) -> None:
        if self.trainer is not None:
            t = self.trainer
            rank, world, rollouts = int(kwargs["rank"]), int(kwargs["world"]), int(kwargs["rollouts"])
            if t.parts is not None and (rank, world) != (t.rank, t.world):
                raise ValueError(
                    f"deltacast: trainer rank {t.rank} of {t.world} became {rank} of {world} "
                    "(restart the sync session)"
                )
            t.rank, t.world, t.rollouts = rank, world, rollouts
        else:
            assert self.rollout is not None
            self.rollout.connect(int(kwargs["rank"]), [tuple(x) for x in kwargs["trainers"]])

    def finalize(self) -> None:
        """Nothing to free: the links and snapshots serve the next sync."""

    async def send_weights(self, weights: Any, global_steps: int | None = None) -> dict:
        """Drains verl's generator here (its tensors may be collectives of the training
        process group), then syncs on a worker thread."""
        if self.trainer is None:
            raise RuntimeError("deltacast: send_weights on a rollout worker")
        import asyncio

        t = self.trainer
        await asyncio.to_thread(t.begin)
        if hasattr(weights, "__aiter__"):
            async for name, x in weights:
                t.take(name, x)
        else:
            for name, x in weights:
                t.take(name, x)
        t.end()
        return await asyncio.to_thread(t.finish)

    def receive_weights(self, global_steps: int | None = None) -> Iterator[Any]:
        if self.rollout is None:
            raise RuntimeError("deltacast: receive_weights on a trainer rank")
        return self.rollout.receive(global_steps)

    def close(self) -> None:
        """Closes this worker's links (the end of the session)."""
        if self.trainer is not None and self.trainer.server is not None:
            self.trainer.server.close("the trainer closed the session")
            self.trainer.server = None
        if self.rollout is not None:
            self.rollout.close()


def _rollout_side(opts: EngineOptions, bucket_size: int) -> Any:
    from ._verl_rollout import Rollout

    return Rollout(opts, bucket_size)


CheckpointEngineRegistry.register(BACKEND)(DeltacastCheckpointEngine)

__all__ = [
    "BACKEND",
    "DeltacastCheckpointEngine",
    "EngineOptions",
    "Part",
    "part_range",
    "wire_dtype_of",
]
