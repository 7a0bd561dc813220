"""Per-position choice among three draft sources for a chain of 5, teacher-forced (exact for
greedy chains, session 27's oracle.py): the drafter model's top token (probability p), the n-gram
datastore's (share, suffix length) and prompt lookup's copy (match length). Rules whose confidence
tables are learned on one set (--cal) and scored on another (--eval).

    python mixchain.py [--cal assets/distill/smollm2-self-eval] [--eval assets/distill/smollm2-eval]
"""
import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench/results/2026-11-27-session26/scripts"))
from engine.drafters.corpus import CorpusIndex, _hash_py  # noqa: E402
from engine.drafters.model import ModelDrafter  # noqa: E402
from engine.drafters.ngram import NgramDrafter  # noqa: E402
from engine.loading import load  # noqa: E402
from tf_eval import replies, sim_sd  # noqa: E402


def chain(hit, k=5):
    """(tokens, steps) of a greedy chain of up to k drafts over ``hit`` (session 26's sim_sd)."""
    return len(hit), sim_sd(hit, k)


def ds_top(ds, ctx):
    for n in range(min(ds.n_max, len(ctx)), 0, -1):
        h = np.uint64(_hash_py(ctx[len(ctx) - n:]))
        i = int(np.searchsorted(ds.keys, h))
        if i < len(ds.keys) and ds.keys[i] == h:
            return int(ds.tokens[i, 0]), float(ds.shares[i, 0]), n
    return None, 0.0, 0


def lookup(ng, ctx):
    for m in (6, 5, 4, 3, 2):
        c = ng.continuations(ctx, 1, 1, m, 6)
        if c:
            return c[0][0], m
    return None, 0


def features(dr, ds, ng, data, limit):
    rows = []  # per reply: list of (y, d, dp, s, ss, sn, p, pm)
    with torch.inference_mode():
        for r in replies(data)[:limit]:
            ids, reply = r["prompt_ids"], r["response_ids"]
            mm = dr.model.with_own_cache()
            mm.allocate(len(ids) + len(reply) + 8)
            lg = mm.full_logits(ids + reply).float()[len(ids) - 1: len(ids) + len(reply) - 1]
            pd, arg = torch.softmax(lg, -1).max(-1)
            dtok = (dr.draft_vocab[arg] if dr.draft_vocab is not None else arg).tolist()
            pd = pd.tolist()
            out = []
            for i, y in enumerate(reply):
                ctx = ids + reply[:i]
                s, ss, sn = ds_top(ds, ctx)
                p, pm = lookup(ng, ctx)
                out.append((y, dtok[i], pd[i], s, ss, sn, p, pm))
            rows.append(out)
    return rows


def b5(x):
    return min(4, int(x * 5))


def keys(f):
    """candidate token -> key describing which sources name it, with binned confidences."""
    y, d, dp, s, ss, sn, p, pm = f
    cands = defaultdict(lambda: [None, None, None])
    cands[d][2] = b5(dp)
    if s is not None:
        cands[s][1] = (b5(ss), min(sn, 4))
    if p is not None:
        cands[p][0] = min(pm, 4)
    return {t: tuple(v) for t, v in cands.items()}


def gate_codes(f):
    """candidate -> engine confidence code as NgramDrafter.corpus_tree assigns it (gate.COPIED,
    a datastore share, gate.MODEL + p, gate.AGREE + p); copy vs datastore: the first seen wins
    ties as there, resolved later by calibration."""
    y, d, dp, s, ss, sn, p, pm = f
    kids = {}
    if p is not None:
        kids[p] = -float(pm)
    if s is not None and s not in kids:
        kids[s] = ss
    elif s is not None:
        kids[s] = ("both", ss)
    kids[d] = (4.0 if d in kids else 2.0) + dp
    return kids


COPY_LEN = False  # gate bins with the copy's match length (<= 2, 3, >= 4) in place of one copy bin


def gbin(c):
    if isinstance(c, tuple):
        return ("both",)
    if c < 0:
        return ("copy", min(4, max(2, int(-c)))) if COPY_LEN else ("copy",)
    if c >= 4:
        return ("agree", min(9, int((c - 4) * 10)))
    if c >= 2:
        return ("model", min(9, int((c - 2) * 10)))
    return ("share", min(9, int(c * 10)))


def learn_gate(rows):
    hits, n = defaultdict(float), defaultdict(float)
    for rep in rows:
        for f in rep:
            for t, c in gate_codes(f).items():
                b = gbin(c)
                n[b] += 1
                hits[b] += t == f[0]
    return hits, n


def learn(rows):
    hits, n = defaultdict(float), defaultdict(float)
    for rep in rows:
        for f in rep:
            for t, k in keys(f).items():
                n[k] += 1
                hits[k] += t == f[0]
    return hits, n


def score(table, k):
    hits, n = table
    # back off: a key seen rarely shrinks toward its strongest single source's rate
    if n.get(k, 0) >= 20:
        return hits[k] / n[k]
    parts = []
    for j, v in enumerate(k):
        if v is not None:
            kk = tuple(v if i == j else None for i in range(3))
            if n.get(kk, 0):
                parts.append(hits[kk] / n[kk])
    prior = max(parts) if parts else 0.0
    return (hits.get(k, 0) + 20 * prior) / (n.get(k, 0) + 20)


def rules(table, gtable=None):
    def lookup_conf(f):
        y, d, dp, s, ss, sn, p, pm = f
        if p is not None:
            return p
        return s if (s is not None and ss > dp) else d

    def learned(f):
        ks = keys(f)
        return max(ks, key=lambda t: score(table, ks[t]))

    def gate_rule(f):
        ks = gate_codes(f)
        h, n = gtable

        def cal(c):
            b = gbin(c)
            if b == ("both",):  # copy and datastore agree: the better of the two bins
                cb = ("copy", 3) if COPY_LEN else ("copy",)
                return max(h[cb] / n[cb], h[("share", min(9, int(c[1] * 10)))] / max(1, n[("share", min(9, int(c[1] * 10)))]))
            return h[b] / n[b] if n.get(b) else 0.0
        return max(ks, key=lambda t: cal(ks[t]))

    return {
        "gate bins (learned)": gate_rule,
        "drafter": lambda f: f[1],
        "datastore else drafter": lambda f: f[3] if f[3] is not None else f[1],
        "lookup>drafter": lambda f: f[6] if f[6] is not None else f[1],
        "lookup>conf (session 27)": lookup_conf,
        "learned table": learned,
        "oracle": lambda f: f[0] if f[0] in (f[1], f[3], f[6]) else f[1],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--drafter", default=str(REPO / "assets/mamba-drafter-smollm2"))
    ap.add_argument("--datastore", default=str(REPO / "assets/ngram-smollm2.npz"))
    ap.add_argument("--cal", default=str(REPO / "assets/distill/smollm2-self-eval"))
    ap.add_argument("--eval", nargs="+", default=[str(REPO / "assets/distill/smollm2-eval")])
    ap.add_argument("--cal-limit", type=int, default=300)
    ap.add_argument("--copy-len", action="store_true", help="gate bins: the copy's match length as three bins")
    a = ap.parse_args()
    torch.set_num_threads(2)
    m = load(a.drafter, dtype="fp32").model
    dr = ModelDrafter(m, 49152, draft_vocab=getattr(m, "draft_vocab", None))
    ds = CorpusIndex.load(a.datastore)
    ng = NgramDrafter()
    cal = features(dr, ds, ng, Path(a.cal), a.cal_limit)
    global COPY_LEN
    COPY_LEN = "--copy-len" in sys.argv
    table = learn(cal)
    gtable = learn_gate(cal)
    for b in sorted(gtable[1], key=str):
        print(f"  gate bin {str(b):<16} n {int(gtable[1][b]):>6} right {gtable[0][b] / gtable[1][b]:.3f}")
    print(f"calibration: {a.cal}, {sum(map(len, cal))} tokens, {len(table[1])} keys")
    for name, n in sorted(table[1].items(), key=lambda kv: -kv[1])[:25]:
        print(f"  {str(name):<32} n {int(n):>6}  right {table[0][name] / n:.3f}")
    sets = {"cal (in-sample)": cal}
    for e in a.eval:
        sets[e] = features(dr, ds, ng, Path(e), 10**9)
    for sname, rows in sets.items():
        print(f"\n{sname}: {sum(map(len, rows))} tokens")
        for rname, rule in rules(table, gtable).items():
            hit_n = tok = steps = 0
            for rep in rows:
                h = [rule(f) == f[0] for f in rep]
                hit_n += sum(h)
                t, s = chain(h)
                tok, steps = tok + t, steps + s
            print(f"  {rname:<26} top-1 {hit_n / tok:.3f}   chain of 5: {tok / steps:.3f} tokens a step")


if __name__ == "__main__":
    main()
