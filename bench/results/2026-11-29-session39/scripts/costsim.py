"""Offline: would a scored mixed chain cut by the gate's cost rule (k maximising E(k) / (t(k+1) +
drafting)) beat `pld:auto` on this host? Per position the scorer's choice, its softmax share
calibrated to P(right) in 10 bins on one half of the self-prompted replies, then steps simulated on
the other half and on the evaluation replies with this VM's bf16 verify costs t(n) (session 37-39
splits) and drafting costs (catch-up 1.2 ms, 0.9 ms a drafter step, 0.3 ms of lookups a depth;
--nodr: the copy and the datastore only).

    python costsim.py SELF.pt EVAL.pt [--nodr]   (rank_feats.py's outputs)
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
rf.FEAT, rf.NFX = rf.feat_engine, cs.N
self_ = torch.load(sys.argv[1]); ev = torch.load(sys.argv[2])
for dd in (self_, ev):
    for rep in dd:
        for f in rep: f["ent"] = 0.0
T = {1: 11.5, 2: 12.5, 3: 13.8, 4: 15.6, 5: 18.0, 6: 21.0, 7: 23.5, 8: 26.0, 9: 28.5}
NODR = "--nodr" in sys.argv
def D(k):  # drafting ms for a chain of k: catch-up + drafter steps + lookups
    if k == 0: return 0.3
    return (0.3 * k + 0.4) if NODR else (1.2 + 0.9 * (k - 1) + 0.3 * k)
def chosen(data, net):
    out = []
    for rep in data:
        row = []
        for f in rep:
            c = list(rf.candidates(f).items())[:rf.MAXC]
            if NODR:
                c = [(t, {k: v for k, v in info.items() if k != "dr"}) for t, info in c if "copy" in info or "ds" in info]
            if not c:
                row.append((False, 0.0, 0.0)); continue
            x = torch.tensor([rf.FEAT(f, info) for _, info in c])
            with torch.no_grad(): s = net.net(x).squeeze(-1)
            sh = torch.softmax(s, -1); i = int(s.argmax())
            row.append((c[i][0] == f["y"], float(sh[i]), float(s[i])))
        out.append(row)
    return out
half = [r for i, r in enumerate(self_) if i % 2 == 0]; other = [r for i, r in enumerate(self_) if i % 2 == 1]
X, M, Y, _ = rf.tensors(half); net = rf.fit(X, M, Y, 0)
ch_cal = chosen(half, net)
# calibrate P(right) from the chosen candidate's softmax share (10 bins) on the fit half
bins = [[0, 0] for _ in range(10)]
for row in ch_cal:
    for hit, sh, _ in row:
        b = min(9, int(sh * 10)); bins[b][0] += hit; bins[b][1] += 1
cal = [(h + 1) / (n + 2) for h, n in bins]
print("calibration", [round(c, 2) for c in cal])
for name, data in (("self (other half)", other), ("eval", ev)):
    ch = chosen(data, net)
    for K in (3, 5, 8):
        tok = ms = steps = 0
        fixed_tok = fixed_ms = 0
        for row in ch:
            i = 0
            while i < len(row):
                P = [cal[min(9, int(row[j][1] * 10))] for j in range(i, min(len(row), i + K))]
                best, bk, reach, E = -1, 0, 1.0, 1.0
                for k in range(0, len(P) + 1):
                    if k > 0:
                        reach *= P[k - 1]; E += reach
                    v = E / (T[k + 1] + D(k))
                    if v > best: best, bk = v, k
                run = 0
                while run < bk and row[i + run][0]: run += 1
                tok += run + 1; ms += T[bk + 1] + D(bk); steps += 1
                i += run + 1
        print(f"{name} K={K}: {tok/steps:.3f} tok/step, {ms/steps:.2f} ms/step, {tok/ms:.4f} tok/ms ({tok/ms*1000:.0f} tok/s); pld:auto measured 0.138 tok/ms, ar {1/11.5:.4f}")
