#!/usr/bin/env python3
"""Records optimizer traces of BF16 weights: a base checkpoint and, per step, the positions and
new values of every BF16 element whose bits changed (fp32 master weights + AdamW, a
policy-gradient-style loss on random tokens with random advantages).

Two safetensors files per trace, written to $OUT (default: the current folder):
  trace_{name}_base.safetensors   base::{param}          BF16 full tensor at step 0
  trace_{name}.safetensors        step{k}::{param}::idx  I32 sorted flat positions changed
                                                         between step k-1 and k
                                  step{k}::{param}::val  BF16 new values at those positions
plus trace_summary_{which}.json (changed elements per step).

Needs one CUDA GPU and torch, transformers and safetensors. The trace in
crates/deltacast/tests/data/traces was recorded by `python3 scripts/record_trace.py dense`.

Usage: python3 scripts/record_trace.py dense|moe [...]
Env:   SEED (default 1234), LR (default 1e-6), STEPS (default 8), OUT. A trace is named by its
       model and lr, plus `_seed{SEED}` when SEED is not the default. Edit the configs below for
       other shapes.
"""
import json, os, sys
import torch
from safetensors.torch import save_file
dev = os.environ.get("DEVICE", "cuda")  # DEVICE=cpu records on the CPU (slower, same kind of trace)
OUT = os.environ.get("OUT", ".")

def bf16_bits(t):
    return t.detach().to(torch.bfloat16).view(torch.int16)

def add_subulp_noise(p):
    # a real fp32 master sits anywhere inside its bf16 rounding interval
    b = p.detach().to(torch.bfloat16).float()
    ulp = (b.abs().clamp_min(1e-30).log2().floor() - 7).exp2()
    noise = (torch.rand_like(b) - 0.5) * 0.99 * ulp
    mant0 = (b.view(torch.int32) & 0x007F0000) == 0
    toward_zero = torch.sign(noise) != torch.sign(b)
    noise = torch.where(mant0 & toward_zero, noise * 0.5, noise)
    noise = torch.where(b == 0, torch.zeros_like(noise), noise)
    q = b + noise
    q = torch.where(q.to(torch.bfloat16).float() != b, b, q)  # subnormal edge cases keep the grid value
    p.data = q

def pg_step(model, opt, logits_fn, vocab, B, T):
    ids = torch.randint(0, vocab, (B, T), device=dev)
    logits = logits_fn(ids)
    logp = torch.log_softmax(logits[:, :-1].float(), -1)
    tok = logp.gather(-1, ids[:, 1:, None]).squeeze(-1)
    adv = torch.randn(B, 1, device=dev)
    loss = -(adv * tok).mean()
    opt.zero_grad(set_to_none=True); loss.backward(); opt.step()

def record(name, model, logits_fn, vocab, steps, lr, with_base, B=8, T=256):
    params = dict(model.named_parameters())
    opt = torch.optim.AdamW(params.values(), lr=lr, betas=(0.9, 0.999), weight_decay=0.01)
    prev = {n: bf16_bits(p).clone() for n, p in params.items()}
    out = {}
    if with_base:
        for n, p in params.items(): out[f"base::{n}"] = p.detach().to(torch.bfloat16).contiguous().cpu()
    stats = []
    for k in range(1, steps + 1):
        pg_step(model, opt, logits_fn, vocab, B, T)
        tot = ch = 0
        for n, p in params.items():
            cur = bf16_bits(p)
            idx = (cur.flatten() != prev[n].flatten()).nonzero().flatten()
            tot += cur.numel(); ch += idx.numel()
            if idx.numel():
                out[f"step{k}::{n}::idx"] = idx.to(torch.int32).cpu()
                out[f"step{k}::{n}::val"] = cur.flatten()[idx].view(torch.bfloat16).cpu()
            prev[n] = cur.clone()
        stats.append(dict(step=k, changed=ch, total=tot, frac=ch / tot))
        print(name, json.dumps(stats[-1]), flush=True)
    meta = dict(model=name, lr=str(lr), steps=str(steps), optimizer="AdamW(0.9,0.999,wd=0.01) fp32 master",
                loss="policy-gradient on random tokens, random advantages", torch=torch.__version__)
    base = {k: v for k, v in out.items() if k.startswith("base::")}
    if base:  # the base goes in a file of its own so each file stays small
        save_file(base, os.path.join(OUT, f"trace_{name}_base.safetensors"), metadata=meta)
    steps_only = {k: v for k, v in out.items() if not k.startswith("base::")}
    save_file(steps_only, os.path.join(OUT, f"trace_{name}.safetensors"), metadata=meta)
    return stats

SEED = int(os.environ.get("SEED", "1234"))
LR = float(os.environ.get("LR", "1e-6"))
STEPS = int(os.environ.get("STEPS", "8"))
torch.manual_seed(SEED)


def trace_name(model):
    return f"{model}_lr{LR:.0e}" + ("" if SEED == 1234 else f"_seed{SEED}")


which = sys.argv[1:]
summary = {}
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM
if "moe" in which:
    cfg = Qwen3MoeConfig(hidden_size=192, intermediate_size=512, moe_intermediate_size=96, num_hidden_layers=4,
                         num_attention_heads=6, num_key_value_heads=2, head_dim=32, num_experts=24, num_experts_per_tok=2,
                         vocab_size=2048, tie_word_embeddings=False, max_position_embeddings=1024)
    m = Qwen3MoeForCausalLM(cfg).to(dev, dtype=torch.float32); m.train()
    fn = lambda ids: m(input_ids=ids).logits
    summary["moe"] = record(trace_name("moe"), m, fn, cfg.vocab_size, STEPS, LR, with_base=True)
if "dense" in which:
    cfg = Qwen2Config(hidden_size=256, intermediate_size=768, num_hidden_layers=6, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=8000, tie_word_embeddings=True, max_position_embeddings=1024)
    m = Qwen2ForCausalLM(cfg).to(dev, dtype=torch.float32); m.train()
    fn = lambda ids: m(input_ids=ids).logits
    summary["dense"] = record(trace_name("dense"), m, fn, cfg.vocab_size, STEPS, LR, with_base=True)
json.dump(summary, open(os.path.join(OUT, "trace_summary_" + "_".join(trace_name(w) for w in which) + ".json"), "w"), indent=1)
