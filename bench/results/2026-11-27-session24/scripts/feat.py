"""Target final-norm features for EAGLE-style drafter experiments (session 24)."""
import os, sys, time, random
os.environ.setdefault("SPECCHAT_NATIVE_BF16", "0")
from pathlib import Path
import torch
sys.path.insert(0, "/work/main")
from engine.distill_train import load_sequences
from engine.loading import load
from engine.registry import load_registry

src, out, n_seq, chunk = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), 100
out.mkdir(parents=True, exist_ok=True)
seqs = load_sequences(Path(src))
random.Random(0).shuffle(seqs)
seqs = seqs[:n_seq]
target = load("smollm2-135m-instruct", dtype="bf16", registry=load_registry(None)).model
print(type(target).__name__, target.dtype, file=sys.stderr)
nl, KH, E = target.kv_dims
t0, done = time.perf_counter(), 0
for c0 in range(0, len(seqs), chunk):
    part = out / f"part-{c0 // chunk:05d}.pt"
    if part.exists():
        continue
    rows = seqs[c0:c0 + chunk]
    feats, toks, starts, lens, amax = [], [], [], [], []
    order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]))
    res = {}
    for g in range(0, len(order), 8):
        grp = [rows[i] for i in order[g:g + 8]]
        B, L = len(grp), max(len(r[0]) for r in grp)
        tokens = torch.zeros(B, L, dtype=torch.long); key_ok = torch.zeros(B, L, dtype=torch.bool)
        for b, (t, s) in enumerate(grp):
            tokens[b, :len(t)] = torch.tensor(t); key_ok[b, :len(t)] = True
        kb = torch.zeros(nl, B, KH, L, E, dtype=target.dtype)
        with torch.inference_mode():
            h = target.forward_batch(tokens, torch.arange(L).expand(B, L), kb, torch.zeros_like(kb), 0, key_ok)
            for b, (t, s) in enumerate(grp):
                hb = h[b, :len(t)]
                res[order[g + b]] = (hb.to(torch.float16), target.logits(hb).float().argmax(-1).to(torch.int32))
                done += len(t)
        print(f"\r{c0 + g + B}/{len(seqs)} {done / (time.perf_counter() - t0):.0f} tok/s", end="", file=sys.stderr, flush=True)
    torch.save({"tokens": [torch.tensor(rows[i][0], dtype=torch.int32) for i in range(len(rows))],
                "starts": [rows[i][1] for i in range(len(rows))],
                "feats": [res[i][0] for i in range(len(rows))], "amax": [res[i][1] for i in range(len(rows))]},
               part.with_suffix(".tmp"))
    part.with_suffix(".tmp").replace(part)
print(file=sys.stderr)
