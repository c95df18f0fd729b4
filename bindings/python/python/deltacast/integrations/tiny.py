"""Tiny Qwen2 and Qwen3-MoE configurations and their Hugging Face checkpoint names and shapes,
for tests that build the engines' real model classes on a CPU.

The sizes make every case of the layouts appear: an odd vocabulary that the engines pad per
rank, q/k/v heads that split over two ranks, a single KV head (Qwen3-MoE) that two ranks both
hold, biases (Qwen2), per-head norms and stacked experts (Qwen3-MoE), tied embeddings (Qwen2).
The names are those of the checkpoint files on disk (per-expert tensors), which is what the
engines' ``load_weights`` take."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

QWEN2: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 300,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "torch_dtype": "float32",
    "use_sliding_window": False,
}

QWEN3_MOE: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 64,
    "intermediate_size": 96,
    "moe_intermediate_size": 32,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "attention_bias": False,
    "vocab_size": 300,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "torch_dtype": "float32",
}

CONFIGS = {"qwen2": QWEN2, "qwen3_moe": QWEN3_MOE}


def write_config(directory: str | Path, arch: str) -> Path:
    """Writes ``config.json`` of the tiny ``arch`` into ``directory``; returns the directory."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    # Atomically: the ranks of a TP group each write it while the others may be reading it.
    tmp = d / f"config.json.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(CONFIGS[arch], indent=1))
    os.replace(tmp, d / "config.json")
    return d


def hf_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Checkpoint tensor names and shapes of a Qwen2 or Qwen3-MoE config, in file order."""
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // nh
    moe = cfg["model_type"] == "qwen3_moe"
    bias = not moe or cfg.get("attention_bias", False)
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = (h,)
        for proj, rows in (("q_proj", nh * hd), ("k_proj", nkv * hd), ("v_proj", nkv * hd)):
            out[p + f"self_attn.{proj}.weight"] = (rows, h)
            if bias:
                out[p + f"self_attn.{proj}.bias"] = (rows,)
        out[p + "self_attn.o_proj.weight"] = (h, nh * hd)
        if moe:
            out[p + "self_attn.q_norm.weight"] = (hd,)
            out[p + "self_attn.k_norm.weight"] = (hd,)
        out[p + "post_attention_layernorm.weight"] = (h,)
        if moe:
            e, mi = cfg["num_experts"], cfg["moe_intermediate_size"]
            out[p + "mlp.gate.weight"] = (e, h)
            for x in range(e):
                q = p + f"mlp.experts.{x}."
                out[q + "gate_proj.weight"] = (mi, h)
                out[q + "up_proj.weight"] = (mi, h)
                out[q + "down_proj.weight"] = (h, mi)
        else:
            it = cfg["intermediate_size"]
            out[p + "mlp.gate_proj.weight"] = (it, h)
            out[p + "mlp.up_proj.weight"] = (it, h)
            out[p + "mlp.down_proj.weight"] = (h, it)
    out["model.norm.weight"] = (h,)
    if not cfg.get("tie_word_embeddings", False):
        out["lm_head.weight"] = (v, h)
    return out
