"""A/B: one `distill train` step (forward, output-layer loss, backward, AdamW) of the shipped
drafter on 8 x 512 tokens, F.cross_entropy vs chunked_cross_entropy, alternated in one process.

    python ce_ab.py ROUNDS          # step times, alternated
    MODE=0|1 python ce_ab.py mem    # peak RSS of two steps of one kind (0: F.cross_entropy)"""
import json, sys, time, torch
from pathlib import Path
from engine.distill_train import load_for_training, keep_freed_memory
from engine.mamba2_train import lean_scan, chunked_cross_entropy
torch.set_num_threads(2)
keep_freed_memory()
model = load_for_training(Path("assets/mamba-drafter-smollm2")).train()
V = model.config.vocab_size
seen = torch.tensor(json.loads(Path("assets/mamba-drafter-smollm2/draft_vocab.json").read_text())["token_ids"]) if Path("assets/mamba-drafter-smollm2/draft_vocab.json").exists() else torch.arange(23341)
unseen = torch.ones(V, dtype=torch.bool); unseen[seen] = False; unseen = torch.nonzero(unseen).flatten()
remap = torch.full((V,), -1, dtype=torch.long); remap[seen] = torch.arange(len(seen))
opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
g = torch.Generator().manual_seed(0)
x = seen[torch.randint(len(seen), (8, 512), generator=g)]
def step(chunked):
    with lean_scan():
        h = model.backbone(x).last_hidden_state[:, :-1].reshape(-1, model.config.hidden_size)
        y = x[:, 1:].reshape(-1)
        W = model.get_input_embeddings().weight
        neg = unseen[torch.randint(len(unseen), (256,))]
        sub = torch.cat([seen, neg]); Wl = W[sub]; ys = remap[y]
        loss = chunked_cross_entropy(h, Wl, ys) if chunked else torch.nn.functional.cross_entropy((h @ Wl.T).float(), ys, ignore_index=-1)
        opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
    return loss.item()
if sys.argv[1:] == ["mem"]:
    import os, resource
    step(os.environ["MODE"] == "1"); step(os.environ["MODE"] == "1")
    print("maxrss MB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
    raise SystemExit
step(False); step(True)
ts = {False: [], True: []}
for r in range(int(sys.argv[1]) if len(sys.argv) > 1 else 4):
    for c in (False, True):
        t0 = time.perf_counter(); step(c); ts[c].append(time.perf_counter() - t0)
for c in (False, True):
    print(("chunked" if c else "F.cross_entropy"), " ".join(f"{t:.2f}" for t in ts[c]), f"min {min(ts[c]):.2f} s")
