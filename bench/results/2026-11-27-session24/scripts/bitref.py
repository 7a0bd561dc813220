import sys; sys.path.insert(0, "/work/main"); import engine
import torch
from engine.loading import load
from engine.registry import load_registry
dtype, mode = sys.argv[1], sys.argv[2]
m = load("smollm2-135m-instruct", dtype=dtype, registry=load_registry(None)).model
m.allocate(2048)
ids = [(i * 7919) % 40000 + 100 for i in range(700)]
m.prefill(ids[:-1])
out = [m.verify([ids[-1]], [-1])]
m.commit([0])
g = torch.Generator().manual_seed(0)
toks = torch.randint(100, 40000, (24,), generator=g).tolist()
par = [-1] + [int(torch.randint(0, i, (1,), generator=g)) if i > 0 else -1 for i in range(1, 24)]
par = [-1 if i == 0 else p for i, p in enumerate(par)]
out.append(m.verify(toks, par))
m.commit([0, 1])
for t in toks[:5]:
    out.append(m.verify([t], [-1])); m.commit([0])
out.append(m.verify(toks[:6], list(range(-1, 5))))
out = [o.float() for o in out]
path = f"/tmp/s24/ref_{dtype}.pt"
if mode == "save":
    torch.save(out, path); print("saved", len(out))
else:
    ref = torch.load(path)
    print(dtype, "bit-identical" if all(torch.equal(a, b) for a, b in zip(out, ref)) else
          f"DIFFER max {max(float((a-b).abs().max()) for a, b in zip(out, ref))}")
