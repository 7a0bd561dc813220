"""One `distill train` step of the shipped drafter's shape (forward, sampled softmax over 17,000
tokens, backward, AdamW) in fp32 and under bf16 autocast, alternated; on CUDA with TF32 too.

    .venv/bin/python bench/results/2026-11-27-session25/scripts/amp_step.py [DRAFTER_DIR] [cpu|cuda] [BATCH]

Session 25 on the 2-core Zen 4 EPYC (batch 8 x 512): fp32 3.12-3.50 s a step, bf16 autocast 2.24-2.42 s.
"""
import sys
import time

import torch
from transformers import Mamba2ForCausalLM

path = sys.argv[1] if len(sys.argv) > 1 else "assets/mamba-drafter-smollm2"
dev = sys.argv[2] if len(sys.argv) > 2 else "cpu"
B, L = (int(sys.argv[3]) if len(sys.argv) > 3 else 8), 512
m = Mamba2ForCausalLM.from_pretrained(path, dtype=torch.float32).to(dev).train()
x = torch.randint(0, 16000, (B, L), device=dev)
seen = torch.arange(17000, device=dev)
opt = torch.optim.AdamW(m.parameters(), lr=1e-4)


def step(mode: str) -> float:
    if dev == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = mode != "fp32"
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.autocast(dev, dtype=torch.bfloat16, enabled=mode == "bf16"):
        h = m.backbone(x).last_hidden_state[:, :-1].reshape(-1, m.config.hidden_size)
        logits = (h @ m.get_input_embeddings().weight[seen].T).float()
    loss = torch.nn.functional.cross_entropy(logits, x[:, 1:].reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    if dev == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


modes = ["fp32", "bf16"] + (["tf32"] if dev == "cuda" else [])
for rnd in range(2):
    for mode in modes:
        step(mode)
        ts = [step(mode) for _ in range(3)]
        print(f"round {rnd} {mode}: " + " ".join(f"{t:.3f}" for t in ts) + f" s a step ({B * L / min(ts):,.0f} tokens/s)")
