# Session 30: .venv/bin/python bench/results/2026-11-28-session30/scripts/pos_eval.py DRAFTER_DIR DATA_DIR
"""Top-1 agreement by position in the reply, and by whether the target's token was
seen earlier in prompt+reply (copyable), on a reply set."""
import sys, os
sys.path.insert(0, ".")
import torch
from collections import defaultdict
from pathlib import Path
from engine.drafters.model import ModelDrafter
from engine.loading import load
import importlib.util
spec = importlib.util.spec_from_file_location("tf", "bench/results/2026-11-27-session26/scripts/tf_eval.py")
tf = importlib.util.module_from_spec(spec); spec.loader.exec_module(tf)
torch.set_num_threads(int(os.environ.get("THREADS", "1")))
m = load(sys.argv[1], dtype="fp32").model
dr = ModelDrafter(m, 49152, draft_vocab=getattr(m, "draft_vocab", None))
rows = tf.replies(Path(sys.argv[2]))
pos = defaultdict(lambda: [0, 0]); seen = defaultdict(lambda: [0, 0]); invocab = [0, 0]
dv = set(dr.draft_vocab.tolist()) if dr.draft_vocab is not None else None
with torch.inference_mode():
    for r in rows:
        ids, reply = r["prompt_ids"], r["response_ids"]
        mm = dr.model.with_own_cache(); mm.allocate(len(ids) + len(reply) + 8)
        lg = mm.full_logits(ids + reply).float()[len(ids) - 1: len(ids) + len(reply) - 1]
        arg = lg.argmax(-1)
        pred = dr.draft_vocab[arg] if dr.draft_vocab is not None else arg
        hit = (pred == torch.tensor(reply)).tolist()
        ctx = set(ids)
        for i, (h, t) in enumerate(zip(hit, reply)):
            b = min(i // 16, 8)
            pos[b][0] += h; pos[b][1] += 1
            k = "in context" if t in ctx else "new"
            seen[k][0] += h; seen[k][1] += 1
            if dv is not None:
                invocab[0] += t in dv; invocab[1] += 1
            ctx.add(t)
print("by position (16-token buckets, last = 128+):", " ".join(f"{b*16}:{h/n:.3f}({n})" for b, (h, n) in sorted(pos.items())))
print("by token:", {k: f"{h/n:.3f} of {n}" for k, (h, n) in seen.items()})
if invocab[1]: print(f"target tokens inside the draft vocabulary: {invocab[0]/invocab[1]:.4f}")
