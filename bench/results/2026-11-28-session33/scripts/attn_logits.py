# usage: SPECCHAT_AMX_ATTN=0|1 .venv/bin/python attn_logits.py OUT.pt [bf16|fp32]: SmolLM2 full-forward logits over 160 fixed tokens (session 33: AMX vs vector attention against fp32)
import sys, json, torch
from engine import native
from engine.loading import load
m = load("smollm2-135m-instruct", dtype=sys.argv[2] if len(sys.argv) > 2 else "bf16").model
ids = list(range(1000, 1300, 3)) + list(range(500, 560))
m.allocate(400)
out = m.full_logits(ids)
torch.save(out, sys.argv[1])
print(native.attention_path(64))
