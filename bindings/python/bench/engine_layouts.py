"""Learns SGLang's layouts of full-size model shapes on the CPU, for the GPU apply benchmark
(gpu_layout_apply.py), which needs the layouts as data and no engine.

Each layout comes from SGLang's real model class and its own ``load_weights``
(``deltacast.integrations.layout.learn_layout``), one process per tensor-parallel rank. To fit a
2-core, 24 GiB machine the models are built with one decoder layer (the benchmark repeats that
layer's layout for every layer: SGLang builds every layer of these models the same way) and the
MoE with 16 experts and a small vocabulary (its experts and attention are Qwen3-30B-A3B's). Writes ``layouts/{shape}-tp{T}-r{R}.json`` next to this file.

    ~/.cache/deltacast/engines/sglang-0.5.23/bin/python bindings/python/bench/engine_layouts.py \\
        [qwen2.5-0.5b|qwen3-30b-a3b] [TP]
"""

from __future__ import annotations

import json
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

SHAPES = {
    # Qwen2.5-0.5B's config.json (Hugging Face), one layer.
    "qwen2.5-0.5b": {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 1,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
        "hidden_act": "silu",
        "torch_dtype": "float32",
        "use_sliding_window": False,
    },
    # Qwen3-30B-A3B's layers (experts of 768, 32 heads, 4 KV heads of 128), one layer, 16
    # experts instead of 128 and a vocabulary of 8192 instead of 151936 (the probe of 128
    # experts needs ~50 GiB here). Each expert is the real one's size, so the work per changed
    # element is the real model's; totals scale with the expert count.
    "qwen3-30b-a3b": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_experts": 16,
        "num_experts_per_tok": 8,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "num_hidden_layers": 1,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "attention_bias": False,
        "vocab_size": 8192,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "torch_dtype": "float32",
    },
}


def learn_rank(shape: str, tp: int, rank: int, init_file: str, workdir: str) -> None:
    from deltacast.integrations import layout as L
    from deltacast.integrations import sglang_model as glue
    from deltacast.integrations import tiny

    cfg = SHAPES[shape]
    cdir = Path(workdir) / shape
    cdir.mkdir(parents=True, exist_ok=True)
    (cdir / f"config.json.{rank}").write_text(json.dumps(cfg))
    if rank == 0:
        (cdir / f"config.json.{rank}").replace(cdir / "config.json")
    while not (cdir / "config.json").exists():
        time.sleep(0.1)
    glue.init_distributed(tp, rank, init_file)
    t = time.perf_counter()
    model = glue.build_model(cdir, "float32")
    lay = L.learn_layout(model, tiny.hf_shapes(cfg), rank=rank, world=tp, load=glue.load)
    lay.key = {
        "engine": "sglang",
        "engine_version": glue.version(),
        "architecture": cfg["architectures"][0],
        "config": cfg,
        "rank": rank,
        "world": tp,
    }
    out = HERE / "layouts" / f"{shape}-tp{tp}-r{rank}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(lay.to_json(), separators=(",", ":")))
    blocks = sum(len(p.blocks) for p in lay.params.values())
    print(f"{shape} tp{tp} r{rank}: {len(lay.params)} parameters, {blocks} blocks, "
          f"learned in {time.perf_counter() - t:.0f} s -> {out.name}", flush=True)


def main() -> int:
    shape = sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-0.5b"
    tp = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    with tempfile.TemporaryDirectory() as d:
        init = str(Path(d) / "init")
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=learn_rank, args=(shape, tp, r, init, d)) for r in range(tp)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        return max(abs(p.exitcode or 0) for p in procs)


if __name__ == "__main__":
    sys.exit(main())
