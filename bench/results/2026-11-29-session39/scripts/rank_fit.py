"""Which candidate should a mixed chain draft at each depth? Fits a scorer of candidates (features
of what the copy, the datastore and the drafter model say of each: rank_feats.py) with a listwise
softmax over each position's candidates, and scores the choice against the gate's calibration
bins (what hybrid:K does now), each source alone and the oracle: top-1 and the tokens a step of a
greedy chain of 5 (session 26's sim_sd), on held-out replies.

    python rank_fit.py FIT.pt EVAL.pt [EVAL2.pt ...] [--cv 2] [--hidden 0|16|32]
"""
import argparse
import math
import sys
from collections import defaultdict
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO / "bench/results/2026-11-27-session26/scripts"))
from tf_eval import sim_sd  # noqa: E402

MAXC = 9
DR_CANDS = 3
DR_INFO = 3


def candidates(f):
    """token -> dict of what each source says of it."""
    c = {}
    if f["copy"] is not None:
        c.setdefault(f["copy"], {})["copy"] = f["cm"]
    for r, (t, s) in enumerate(f["ds"]):
        c.setdefault(t, {})["ds"] = (r, s)
    for r, (t, p) in enumerate(f["dr"][:DR_INFO]):
        if r < DR_CANDS or t in c:  # the drafter's top DR_CANDS are candidates; its next ones only inform
            c.setdefault(t, {})["dr"] = (r, p)
    return c


NF = 26
NF2 = 44


def feat2(f, info):
    """feat's and interactions, for a linear scorer: the drafter's probability binned (its
    calibration is not linear), agreement terms, the copy's length with the drafter's view."""
    v = feat(f, info) + [0.0] * (NF2 - NF)
    p = info["dr"][1] if "dr" in info else 0.0
    s = info["ds"][1] if "ds" in info else 0.0
    if "dr" in info:
        v[26 + min(4, int(p * 5))] = 1.0  # 26..30
    v[31] = p * s
    v[32] = p * (1.0 if "copy" in info else 0.0)
    v[33] = s * (1.0 if "copy" in info else 0.0)
    v[34] = (1.0 if "copy" in info else 0.0) * f["dr"][0][1]  # a copy the drafter is sure against
    v[35] = (1.0 if "ds" in info else 0.0) * f["dr"][0][1]
    v[36] = (1.0 if "copy" in info else 0.0) * f["ent"] / 5
    v[37] = (1.0 if "ds" in info else 0.0) * f["ent"] / 5
    if "ds" in info:
        v[38 + min(3, f["dn"] - 1)] = s  # 38..41: the share by suffix length
    v[42] = 1.0 if len(info) == 3 else 0.0
    v[43] = math.sqrt(p)
    return v


FEAT = None
sys.path.insert(0, str(REPO))
from engine import chain_scorer  # noqa: E402


def feat_engine(f, info):
    """engine/chain_scorer.features of a candidate (what hybrid:K computes while drafting)."""
    return chain_scorer.features(info.get("copy", 0), info.get("ds"), f["dn"], info.get("dr"), f["dr"][0][1],
                                 f["ds"][0][1] if f["ds"] else 0.0)



def feat(f, info):
    v = [0.0] * NF
    if "copy" in info:
        v[0] = 1.0
        v[1 + min(4, info["copy"] - 2)] = 1.0  # match 2..6
    if "ds" in info:
        r, s = info["ds"]
        v[6] = 1.0
        v[7] = s
        v[8 + r] = 1.0
        v[11 + min(3, f["dn"] - 1)] = 1.0  # suffix 1..4
    if "dr" in info:
        r, p = info["dr"]
        v[15] = 1.0
        v[16] = p
        v[17] = math.log(max(p, 1e-6)) / 5
        v[18 + min(r, 2)] = 1.0
    v[21] = f["dr"][0][1]  # the drafter's top probability (context)
    v[22] = f["ent"] / 5
    v[23] = f["ds"][0][1] if f["ds"] else 0.0
    v[24] = len(info) / 3
    v[25] = 1.0 if ("dr" in info and ("ds" in info or "copy" in info)) else 0.0
    return v


def tensors(data):
    X, M, Y, toks = [], [], [], []
    for rep in data:
        for f in rep:
            c = candidates(f)
            items = list(c.items())[:MAXC]
            x = [FEAT(f, info) for _, info in items] + [[0.0] * NFX] * (MAXC - len(items))
            X.append(x)
            M.append([True] * len(items) + [False] * (MAXC - len(items)))
            t = [tok for tok, _ in items] + [-1] * (MAXC - len(items))
            toks.append(t)
            Y.append(t.index(f["y"]) if f["y"] in t else -1)
    return torch.tensor(X), torch.tensor(M), torch.tensor(Y), torch.tensor(toks)


class Scorer(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.net = torch.nn.Linear(NFX, 1) if hidden == 0 else torch.nn.Sequential(
            torch.nn.Linear(NFX, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))

    def forward(self, x, m):
        return self.net(x).squeeze(-1).masked_fill(~m, -1e9)


def fit(X, M, Y, hidden, epochs=300, wd=1e-4, seed=0):
    torch.manual_seed(seed)
    net = Scorer(hidden)
    ok = Y >= 0
    opt = torch.optim.LBFGS(net.parameters(), lr=0.5, max_iter=epochs, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(X[ok], M[ok]), Y[ok]) + wd * sum((p ** 2).sum() for p in net.parameters())
        loss.backward()
        return loss
    opt.step(closure)
    return net


# ---- the gate's calibration bins (what hybrid:K's chain does now, offline as session 37's mixchain.py)
COPIED, MODEL, AGREE = -1.0, 2.0, 4.0


def gate_codes(f):
    kids = {}
    if f["copy"] is not None:
        kids[f["copy"]] = COPIED
    for t, s in f["ds"]:
        if t not in kids:  # (the engine keeps the better calibrated of copy and share; copy first here)
            kids[t] = s
    for t, p in f["dr"][:3]:
        kids[t] = (AGREE if t in kids else MODEL) + p
    return kids


def gbin(c):
    if c < 0:
        return ("copy",)
    if c >= AGREE:
        return ("agree", min(9, int((c - AGREE) * 10)))
    if c >= MODEL:
        return ("model", min(9, int((c - MODEL) * 10)))
    return ("share", min(9, int(c * 10)))


def learn_gate(data):
    hits, n = defaultdict(float), defaultdict(float)
    for rep in data:
        for f in rep:
            for t, c in gate_codes(f).items():
                n[gbin(c)] += 1
                hits[gbin(c)] += t == f["y"]
    return {b: hits[b] / n[b] for b in n}


def score_rule(data, pick):
    hit_n = tok = steps = 0
    for rep in data:
        h = [pick(f) == f["y"] for f in rep]
        hit_n += sum(h)
        tok += len(h)
        steps += sim_sd(h, 5)
    return hit_n / tok, tok / steps


def report(name, data, picks):
    print(f"\n{name}: {sum(map(len, data))} tokens")
    for rname, pick in picks.items():
        t1, c5 = score_rule(data, pick)
        print(f"  {rname:<28} top-1 {t1:.3f}   chain of 5: {c5:.3f} tokens a step")


def net_pick(net):
    def pick(f):
        c = list(candidates(f).items())[:MAXC]
        x = torch.tensor([FEAT(f, info) for _, info in c])
        with torch.no_grad():
            return c[int(net.net(x).squeeze(-1).argmax())][0]
    return pick


def picks_for(fit_data, hiddens):
    X, M, Y, _ = tensors(fit_data)
    gt = learn_gate(fit_data)
    out = {
        "drafter": lambda f: f["dr"][0][0],
        "gate bins (learned, top-3s)": lambda f: max(gate_codes(f).items(), key=lambda kv: gt.get(gbin(kv[1]), 0.0))[0],
    }
    for h in hiddens:
        out[f"scorer hidden={h}"] = net_pick(fit(X, M, Y, h))
    out["oracle (top-3s)"] = lambda f: f["y"] if f["y"] in candidates(f) else f["dr"][0][0]
    return out


CACHE = {}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("fit")
    ap.add_argument("evals", nargs="*")
    ap.add_argument("--fit-name", help="what FIT was made from, for the saved scorer's record")
    ap.add_argument("--cv", type=int, default=2)
    ap.add_argument("--dr-cands", type=int, default=3)
    ap.add_argument("--dr-info", type=int, default=3)
    ap.add_argument("--feat2", action="store_true")
    ap.add_argument("--engine", action="store_true", help="engine/chain_scorer.py's features")
    ap.add_argument("--save", help="fit a linear scorer of the engine's features on all of FIT and write it here")
    ap.add_argument("--no-ent", action="store_true", help="without the drafter's entropy (the engine's C step gives its top k only)")
    ap.add_argument("--hidden", type=int, nargs="+", default=[0, 16])
    a = ap.parse_args()
    torch.set_num_threads(2)
    global DR_CANDS, DR_INFO
    DR_CANDS, DR_INFO = a.dr_cands, a.dr_info
    global FEAT, NFX
    FEAT, NFX = (feat2, NF2) if a.feat2 else (feat, NF)
    if a.engine or a.save:
        FEAT, NFX = feat_engine, chain_scorer.N

    fit_data = torch.load(a.fit)
    CACHE[a.fit] = fit_data
    if a.no_ent:
        for rep in fit_data:
            for f in rep:
                f["ent"] = 0.0
    if a.cv > 1:
        for k in range(a.cv):
            tr = [r for i, r in enumerate(fit_data) if i % a.cv != k]
            te = [r for i, r in enumerate(fit_data) if i % a.cv == k]
            report(f"{a.fit} fold {k} (held out)", te, picks_for(tr, a.hidden))
    if a.save:
        X, M, Y, _ = tensors(fit_data)
        net = fit(X, M, Y, 0)
        w = net.net.weight.detach()[0].tolist()
        meta = {"fitted_on": a.fit_name or a.fit, "positions": int((Y >= 0).sum()), "drafter_top_k": 3,
                "datastore_top_k": 3, "ngram": [2, 6], "command": " ".join(["rank_fit.py"] + sys.argv[1:])}
        chain_scorer.ChainScorer(tuple(w), meta).save(a.save)
        print("saved", a.save)
    picks = picks_for(fit_data, a.hidden)
    for e in a.evals:
        ev = torch.load(e)
        if a.no_ent:
            for rep in ev:
                for f in rep:
                    f["ent"] = 0.0
        report(e, ev, picks)


if __name__ == "__main__":
    main()
