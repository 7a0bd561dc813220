"""Offline: tokens a step of pld:auto-style trees (16 nodes, raw shares) on teacher-forced replies."""
import json, lzma, sys
from pathlib import Path
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4]))
from engine.drafters.corpus import CorpusIndex
from engine.drafters.ngram import NgramDrafter

def load(d, limit=None):
    rows = []
    for f in sorted(Path(d).glob("responses.jsonl*")):
        with (lzma.open if f.suffix == ".xz" else open)(f, "rt") as fh:
            rows += [json.loads(l) for l in fh]
    return rows[:limit] if limit else rows

def sim(idx, rows, nodes=16):
    dr = NgramDrafter(corpus=idx)
    toks = steps = 0
    for r in rows:
        ctx, rep = list(r["prompt_ids"]), r["response_ids"]
        i = 0
        while i < len(rep):
            t = dr.corpus_tree(ctx + rep[:i], nodes)
            # longest accepted path
            node_of = {}
            acc, parent = 0, -1
            while i + acc < len(rep):
                nxt = [n for n in range(len(t.tokens)) if t.parents[n] == parent and t.tokens[n] == rep[i + acc]]
                if not nxt: break
                parent = nxt[0]; acc += 1
            i += acc + 1; toks += acc + 1; steps += 1
    return toks / steps

if __name__ == "__main__":
  ev = sys.argv[1]; lim = int(sys.argv[2]) if len(sys.argv) > 2 else None
  rows = load(ev, lim)
  for p in sys.argv[3:]:
    print(p, f"{sim(CorpusIndex.load(p), rows):.3f}", flush=True)
