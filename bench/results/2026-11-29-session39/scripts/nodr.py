"""Without the drafter: how well can a scorer rank the copy's and the datastore's candidates
(pld:auto's sources), against "the copy, else the datastore's top"?

    python nodr.py SELF.pt EVAL.pt   (rank_feats.py's outputs)
"""
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3]))
sys.path.insert(0, str(HERE))
import rank_fit as rf
from engine import chain_scorer as cs
rf.DR_CANDS = rf.DR_INFO = 3
fit_data = torch.load(sys.argv[1]); ev = torch.load(sys.argv[2])
for dd in (fit_data, ev):
    for rep in dd:
        for f in rep:
            f["ent"] = 0.0; f["dr"] = [(-5, 0.0)]  # no drafter: a dummy never-right candidate
rf.MAXC = 9
def cands_nodr(f):
    c = {}
    if f["copy"] is not None:
        c.setdefault(f["copy"], {})["copy"] = f["cm"]
    for r, (t, s) in enumerate(f["ds"]):
        c.setdefault(t, {})["ds"] = (r, s)
    return c or {-5: {}}
rf.candidates = cands_nodr
rf.FEAT, rf.NFX = rf.feat_engine, cs.N
def rule_copy_else_ds(f):
    return f["copy"] if f["copy"] is not None else (f["ds"][0][0] if f["ds"] else -5)
def rule_share(f):  # the better of copy (as 0.5) and ds share
    best, bs = None, -1
    if f["copy"] is not None: best, bs = f["copy"], 0.5
    if f["ds"] and f["ds"][0][1] > bs: best = f["ds"][0][0]
    return best
def oracle(f):
    return f["y"] if f["y"] in cands_nodr(f) else -5
for k in range(2):
    tr = [r for i, r in enumerate(fit_data) if i % 2 != k]; te = [r for i, r in enumerate(fit_data) if i % 2 == k]
    X, M, Y, _ = rf.tensors(tr); net = rf.fit(X, M, Y, 0)
    print("fold", k, "scorer", rf.score_rule(te, rf.net_pick(net)), "copy>ds", rf.score_rule(te, rule_copy_else_ds), "share", rf.score_rule(te, rule_share), "oracle", rf.score_rule(te, oracle))
X, M, Y, _ = rf.tensors(fit_data); net = rf.fit(X, M, Y, 0)
print("eval scorer", rf.score_rule(ev, rf.net_pick(net)), "copy>ds", rf.score_rule(ev, rule_copy_else_ds), "share", rf.score_rule(ev, rule_share), "oracle", rf.score_rule(ev, oracle))
