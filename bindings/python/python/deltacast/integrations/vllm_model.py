"""vLLM's real model classes built on a CPU, without an engine: for learning layouts and testing
an apply against vLLM's own ``load_weights``. Needs vLLM installed (its PyPI wheel works).

One process per tensor-parallel rank: ``init_distributed`` once (gloo), then ``build_model`` as
often as needed (each call builds the config's architecture afresh, dummy weights)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

# Without a target device vLLM finds no platform and no attention backend.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

ENGINE = "vllm"


def version() -> str:
    import vllm

    return str(vllm.__version__)


def config(config_dir: str | Path, tp: int, dtype: str) -> Any:
    """The ``VllmConfig`` of the model of ``config_dir`` at tensor parallel ``tp`` on a CPU."""
    from vllm.config import DeviceConfig, LoadConfig, ModelConfig, ParallelConfig, VllmConfig

    mc = ModelConfig(
        model=str(config_dir),
        dtype=dtype,
        skip_tokenizer_init=True,
        enforce_eager=True,
        max_model_len=128,
    )
    return VllmConfig(
        model_config=mc,
        device_config=DeviceConfig("cpu"),
        parallel_config=ParallelConfig(tensor_parallel_size=tp),
        load_config=LoadConfig(load_format="dummy"),
    )


_TP: int | None = None


def init_distributed(tp: int, rank: int, init_file: str | Path) -> None:
    """Joins the gloo group of ``tp`` ranks (one process each) through ``init_file``. Under a
    config without a model, so vLLM also makes the expert-parallel group (MoE models need it)."""
    global _TP
    from vllm.config import DeviceConfig, ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    vc = VllmConfig(
        device_config=DeviceConfig("cpu"), parallel_config=ParallelConfig(tensor_parallel_size=tp)
    )
    with set_current_vllm_config(vc):
        init_distributed_environment(tp, rank, f"file://{init_file}", rank, backend="gloo")
        initialize_model_parallel(tp, 1)
    _TP = tp


def build_model(config_dir: str | Path, dtype: str = "float32") -> Any:
    """The model of ``config_dir/config.json`` on this rank, parameters in ``dtype``."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype

    if _TP is None:
        raise RuntimeError("init_distributed first")
    vc = config(config_dir, _TP, dtype)
    # As vLLM's loaders do: parameters take the default dtype at construction.
    with set_current_vllm_config(vc), set_default_torch_dtype(vc.model_config.dtype):
        model = initialize_model(vllm_config=vc)
    model.eval()
    return model


def load(model: Any, named_tensors: Any) -> Any:
    """vLLM's own checkpoint path into an existing model: ``load_weights``."""
    return model.load_weights(named_tensors)


def post_load(model: Any, config_dir: str | Path, dtype: str = "float32") -> None:
    """vLLM's step after ``load_weights`` (``process_weights_after_loading``: repacks some
    layers into their runtime form; on a CPU, MoE experts through vLLM's CPU kernels)."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    if _TP is None:
        raise RuntimeError("init_distributed first")
    vc = config(config_dir, _TP, dtype)
    with set_current_vllm_config(vc):
        process_weights_after_loading(model, vc.model_config, torch.device("cpu"))
