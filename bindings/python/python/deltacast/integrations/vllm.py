"""deltacast as a vLLM weight-transfer backend, ``"deltacast"``.

``register`` is the package's ``vllm.general_plugins`` entry point: vLLM calls it in each of its
processes (``vllm.plugins.load_general_plugins``), and it registers the backend with
``WeightTransferEngineFactory`` by module path, so the engine class
(``deltacast.integrations.vllm_backend.DeltacastWeightTransferEngine``) is imported only when a
worker builds it. Nothing here imports vLLM at import time; ``import deltacast`` never does.

Select it with ``--weight-transfer-config '{"backend": "deltacast"}'``; the lifecycle and the
init and update info are in ``vllm_backend`` and docs/engines.md."""

from __future__ import annotations

from typing import Any

BACKEND = "deltacast"
_MODULE = "deltacast.integrations.vllm_backend"
_CLASS = "DeltacastWeightTransferEngine"


def register() -> None:
    """Registers the ``"deltacast"`` backend with vLLM's ``WeightTransferEngineFactory``.
    Safe to call more than once in a process (vLLM may load plugins again)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    try:
        WeightTransferEngineFactory.register_engine(BACKEND, _MODULE, _CLASS)
    except ValueError:
        # Already registered: by an earlier call here, or by someone else under our name.
        import importlib

        ours = getattr(importlib.import_module(_MODULE), _CLASS)
        got = WeightTransferEngineFactory._registry[BACKEND]()
        if got is not ours:
            raise ValueError(
                f"the weight-transfer backend {BACKEND!r} is registered to {got!r}, not deltacast"
            ) from None


def __getattr__(name: str) -> Any:
    # The engine's classes, imported (with vLLM) on first use.
    if name in ("DeltacastWeightTransferEngine", "DeltacastInitInfo", "DeltacastUpdateInfo"):
        import importlib

        return getattr(importlib.import_module(_MODULE), name)
    raise AttributeError(name)
