"""FP8 rollouts against BF16 on one training run: what changes per step, and how many bytes a
deltacast sync takes, when the rollout holds block-FP8 weights instead of BF16 (issue 26).

A Qwen2 model (transformers, fp32 parameters: the masters) trains on the CPU with AdamW and a
policy-gradient-style loss (random tokens, random advantages). After every step two host
Senders sync the same fp32 parameters, each to its own Receiver:

- bf16: every parameter a bf16 slot (rounded on the fly);
- fp8: every 2-D projection (`*_proj.weight`) an f8_e4m3 slot with its `_scale_inv` slot
  (128x128 blocks, quantized on the fly as vLLM's per_block_cast_to_fp8), the rest bf16, as
  an FP8-quantized checkpoint leaves embeddings, norms and biases.

Per step and format: the changed fraction of the elements, the wire bytes (frames, headers and
digests included) and the bytes of a full copy of that format. Every sync is checked: each
receiver's state digest equals its sender's, and the fp8
receiver's bits equal the plain-torch quantization of the masters (tests/fp8_reference.py).

    python bindings/python/bench/fp8_vs_bf16.py --steps 8 --lr 1e-6 1e-5 --out DIR

Needs torch and transformers (the vLLM engine venv has both); CPU only.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import sys
from pathlib import Path

import numpy as np
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

import deltacast as dc

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from fp8_reference import BLOCK, reference  # noqa: E402


def tables(params: dict[str, torch.Tensor]) -> tuple[dc.SlotTable, dc.SlotTable, set[str]]:
    fp8 = {n for n, p in params.items() if p.dim() == 2 and n.endswith("_proj.weight")}
    bf16 = dc.SlotTable([(n, "bf16", tuple(p.shape)) for n, p in params.items()])
    slots = []
    for n, p in params.items():
        if n in fp8:
            m, k = p.shape
            slots += [(n, "f8_e4m3", (m, k)), (n + "_scale_inv", "f32", (-(-m // BLOCK), -(-k // BLOCK)))]
        else:
            slots.append((n, "bf16", tuple(p.shape)))
    return bf16, dc.SlotTable(slots), fp8


def run(lr: float, steps: int, seed: int) -> list[dict]:
    torch.manual_seed(seed)
    cfg = Qwen2Config(hidden_size=256, intermediate_size=768, num_hidden_layers=6, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=8000, tie_word_embeddings=True,
                      max_position_embeddings=512)
    model = Qwen2ForCausalLM(cfg).float().train()
    params = dict(model.named_parameters())
    opt = torch.optim.AdamW(params.values(), lr=lr, betas=(0.9, 0.999), weight_decay=0.01)
    bf16_table, fp8_table, fp8_names = tables(params)
    senders = {"bf16": dc.Sender(bf16_table), "fp8": dc.Sender(fp8_table)}
    receivers = {k: dc.Receiver(t, t.zeros()) for k, t in (("bf16", bf16_table), ("fp8", fp8_table))}
    rows = []
    for step in range(steps + 1):
        if step:
            ids = torch.randint(0, cfg.vocab_size, (8, 128))
            logp = torch.log_softmax(model(input_ids=ids).logits[:, :-1].float(), -1)
            tok = logp.gather(-1, ids[:, 1:, None]).squeeze(-1)
            loss = -(torch.randn(8, 1) * tok).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        masters = {n: p.detach().numpy() for n, p in params.items()}
        row = {"lr": lr, "step": step}
        for fmt, sender in senders.items():
            t0 = time.perf_counter()
            result = sender.sync(masters)
            seconds = time.perf_counter() - t0
            rx = receivers[fmt]
            for f in result.frames:
                outcome = rx.receive(f)
            assert outcome.state_digest == result.state_digest, (fmt, step)
            table = bf16_table if fmt == "bf16" else fp8_table
            row[fmt] = {
                "kind": result.kind,
                "changed": result.changed,
                "elements": int(sum(np.prod(s.shape, dtype=np.int64) for s in table)),
                "wire_bytes": result.wire_bytes,
                "full_bytes": int(table.total_bytes),
                "sync_s": seconds,
            }
        # The fp8 receiver holds exactly the quantization of the masters.
        for n in fp8_names:
            q, s = reference(params[n].detach())
            assert receivers["fp8"].arrays[n].tobytes() == q.numpy().tobytes(), (step, n)
            assert receivers["fp8"].arrays[n + "_scale_inv"].tobytes() == s.numpy().tobytes(), (step, n)
        rows.append(row)
        b, f = row["bf16"], row["fp8"]
        print(f"lr {lr:g} step {step}: bf16 {b['changed'] / b['elements']:.2%} changed, "
              f"{b['wire_bytes']:,} B | fp8 {f['changed'] / f['elements']:.2%} changed, "
              f"{f['wire_bytes']:,} B ({f['wire_bytes'] / max(b['wire_bytes'], 1):.2f}x bf16)", flush=True)
    return rows


def markdown(rows: list[dict]) -> str:
    out = ["| lr | step | bf16 changed | bf16 wire | fp8 changed | fp8 wire | fp8 / bf16 wire | "
           "fp8 full copy / fp8 wire |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if r["step"] == 0:
            continue
        b, f = r["bf16"], r["fp8"]
        out.append(f"| {r['lr']:g} | {r['step']} | {b['changed'] / b['elements']:.2%} | {b['wire_bytes'] / 1e3:,.1f} kB | "
                   f"{f['changed'] / f['elements']:.2%} | {f['wire_bytes'] / 1e3:,.1f} kB | "
                   f"{f['wire_bytes'] / b['wire_bytes']:.2f} | {f['full_bytes'] / f['wire_bytes']:.1f}x |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--lr", type=float, nargs="+", default=[1e-6, 1e-5])
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    torch.set_num_threads(max(torch.get_num_threads(), 1))
    rows = [r for lr in a.lr for r in run(lr, a.steps, a.seed)]
    print(markdown(rows))
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "fp8_vs_bf16.json").write_text(json.dumps(rows, indent=1))
        (a.out / "fp8_vs_bf16.md").write_text(markdown(rows) + "\n")


if __name__ == "__main__":
    main()
