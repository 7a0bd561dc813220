"""Teacher-forced, per reply position of the evaluation replies: which of the three draft sources
(the drafter model's top token, the n-gram datastore's, prompt lookup's) names the target's next
token, and the sd:5-style chain each source, a simple chooser and an oracle chooser would accept.

    python oracle.py DRAFTER_DIR [DATA_DIR] [DATASTORE.npz]

Exact for greedy chains: a chain's j-th draft conditions on the j-1 drafts before it, which equal
the true tokens wherever the chain is still being accepted, so "the run of consecutive hits from a
position" is what a greedy loop with that source would accept (session 22 checked this for sd:5).
"""
import sys
from collections import defaultdict
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))
from engine.drafters.corpus import CorpusIndex  # noqa: E402
from engine.drafters.model import ModelDrafter  # noqa: E402
from engine.drafters.ngram import NgramDrafter  # noqa: E402
from engine.loading import load  # noqa: E402

sys.path.insert(0, str(REPO / "bench/results/2026-11-27-session26/scripts"))
from tf_eval import replies  # noqa: E402  (session 26's reader of a data directory's replies)


def chain(hit, k=5):
    """tokens a step of a greedy chain of up to k drafts accepts on average (the target's own +1)."""
    pos = steps = 0
    while pos < len(hit):
        run = 0
        while run < k and pos + run < len(hit) and hit[pos + run]:
            run += 1
        pos += run + 1
        steps += 1
    return len(hit) / steps


def main():
    drafter = sys.argv[1]
    data = Path(sys.argv[2]) if len(sys.argv) > 2 else REPO / "assets/distill/smollm2-eval"
    ds = CorpusIndex.load(sys.argv[3] if len(sys.argv) > 3 else REPO / "assets/ngram-smollm2.npz")
    torch.set_num_threads(2)
    m = load(drafter, dtype="fp32").model
    dr = ModelDrafter(m, 49152, draft_vocab=getattr(m, "draft_vocab", None))
    ng = NgramDrafter()
    tot = defaultdict(list)  # name -> per-position hits over all replies (concatenated per reply for chains)
    chains = defaultdict(lambda: [0, 0])  # name -> (tokens, steps)
    with torch.inference_mode():
        for r in replies(data):
            ids, reply = r["prompt_ids"], r["response_ids"]
            mm = dr.model.with_own_cache()
            mm.allocate(len(ids) + len(reply) + 8)
            lg = mm.full_logits(ids + reply).float()[len(ids) - 1: len(ids) + len(reply) - 1]
            pr = torch.softmax(lg, -1)
            pd, arg = pr.max(-1)
            dtok = (dr.draft_vocab[arg] if dr.draft_vocab is not None else arg).tolist()
            pd = pd.tolist()
            h = {k: [] for k in ("drafter", "datastore", "lookup", "any", "lookup>datastore>drafter",
                                 "lookup>drafter", "lookup>conf", "oracle(lookup,drafter)")}
            for i, y in enumerate(reply):
                ctx = ids + reply[:i]
                d = dtok[i]
                s = ds.next(ctx)
                s_tok, s_share = (s if s is not None else (None, 0.0))
                c = ng.continuations(ctx, 1, 1, 2, 6)
                p_tok = c[0][0] if c else None
                h["drafter"].append(d == y)
                h["datastore"].append(s_tok == y)
                h["lookup"].append(p_tok == y)
                h["any"].append(y in (d, s_tok, p_tok))
                h["oracle(lookup,drafter)"].append(y in (d, p_tok))
                pick = p_tok if p_tok is not None else (s_tok if s_tok is not None else d)
                h["lookup>datastore>drafter"].append(pick == y)
                h["lookup>drafter"].append((p_tok if p_tok is not None else d) == y)
                # confidence: the drafter's probability against the datastore's share
                alt = s_tok if (s_tok is not None and s_share > pd[i]) else d
                h["lookup>conf"].append((p_tok if p_tok is not None else alt) == y)
            for k, v in h.items():
                tot[k] += v
                t = chains[k]
                t[0] += len(v)
                t[1] += len(v) / chain(v)
    n = len(tot["drafter"])
    print(f"{drafter}: {n} reply tokens")
    for k in tot:
        print(f"{k:<28} top-1 {sum(tot[k]) / n:.3f}   chain of 5: {chains[k][0] / chains[k][1]:.3f} tokens a step")
    only = sum(a and not b and not c for a, b, c in zip(tot["drafter"], tot["datastore"], tot["lookup"]))
    print(f"drafter right where datastore and lookup are both wrong: {only / n:.3f}")


if __name__ == "__main__":
    main()
