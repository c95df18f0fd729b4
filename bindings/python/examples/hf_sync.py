"""A trainer and a receiver holding Hugging Face transformers models, in one process.

The trainer takes AdamW steps on an fp32 master and syncs a bf16 copy; the receiver is a bf16
model whose parameters deltacast writes in place, by HF name. Runs on CPU with a tiny Qwen2
config (no download):

    python examples/hf_sync.py [--steps 5]
"""

from __future__ import annotations

import argparse

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

import deltacast
import deltacast.torch as dct


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--lr", type=float, default=1e-5)
    args = ap.parse_args()

    config = Qwen2Config(
        vocab_size=1024, hidden_size=128, intermediate_size=352, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    trainer = Qwen2ForCausalLM(config)  # fp32 master weights
    served = Qwen2ForCausalLM(config).to(torch.bfloat16)  # what an inference engine holds
    opt = torch.optim.AdamW(trainer.parameters(), lr=args.lr)

    # Both sides name slots by HF parameter name; named_parameters() lists a tied weight once
    # (lm_head shares embed_tokens), so the receiver never holds two views of one buffer.
    sender = deltacast.Sender(dct.slot_table(trainer, dtype=torch.bfloat16))
    receiver = dct.receiver(served)
    assert receiver.table.hash == sender.table.hash, "trainer and receiver disagree on slots"

    for step in range(args.steps + 1):
        if step:
            ids = torch.randint(0, config.vocab_size, (2, 32))
            loss = trainer(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
        result = sender.sync(dct.local_arrays(trainer, dtype=torch.bfloat16))
        for frame in result.frames:  # in a real system: over the network
            outcome = receiver.receive(frame)
        assert outcome.state_digest == result.state_digest
        print(
            f"step {step}: {result.kind:5} v{result.version} changed {result.changed_ratio:7.3%} "
            f"wire {result.wire_bytes / 1e3:9.1f} kB of {result.full_bytes / 1e3:.1f} kB full"
        )

    for (name, master), (_, copy) in zip(trainer.named_parameters(), served.named_parameters()):
        assert torch.equal(master.detach().to(torch.bfloat16).view(torch.int16), copy.view(torch.int16)), name
    ids = torch.randint(0, config.vocab_size, (1, 8))
    with torch.no_grad():
        expected = trainer.to(torch.bfloat16)(input_ids=ids).logits
        assert torch.equal(served(input_ids=ids).logits, expected)
    print("receiver bits equal the trainer's bf16 weights; logits match")


if __name__ == "__main__":
    main()
