"""deltacast as an SGLang custom weight loader.

Start the server with ``--custom-weight-loader deltacast.integrations.sglang.apply_delta`` and
post ``update_weights_from_tensor(named_tensors=..., load_format=
"deltacast.integrations.sglang.apply_delta")``; SGLang's ``WeightUpdater`` calls
``apply_delta(model, named_tensors)`` in every tensor-parallel worker. The named tensors carry
deltacast data, not weights (``named_tensors`` builds them):

- ``("deltacast.slots", uint8 tensor)``: the sender's slot table, UTF-8 JSON of
  ``[[name, dtype, shape], ...]`` (HF checkpoint names, the engine's dtype). Needed in the first
  call for a model; later calls may repeat it (the same table: ignored; another table: the
  receiver starts over and the next sync must be a seed).
- ``("deltacast.frame.N", uint8 tensor)``, N = 0, 1, ...: the frames, fed in N order. They may
  hold several syncs, or part of one (the rest comes in the next call).

Per model object (cached on it as ``_deltacast``): this rank's engine layout, learned once from
the model's own ``load_weights`` on a float32 copy (cached on disk under
``$DELTACAST_LAYOUT_CACHE``), and a receiver: at TP 1 with the model on a GPU a
``GpuLayoutReceiver`` (decode and apply on the GPU), else a ``LayoutReceiver`` (host decode;
``gpu_layout_receiver.engine_receiver`` chooses). A sync is written into the model only
once it verified, all or nothing; a refusal raises deltacast's error (the weights are as they
were). The first sync after the receiver starts (a new or restarted worker) must be a seed.

The probe model is built on the CPU. Every TP worker must get the same calls: the ranks agree
on each frame."""

from __future__ import annotations

import json
from typing import Any, Iterable, Sequence

from .engine_receiver import LayoutReceiver, slot_table, table_entries
from .gpu_layout_receiver import GpuLayoutReceiver, engine_receiver
from .layout import EngineLayout, cached_layout, learn_layout

SLOTS = "deltacast.slots"
FRAME = "deltacast.frame."
LOADER = "deltacast.integrations.sglang.apply_delta"
_STATE = "_deltacast"


def named_tensors(frames: Sequence[Any], table: Any = None) -> list[tuple[str, Any]]:
    """The ``named_tensors`` of one call: the table (a ``SlotTable`` or entries; give it on
    the first call) and the frames, as uint8 CPU tensors."""
    import numpy as np
    import torch

    out = []
    if table is not None:
        text = json.dumps(table_entries(slot_table(table)), separators=(",", ":")).encode()
        out.append((SLOTS, torch.frombuffer(bytearray(text), dtype=torch.uint8)))
    for i, f in enumerate(frames):
        arr = np.frombuffer(bytes(f), dtype=np.uint8).copy()
        out.append((f"{FRAME}{i}", torch.from_numpy(arr)))
    return out


def _tensor_bytes(t: Any) -> bytes:
    return bytes(t.detach().cpu().contiguous().reshape(-1).numpy().tobytes())


def _learn(model: Any, shapes: dict[str, tuple[int, ...]], rank: int, world: int) -> EngineLayout:
    """The layout from a float32 copy of the model's class on the CPU (same config)."""
    import torch

    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)  # as SGLang's loader: parameters take it
    try:
        probe = type(model)(model.config)
    finally:
        torch.set_default_dtype(old)
    return learn_layout(probe, shapes, rank=rank, world=world)


def _start(model: Any, entries: list) -> LayoutReceiver | GpuLayoutReceiver:
    import hashlib

    import sglang
    from sglang.srt.distributed.parallel_state import (
        get_tensor_model_parallel_rank,
        get_tensor_model_parallel_world_size,
        get_tp_group,
    )

    table = slot_table(entries)
    rank, world = get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
    shapes = {s.name: tuple(s.shape) for s in table}
    text = json.dumps(table_entries(table), separators=(",", ":"))
    key = {
        "engine": "sglang",
        "engine_version": str(sglang.__version__),
        "architecture": type(model).__name__,
        "config": json.loads(model.config.to_json_string()),
        "slots": hashlib.sha256(text.encode()).hexdigest(),
        "rank": rank,
        "world": world,
    }
    layout, _ = cached_layout(key, lambda: _learn(model, shapes, rank, world))
    # The TP ranks check each sync together (digest parts summed over the gloo CPU group).
    group = get_tp_group().cpu_group if world > 1 else None
    return engine_receiver(table, layout, dict(model.named_parameters()), group=group)


def receiver_of(model: Any) -> LayoutReceiver | GpuLayoutReceiver | None:
    """The model's deltacast receiver, if a call made one."""
    return getattr(model, _STATE, None)


def reset(model: Any) -> None:
    """Forgets the model's receiver (as a restarted worker would): the next call must carry the
    table, and its first sync must be a seed."""
    if hasattr(model, _STATE):
        delattr(model, _STATE)


def apply_delta(model: Any, named_tensors: Iterable[tuple[str, Any]]) -> None:
    """The custom weight loader: feeds the frames in ``named_tensors`` to the model's receiver;
    every sync they complete is verified and then written into the model's parameters."""
    import torch

    entries = None
    frames: list[tuple[int, Any]] = []
    for name, t in named_tensors:
        if name == SLOTS:
            entries = table_entries(slot_table(json.loads(_tensor_bytes(t).decode())))
        elif name.startswith(FRAME) and name[len(FRAME) :].isdigit():
            frames.append((int(name[len(FRAME) :]), t))
        else:
            raise ValueError(
                f"deltacast loader: {name!r} is neither {SLOTS!r} nor {FRAME}N "
                "(post deltacast frames, see deltacast.integrations.sglang.named_tensors)"
            )
    frames.sort(key=lambda x: x[0])
    rx = receiver_of(model)
    if entries is not None and (rx is None or table_entries(rx.table) != entries):
        rx = _start(model, entries)
        setattr(model, _STATE, rx)
    if rx is None:
        raise ValueError(f"deltacast loader: the first call for a model must carry {SLOTS!r}")
    with torch.no_grad():
        for _, t in frames:
            rx.receive(t)
