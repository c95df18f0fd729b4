"""SGLang's real model classes built on a CPU, without a server: for learning layouts and testing
an apply against SGLang's own ``load_weights``. Needs SGLang installed (its PyPI wheel works).

Two stand-ins, both for CUDA-only pieces that a CPU model never calls: ``sgl_kernel``'s loader of
its architecture-specific ops library (that CUDA library fails to load without a GPU) returns an
empty module, and the tensor-parallel groups are built without PyNccl (gloo only). Neither
touches ``load_weights`` or the parameters it writes.

One process per tensor-parallel rank: ``init_distributed`` once, then ``build_model``."""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path
from typing import Any

# SGLang's CPU engine: layers pick their CPU paths (else RoPE reaches for vLLM's CUDA ops).
os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")

ENGINE = "sglang"


def _stub_sgl_kernel_ops() -> None:
    """Before ``import sglang``: ``sgl_kernel/__init__`` loads its CUDA ops through
    ``sgl_kernel.load_utils``; give it a loader that returns an empty ops module."""
    if "sgl_kernel" in sys.modules:
        return
    import importlib.util

    spec = importlib.util.find_spec("sgl_kernel")
    if spec is None or not spec.submodule_search_locations:
        return
    path = Path(list(spec.submodule_search_locations)[0]) / "load_utils.py"
    real = types.ModuleType("sgl_kernel.load_utils")
    real.__file__ = str(path)
    # The module's own helpers stay (other code imports them); only the two loaders change.
    exec(compile(path.read_text(), str(path), "exec"), real.__dict__)
    real._load_architecture_specific_ops = lambda: types.ModuleType("sgl_kernel.common_ops")
    real._preload_cuda_library = lambda: None
    sys.modules["sgl_kernel.load_utils"] = real


_stub_sgl_kernel_ops()


def version() -> str:
    import sglang

    return str(sglang.__version__)


_TP: int | None = None


def init_distributed(tp: int, rank: int, init_file: str | Path) -> None:
    """Joins the gloo group of ``tp`` ranks (one process each) through ``init_file``."""
    global _TP
    from sglang.srt.distributed import parallel_state as ps
    from sglang.test.test_utils import publish_build_topology

    real = ps.init_model_parallel_group

    def without_pynccl(*args: Any, **kwargs: Any) -> Any:
        kwargs["use_pynccl"] = False
        return real(*args, **kwargs)

    ps.init_model_parallel_group = without_pynccl
    ps.init_distributed_environment(tp, rank, f"file://{init_file}", rank, backend="gloo")
    publish_build_topology(world_rank=rank, tp_size=tp, ep_size=1, pp_size=1, device="cpu")
    ps.initialize_model_parallel(backend="gloo")
    _TP = tp


def build_model(config_dir: str | Path, dtype: str = "float32") -> Any:
    """The model of ``config_dir/config.json`` on this rank, parameters in ``dtype``."""
    import torch
    from sglang.srt.models.registry import ModelRegistry
    from transformers import AutoConfig

    if _TP is None:
        raise RuntimeError("init_distributed first")
    cfg = AutoConfig.from_pretrained(str(config_dir))
    arch = json.loads((Path(config_dir) / "config.json").read_text())["architectures"]
    cls, _ = ModelRegistry.resolve_model_cls(arch)
    old = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))  # as SGLang's loader: params take it
    try:
        model = cls(cfg)
    finally:
        torch.set_default_dtype(old)
    model.eval()
    return model


def load(model: Any, named_tensors: Any) -> Any:
    """SGLang's own checkpoint path into an existing model: ``load_weights``."""
    return model.load_weights(named_tensors)


def post_load(model: Any, config_dir: str | Path, dtype: str = "float32") -> None:
    """SGLang's step after ``load_weights`` (each layer's ``process_weights_after_loading``)."""
    import torch
    from sglang.srt.model_loader.loader import DefaultModelLoader

    del config_dir, dtype
    DefaultModelLoader.postprocess_weights(model, torch.device("cpu"))
