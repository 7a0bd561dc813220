"""Do "was source X right at the previous position" features help the chain scorer? (not kept)

    python prev_feats.py SELF.pt EVAL.pt   (rank_feats.py's outputs)
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
def aug(data):
    for rep in data:
        prev = None
        for f in rep:
            if prev is None:
                f["pc"] = f["pd"] = f["pr"] = 0.0
            else:
                f["pc"] = 1.0 if prev["copy"] is not None and prev["copy"] == prev["y"] else 0.0
                f["pd"] = 1.0 if prev["ds"] and prev["ds"][0][0] == prev["y"] else 0.0
                f["pr"] = 1.0 if prev["dr"][0][0] == prev["y"] else 0.0
            prev = f
def feat_prev(f, info):
    v = rf.feat_engine(f, info)
    c = 1.0 if "copy" in info else 0.0; d = 1.0 if "ds" in info else 0.0; r = 1.0 if "dr" in info else 0.0
    return v + [c * f["pc"], d * f["pd"], r * f["pr"], c * f["pd"], c * f["pr"], d * f["pc"], d * f["pr"], r * f["pc"], r * f["pd"]]
fit_data = torch.load(sys.argv[1]); ev = torch.load(sys.argv[2])
for dd in (fit_data, ev):
    for rep in dd:
        for f in rep: f["ent"] = 0.0
aug(fit_data); aug(ev)
for name, F, n in (("engine", rf.feat_engine, cs.N), ("engine+prev", feat_prev, cs.N + 9)):
    rf.FEAT, rf.NFX = F, n
    for k in range(2):
        tr = [r for i, r in enumerate(fit_data) if i % 2 != k]; te = [r for i, r in enumerate(fit_data) if i % 2 == k]
        X, M, Y, _ = rf.tensors(tr); net = rf.fit(X, M, Y, 0)
        print(name, "fold", k, rf.score_rule(te, rf.net_pick(net)))
    X, M, Y, _ = rf.tensors(fit_data); net = rf.fit(X, M, Y, 0)
    print(name, "eval", rf.score_rule(ev, rf.net_pick(net)))
