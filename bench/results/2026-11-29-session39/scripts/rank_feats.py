"""Per reply position, every candidate a mixed chain (hybrid:K) could draft there, with what each
source says of it: the context's copy (prompt lookup's longest, most recent match; its length),
the n-gram datastore's top 3 (shares, the indexed suffix's length) and the drafter model's top 3
(probabilities), teacher-forced (exact for greedy chains: session 27's oracle.py argument).
Saved as one .pt per data set for rank_fit.py.

    python rank_feats.py DATA_DIR OUT.pt [--limit N]
"""
import argparse
import sys
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
from tf_eval import replies  # noqa: E402


def ds_top3(ds, ctx):
    for n in range(min(ds.n_max, len(ctx)), 0, -1):
        h = np.uint64(_hash_py(ctx[len(ctx) - n:]))
        i = int(np.searchsorted(ds.keys, h))
        if i < len(ds.keys) and ds.keys[i] == h:
            return [(int(t), float(s)) for t, s in zip(ds.tokens[i, :3], ds.shares[i, :3]) if t >= 0], n
    return [], 0


def lookup(ng, ctx):
    for m in (6, 5, 4, 3, 2):
        c = ng.continuations(ctx, 1, 1, m, 6)
        if c:
            return c[0][0], m
    return None, 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("out")
    ap.add_argument("--limit", type=int, default=10**9)
    ap.add_argument("--drafter", default=str(REPO / "assets/mamba-drafter-smollm2"))
    ap.add_argument("--datastore", default=str(REPO / "assets/ngram-smollm2.npz"))
    a = ap.parse_args()
    torch.set_num_threads(2)
    m = load(a.drafter, dtype="fp32").model
    dr = ModelDrafter(m, 49152, draft_vocab=getattr(m, "draft_vocab", None))
    ds = CorpusIndex.load(a.datastore)
    ng = NgramDrafter()
    out = []
    with torch.inference_mode():
        for r in replies(Path(a.data))[:a.limit]:
            ids, reply = r["prompt_ids"], r["response_ids"]
            mm = dr.model.with_own_cache()
            mm.allocate(len(ids) + len(reply) + 8)
            lg = mm.full_logits(ids + reply).float()[len(ids) - 1: len(ids) + len(reply) - 1]
            p, i = torch.softmax(lg, -1).topk(8, -1)
            ent = -(torch.softmax(lg, -1) * torch.log_softmax(lg, -1)).sum(-1)
            toks = (dr.draft_vocab[i] if dr.draft_vocab is not None else i).tolist()
            p, ent = p.tolist(), ent.tolist()
            rows = []
            for j, y in enumerate(reply):
                ctx = ids + reply[:j]
                dtop, dn = ds_top3(ds, ctx)
                c, cm = lookup(ng, ctx)
                rows.append(dict(y=y, dr=list(zip(toks[j], p[j])), ent=ent[j], ds=dtop, dn=dn, copy=c, cm=cm,
                                 pos=j))
            out.append(rows)
    torch.save(out, a.out)
    print(a.out, len(out), sum(map(len, out)))


if __name__ == "__main__":
    main()
