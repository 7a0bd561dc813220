import json, math, sys, time, glob, random, argparse, os
import torch, torch.nn.functional as F
sys.path.insert(0, "/tmp/s24")
from fd import FD
ap = argparse.ArgumentParser()
ap.add_argument("--layers", type=int, default=1); ap.add_argument("--d", type=int, default=576)
ap.add_argument("--mlp", type=int, default=1); ap.add_argument("--minutes", type=float, default=10)
ap.add_argument("--lr", type=float, default=1e-3); ap.add_argument("--tok", type=int, default=4096)
ap.add_argument("--reg", type=float, default=0.1); ap.add_argument("--out", default="/work/feat/fd.pt")
ap.add_argument("--noise", type=float, default=0.0); ap.add_argument("--parts", type=int, default=999)
ap.add_argument("--eval-only", action="store_true"); ap.add_argument("--nofeat", action="store_true"); ap.add_argument("--roll", type=int, default=0)
a = ap.parse_args()
torch.set_num_threads(2)
emb = torch.load("/work/feat/emb.pt")  # (V, D) fp32 target embedding == tied head
vocab = torch.tensor(json.load(open("/work/main/assets/mamba-drafter-smollm2/draft_vocab.json"))["token_ids"])
remap = torch.full((emb.shape[0],), -100, dtype=torch.long); remap[vocab] = torch.arange(len(vocab))
Wh = emb[vocab].contiguous()  # (Vd, D)

def load_parts(pat, limit=999):
    S = []
    for p in sorted(glob.glob(pat))[:limit]:
        d = torch.load(p)
        S += list(zip(d["tokens"], d["starts"], d["feats"], d["amax"]))
    return S
train = load_parts("/work/feat/train/part-*.pt", a.parts)
held = train[::20]; train = [s for i, s in enumerate(train) if i % 20]
ev = load_parts("/work/feat/eval/part-*.pt")
print(f"{len(train)} train seqs, {sum(len(s[0]) for s in train)} tokens; held {len(held)}; eval {len(ev)}", file=sys.stderr)

model = FD(d=a.d, layers=a.layers, mlp=bool(a.mlp))
print(f"{sum(p.numel() for p in model.parameters())/1e6:.2f}M params", file=sys.stderr)
if a.eval_only:
    model.load_state_dict(torch.load(a.out))

def batch_of(seqs):
    B, L = len(seqs), max(len(s[0]) for s in seqs) - 1
    f = torch.zeros(B, L, 576); e = torch.zeros(B, L, 576); y = torch.full((B, L), -100, dtype=torch.long)
    fy = torch.zeros(B, L, 576); m = torch.zeros(B, L, dtype=torch.bool)
    for b, (t, s, ft, am) in enumerate(seqs):
        n = len(t)
        f[b, :n - 1] = ft[:n - 1].float(); e[b, :n - 1] = emb[t[1:].long()]
        fy[b, :n - 1] = ft[1:].float()
        lab = remap[am[1:].long()]  # predicting amax[t+1]
        lo = max(0, s - 2)
        y[b, lo:n - 1] = lab[lo:]; m[b, lo:n - 1] = True
    return f, e, y, fy, m

def batches(seqs, tok, rng):
    idx = sorted(range(len(seqs)), key=lambda i: len(seqs[i][0]))
    groups, cur = [], []
    for i in idx:
        cur.append(i)
        if len(cur) * len(seqs[i][0]) >= tok:
            groups.append(cur); cur = []
    if cur: groups.append(cur)
    rng.shuffle(groups)
    return groups

@torch.no_grad()
def evaluate(seqs, k=5, maxpos=None):
    """Chain acceptance: at every reply position n, state over true (f_t, x_t+1) for t<n, draft k greedily."""
    model.eval()
    acc_len, top1, cnt = 0.0, [0] * k, [0] * k; npos = 0
    for t, s, ft, am in seqs:
        n = len(t); f = ft.float() * (0.0 if a.nofeat else 1.0); tl = t.long()
        states = [m.init_state(1) for m in model.mix]
        saved = []
        for i in range(n - 1):  # input (f_i, x_{i+1}) -> predicts amax[i+1]
            o, states = model.step(f[i:i + 1], emb[tl[i + 1:i + 2]], states)
            if i + 1 >= s - 1 and i + 1 < n - 1:
                saved.append((i + 1, o, [tuple(x.clone() for x in st) for st in states]))
        if not saved: continue
        R = len(saved)
        pos = [p for p, _, _ in saved]
        o = torch.cat([x[1] for x in saved])
        st = [tuple(torch.cat([sv[2][l][j] for sv in saved]) for j in range(2)) for l in range(len(model.mix))]
        alive = torch.ones(R, dtype=torch.bool); run = torch.zeros(R)
        for d in range(k):
            dr = vocab[(o @ Wh.T).argmax(-1)]
            tgt = torch.tensor([int(am[p + d]) if p + d < n else -1 for p in pos])
            valid = torch.tensor([p + d < n for p in pos])
            hit = (dr == tgt) & valid
            top1[d] += int((hit & alive).sum()); cnt[d] += int((alive & valid).sum())
            alive &= hit; run += alive.float()
            o, st = model.step(torch.zeros_like(o) if a.nofeat else o, emb[dr], st)
        acc_len += float((1 + run).sum()); npos += R
    model.train()
    return acc_len / max(1, npos), [round(h / max(1, c), 3) for h, c in zip(top1, cnt)]

if a.eval_only:
    print("eval", evaluate(ev), "held", evaluate(held[:40]), file=sys.stderr); sys.exit()
opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01, betas=(0.9, 0.95))
rng = random.Random(0); t0 = time.time(); step = 0; budget = a.minutes * 60
tot_est = None
while time.time() - t0 < budget:
    for g in batches(train, a.tok, rng):
        el = time.time() - t0
        if el >= budget: break
        frac = el / budget
        lr = a.lr * min(1.0, (step + 1) / 50) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for pg in opt.param_groups: pg["lr"] = lr
        f, e, y, fy, m = batch_of([train[i] for i in g])
        if a.nofeat:
            f = torch.zeros_like(f)
        if a.noise > 0:
            f = f + a.noise * torch.randn_like(f) * f.std(-1, keepdim=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            pf = model(f, e)
            if a.roll:  # second pass on own predicted features (training-time rollout)
                f2 = torch.cat([f[:, :1], pf[:, :-1].float()], 1)
                pf2 = model(f2, e[:, :]) if False else None
            logits = pf[m] @ Wh.T
        pfm = pf[m].float()
        ce = F.cross_entropy(logits.float(), y[m], ignore_index=-100)
        reg = F.smooth_l1_loss(pfm, fy[m])
        loss = ce + a.reg * reg
        opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0); opt.step()
        step += 1
        if step % 50 == 0:
            acc = ((logits.argmax(-1) == y[m]).float().mean())
            print(f"step {step} {el:.0f}s ce {ce.item():.3f} reg {reg.item():.3f} acc {acc:.3f} lr {lr:.2e}", file=sys.stderr, flush=True)
        if step % 400 == 0:
            torch.save(model.state_dict(), a.out)
torch.save(model.state_dict(), a.out)
print("final eval", evaluate(ev), "held", evaluate(held[:40]), file=sys.stderr)
