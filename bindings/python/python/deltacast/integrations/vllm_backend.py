"""The ``"deltacast"`` vLLM weight-transfer engine (imports vLLM; registered by
``deltacast.integrations.vllm.register``, the package's ``vllm.general_plugins`` entry point).

Lifecycle, in each worker (every tensor-parallel rank gets the same calls):

- ``init_transfer_engine({"slots": [[name, dtype, shape], ...], "layout_cache": dir|None})``:
  ``slots`` is the sender's slot table, the HF checkpoint's names and shapes in the engine's
  dtype (``deltacast.integrations.engine_receiver.table_entries(sender.table)``). Learns this
  rank's engine layout from the model's own ``load_weights`` on a float32 copy of the model
  (once; cached under ``layout_cache`` / ``$DELTACAST_LAYOUT_CACHE``, keyed by vLLM version,
  architecture, config, slots, rank and world) and starts a receiver that holds no version: the
  first sync must be a seed. Calling it again (a new trainer, a restarted worker) starts over.
- ``start_weight_update()``: opens a session.
- ``receive_weights({"frames": [...]} or {"sync_file": path})`` (through vLLM's
  ``update_weights``, any number of calls per session): the frames of one or more syncs, as
  bytes or uint8 tensors, or a file written by ``deltacast.write_sync_file`` (JSON-able, for
  the HTTP route): one sync per session. Its last frame verifies it whole, all or nothing,
  but the weights do not change yet; a refusal raises deltacast's error and drops it.
- ``finish_weight_update()``: commits: the verified sync is written into the model (only the
  slots it changed, through the layout). A sync still half received is dropped instead and
  ``IncompleteSyncError`` raised (its frames never reached the weights).
- ``shutdown()``: drops the receiver (the next ``init_transfer_engine`` starts with a seed).

The changes are checked by the TP group together (all or nothing across it) and written
straight into the model's parameters: O(changed elements) per sync, no copy of the checkpoint.
The probe model for the layout is built on the CPU. At TP 1 with the model on a GPU (and a GPU
build of deltacast) each sync is decoded, checked and committed on the GPU
(``GpuLayoutReceiver``); otherwise, and in TP groups, it is decoded on the host and written from
there (``LayoutReceiver``); ``gpu_layout_receiver.engine_receiver`` chooses."""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from .._errors import IncompleteSyncError
from .engine_receiver import LayoutReceiver, frames_of, slot_table, table_entries
from .gpu_layout_receiver import GpuLayoutReceiver, engine_receiver
from .layout import EngineLayout, cached_layout, learn_layout


@dataclass
class DeltacastInitInfo(WeightTransferInitInfo):
    """``slots``: the sender's table as ``[name, dtype, shape]`` entries; ``layout_cache``: a
    directory for learned layouts (default ``$DELTACAST_LAYOUT_CACHE`` or
    ``~/.cache/deltacast/layouts``)."""

    slots: list
    layout_cache: str | None = None


@dataclass
class DeltacastUpdateInfo(WeightTransferUpdateInfo):
    """The frames of this call, in order: ``frames`` (bytes or uint8 tensors), then those of
    ``sync_file`` (a ``deltacast.write_sync_file`` file), if given."""

    frames: list | None = None
    sync_file: str | None = None


class DeltacastWeightTransferEngine(WeightTransferEngine[DeltacastInitInfo, DeltacastUpdateInfo]):
    """Receives deltacast syncs in HF coordinates and writes them into the worker's model
    through a layout learned from the model's own ``load_weights``."""

    init_info_cls = DeltacastInitInfo
    update_info_cls = DeltacastUpdateInfo
    # The layout is learned for the target model; a draft model would need its own.
    supports_draft_weight_update = False

    def __init__(self, config: Any, vllm_config: Any, device: Any, model: Any) -> None:
        super().__init__(config, vllm_config, device, model)
        self.receiver: LayoutReceiver | GpuLayoutReceiver | None = None
        self.layout_from_cache: bool | None = None
        self.outcomes: list[Any] = []
        self._active = False

    def _rank_world(self) -> tuple[int, int]:
        from vllm.distributed import (
            get_tensor_model_parallel_rank,
            get_tensor_model_parallel_world_size,
        )

        if self.parallel_config.pipeline_parallel_size != 1:
            raise NotImplementedError("deltacast: pipeline parallelism is not supported yet")
        return get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()

    def _learn(self, shapes: dict[str, tuple[int, ...]], rank: int, world: int) -> EngineLayout:
        """The layout from a float32 copy of the model on the CPU, built as vLLM builds it."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.utils import initialize_model
        from vllm.utils.torch_utils import set_default_torch_dtype

        vc = copy.copy(self.vllm_config)
        mc = copy.copy(self.model_config)
        mc.dtype = torch.float32
        vc.model_config = mc
        with set_current_vllm_config(vc), set_default_torch_dtype(torch.float32):
            probe = initialize_model(vllm_config=vc)
        try:
            return learn_layout(probe, shapes, rank=rank, world=world)
        finally:
            del probe

    def init_transfer_engine(self, init_info: DeltacastInitInfo) -> None:
        import vllm

        table = slot_table(init_info.slots)
        rank, world = self._rank_world()
        shapes = {s.name: tuple(s.shape) for s in table}
        entries = json.dumps(table_entries(table), separators=(",", ":"))
        key = {
            "engine": "vllm",
            "engine_version": str(vllm.__version__),
            "architecture": type(self.model).__name__,
            "config": json.loads(self.model_config.hf_config.to_json_string()),
            "slots": hashlib.sha256(entries.encode()).hexdigest(),
            "rank": rank,
            "world": world,
        }
        layout, self.layout_from_cache = cached_layout(
            key, lambda: self._learn(shapes, rank, world), init_info.layout_cache
        )
        # Stage, then commit: a sync verified in update_weights lands in finish_weight_update.
        group = None
        if world > 1:
            from vllm.distributed.parallel_state import get_tp_group

            # The TP ranks check each sync together (digest parts summed over gloo).
            group = get_tp_group().cpu_group
        self.receiver = engine_receiver(
            table,
            layout,
            dict(self.model.named_parameters()),
            commit_on_demand=True,
            group=group,
        )
        self.outcomes = []

    def start_weight_update(self) -> None:
        if self.receiver is None:
            raise RuntimeError("deltacast: init_transfer_engine first")
        self._active = True

    def receive_weights(self, update_info: DeltacastUpdateInfo) -> None:
        if self.receiver is None or not self._active:
            raise RuntimeError("deltacast: receive_weights outside start/finish_weight_update")
        with torch.no_grad():
            for frame in frames_of(update_info.frames, update_info.sync_file):
                outcome = self.receiver.receive(frame)
                if outcome is not None:
                    self.outcomes.append(outcome)

    def finish_weight_update(self) -> None:
        self._active = False
        rx = self.receiver
        if rx is None:
            return
        if rx.awaits_commit:
            with torch.no_grad():
                self.outcomes.append(rx.commit())
        elif rx.is_staging:
            rx.abort_sync()
            raise IncompleteSyncError(
                "deltacast: the session ended in the middle of a sync; it was dropped and the "
                "weights hold the last complete one"
            )

    def shutdown(self) -> None:
        self.receiver = None
        self._active = False
