"""Offline: best-first trees over the shipped datastore + copy, cut where a node's path probability
(raw shares; the copy's confidence mapped to a constant) falls below a threshold; tokens a step and
a modelled speedup (t(n) fit of session 42's bf16 verify cost, drafting 0.64 ms) on the bf16 greedy replies."""
import json, sys
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4]))
from engine.drafters.corpus import CorpusIndex
from engine.drafters.ngram import NgramDrafter
from engine import gate as G
rows = json.load(open(str(__import__("pathlib").Path(__file__).resolve().parent / "bf16_replies.json")))
idx = CorpusIndex.load(str(__import__("pathlib").Path(__file__).resolve().parents[4]) + "/assets/ngram-smollm2.npz")
t = lambda n: 5.03 + 0.159 * n + 0.00108 * n * n
def run(thr, copy_p, cap=16):
    dr = NgramDrafter(corpus=idx)
    def cal(p):
        return copy_p if p == G.COPIED else G.raw_probability(p)
    worth = (lambda n, P, *a: P >= thr)
    toks = steps = 0; ms = 0.0; nodes = 0
    for r in rows:
        ctx, rep = r["prompt_ids"], r["response_ids"]
        i = 0
        while i < len(rep):
            tr = dr.corpus_tree(ctx + rep[:i], cap, calibrate=cal, worth=worth)
            acc, parent = 0, -1
            while i + acc < len(rep):
                nxt = [n for n in range(len(tr.tokens)) if tr.parents[n] == parent and tr.tokens[n] == rep[i + acc]]
                if not nxt: break
                parent = nxt[0]; acc += 1
            i += acc + 1; toks += acc + 1; steps += 1; nodes += len(tr.tokens)
            ms += t(len(tr.tokens) + 1) + 0.64
    return toks / steps, nodes / steps, toks / ms * t(1)
print("COPIED code", G.COPIED, "raw(COPIED)", G.raw_probability(G.COPIED))
for copy_p in (0.5, 0.7, 0.9):
    for thr in (0.02, 0.05, 0.1, 0.2, 0.3):
        a, n, sp = run(thr, copy_p)
        print(f"copy {copy_p} thr {thr}: tok/step {a:.3f} nodes {n:.2f} modelled speedup {sp:.3f}")
