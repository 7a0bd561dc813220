"""`specchat distill scorer`: fit hybrid:K's chain scorer (engine/chain_scorer.py) for a drafter and
a datastore on held-out replies of the target, and write it beside the drafter.

Teacher-forced over each reply (exact for greedy chains: a chain's accepted prefix is the run of
positions whose drafted token is the target's next one, so the choice at a depth only matters where
the context so far is the target's own): at every position, the candidates hybrid:K would weigh
there, the context's copy (prompt lookup's longest, latest match and its length), the datastore's
top 3 (share, rank, the matched suffix's length) and the drafter model's top 3 (probability, rank),
each described by chain_scorer.features. (One approximation: past the first depth a chain keeps
following the copy it looked up, its match length growing, where a fresh lookup, as here, may find a
more recent occurrence once both reach ``--ngram-max``.) The weights maximise the likelihood that the softmax
over a position's candidates puts on the target's token (a conditional logit; positions where no
candidate is right carry no information on the choice and are left out), with a small L2 penalty.
Reported: k-fold held-out top-1 and the tokens a step of a greedy chain of 5, for the drafter's
own chain and for the scored one. Use replies the drafter was not trained on and the datastore did
not index (assets/distill/smollm2-self-eval for the shipped pair), or the fit learns to trust them
more than the bench's prompts will.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Sequence

from . import chain_scorer as cs

DR_TOP = 3  # the drafter's top tokens a chain weighs (Spine's k)
DS_TOP = 3  # the datastore's (NgramDrafter.corpus_tree's branches)


def add_parser(dsub) -> None:
    p = dsub.add_parser("scorer", help="fit hybrid:K's chain scorer for a drafter and a datastore (engine/chain_scorer.py)")
    p.add_argument("--drafter", required=True, metavar="DIR", help="the drafter (an HF-format directory)")
    p.add_argument("--datastore", required=True, metavar="FILE", help="the n-gram datastore (.npz) it drafts beside")
    p.add_argument("--data", required=True, nargs="+", metavar="DIR",
                   help="`distill data` directories of held-out replies (neither trained on nor indexed)")
    p.add_argument("--out", default=None, metavar="FILE", help="where to write it (default: DRAFTER/chain_scorer.json)")
    p.add_argument("--limit", type=int, default=None, help="use the first N replies only")
    p.add_argument("--folds", type=int, default=2, help="held-out folds reported before the final fit (1: none)")
    p.add_argument("--ngram-min", type=int, default=2)
    p.add_argument("--ngram-max", type=int, default=6)
    p.add_argument("--threads", type=int, default=None)


def positions(model, corpus, seqs: Sequence[tuple[list[int], int]], ngram_min: int = 2, ngram_max: int = 6,
              progress: bool = False) -> list[list[dict]]:
    """Per reply, per position: the target's token ``y``, what each source proposes there, and
    the candidates with their features (``cands``: :func:`candidates`)."""
    import numpy as np
    import torch

    from .drafters.model import ModelDrafter
    from .drafters.ngram import NgramDrafter

    ng = NgramDrafter()
    dr = ModelDrafter(model, model.vocab_size, draft_vocab=getattr(model, "draft_vocab", None))  # the head as it drafts
    out = []
    t0 = time.perf_counter()
    with torch.inference_mode():
        for n, (ids, start) in enumerate(seqs, 1):
            if progress and (n % 25 == 0 or n == len(seqs)):
                el = time.perf_counter() - t0
                print(f"\r[{n}/{len(seqs)}] replies, ETA {el / n * (len(seqs) - n):4.0f} s ", end="", file=sys.stderr, flush=True)
            if start < 1 or start >= len(ids):
                continue
            m = dr.model.with_own_cache()
            m.allocate(len(ids) + 8)
            lg = dr._raw(m.full_logits(list(ids)))[start - 1: len(ids) - 1]
            p, i = torch.softmax(lg, -1).topk(min(DR_TOP, lg.shape[-1]), -1)
            toks = (dr.draft_vocab[i] if dr.draft_vocab is not None else i).tolist()
            p = p.tolist()
            h = np.asarray(ids, dtype=np.int64)
            rows = []
            for j in range(start, len(ids)):
                lens: list[int] = []
                got = ng.continuations(h[:j], 1, 1, ngram_min, ngram_max, lengths=lens)
                top, suffix = corpus.top_suffix(ids[max(0, j - corpus.n_max):j], DS_TOP)
                f = {"y": int(ids[j]), "copy": (got[0][0], lens[0]) if got else None, "ds": top, "suffix": suffix,
                     "dr": list(zip(toks[j - start], p[j - start]))}
                f["cands"] = candidates(f)  # once: every fold's fit and evaluation reads them
                rows.append(f)
            out.append(rows)
    return out


def candidates(f: dict) -> list[tuple[int, list[float]]]:
    """A position's candidates in the order a chain pushes them (copy, datastore, drafter) with
    their features, as NgramDrafter.corpus_tree computes them."""
    order: list[int] = []
    copy = {}
    if f["copy"] is not None:
        copy[f["copy"][0]] = f["copy"][1]
        order.append(f["copy"][0])
    ds = {t: (r, s) for r, (t, s) in enumerate(f["ds"])}
    dr = {t: (r, p) for r, (t, p) in enumerate(f["dr"])}
    for t in list(ds) + list(dr):
        if t not in order:
            order.append(t)
    dr_top = f["dr"][0][1] if f["dr"] else 0.0
    ds_top = f["ds"][0][1] if f["ds"] else 0.0
    return [(t, cs.features(copy.get(t, 0), ds.get(t), f["suffix"], dr.get(t), dr_top, ds_top)) for t in order]


def _tensors(rows: list[list[dict]]):
    import torch

    width = max((len(f["cands"]) for rep in rows for f in rep), default=1)
    X, M, Y = [], [], []
    for rep in rows:
        for f in rep:
            c = f["cands"]
            toks = [t for t, _ in c]
            if f["y"] not in toks:
                continue
            X.append([x for _, x in c] + [[0.0] * cs.N] * (width - len(c)))
            M.append([True] * len(c) + [False] * (width - len(c)))
            Y.append(toks.index(f["y"]))
    return torch.tensor(X).reshape(-1, width, cs.N), torch.tensor(M).reshape(-1, width), torch.tensor(Y, dtype=torch.long)


def fit(rows: list[list[dict]], l2: float = 1e-4, iters: int = 300) -> tuple[float, ...]:
    """The conditional-logit weights (no bias: it cancels in a softmax over candidates)."""
    import torch

    X, M, Y = _tensors(rows)
    w = torch.zeros(cs.N, dtype=torch.float32, requires_grad=True)
    if len(Y) == 0:
        return tuple([0.0] * cs.N)
    opt = torch.optim.LBFGS([w], lr=0.5, max_iter=iters, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        s = (X @ w).masked_fill(~M, -1e9)
        loss = torch.nn.functional.cross_entropy(s, Y) + l2 * (w ** 2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return tuple(float(x) for x in w.detach())


def chain_steps(hit: list[bool], k: int = 5) -> int:
    """Target steps a greedy chain of up to ``k`` drafts takes over a reply whose per-position
    draft hits are ``hit`` (each step accepts the run of hits up to k, plus the target's token)."""
    pos = steps = 0
    while pos < len(hit):
        run = 0
        while run < k and pos + run < len(hit) and hit[pos + run]:
            run += 1
        pos += run + 1
        steps += 1
    return steps


def evaluate(rows: list[list[dict]], pick) -> tuple[float, float]:
    """(top-1, tokens a step of a greedy chain of 5) of a per-position choice ``pick(f) -> token``."""
    hits = tokens = steps = 0
    for rep in rows:
        h = [pick(f) == f["y"] for f in rep]
        hits, tokens, steps = hits + sum(h), tokens + len(h), steps + chain_steps(h)
    return (hits / tokens, tokens / steps) if tokens else (0.0, 0.0)


def scored_pick(weights: Sequence[float]):
    sc = cs.ChainScorer(tuple(weights), {})

    def pick(f):
        c = f["cands"]
        return max(c, key=lambda tx: sc.score(tx[1]))[0] if c else None  # max keeps the first of ties, as the heap
    return pick


def drafter_pick(f):
    return f["dr"][0][0] if f["dr"] else None


def cmd_scorer(args: argparse.Namespace) -> int:
    import torch

    from . import loading
    from .distill_train import check_vocab, load_sequences, responses_file
    from .drafters.corpus import CorpusIndex
    from .errors import SpecchatError

    if args.out and Path(args.out).is_dir():
        raise SpecchatError(f"{args.out}: --out is a directory (it names the .json file to write)")
    if not 1 <= args.ngram_min <= args.ngram_max <= 32:
        raise SpecchatError("n-gram sizes must satisfy 1 <= --ngram-min <= --ngram-max <= 32")
    data = [Path(d) for d in args.data]
    for d in data:
        responses_file(d)
    if args.threads:
        torch.set_num_threads(args.threads)
    corpus = CorpusIndex.load(args.datastore)
    loading.READ_CHAIN_SCORER = False  # the file this refits may be stale or corrupt
    try:
        got = loading.load(args.drafter, dtype="fp32")
    finally:
        loading.READ_CHAIN_SCORER = True
    if got.fmt != "hf" or not Path(got.path).is_dir():
        raise SpecchatError(f"{args.drafter}: a chain scorer is read from an HF-format drafter directory, not a {got.fmt} file")
    drafter_dir = Path(got.path)
    out = Path(args.out) if args.out else drafter_dir / cs.FILE
    if got.tokenizer is not None and not corpus.fits(got.tokenizer):
        raise SpecchatError(f"{args.datastore}: the datastore was built with another tokenizer than {drafter_dir}'s")
    seqs = [s for d in data for s in load_sequences(d)][: args.limit]
    check_vocab((ids for ids, _ in seqs), got.model.vocab_size, " ".join(map(str, data)))
    t0 = time.perf_counter()
    rows = positions(got.model, corpus, seqs, args.ngram_min, args.ngram_max, progress=True)
    print(file=sys.stderr)
    n_pos = sum(map(len, rows))
    if not n_pos:
        raise SpecchatError(f"{' '.join(map(str, data))}: no reply tokens to fit on")
    print(f"{len(rows)} replies, {n_pos} positions in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    folds = []
    for k in range(args.folds if args.folds > 1 else 0):
        train = [r for i, r in enumerate(rows) if i % args.folds != k]
        test = [r for i, r in enumerate(rows) if i % args.folds == k]
        d1, d5 = evaluate(test, drafter_pick)
        s1, s5 = evaluate(test, scored_pick(fit(train)))
        folds.append({"drafter_top1": round(d1, 4), "drafter_chain5": round(d5, 3), "scored_top1": round(s1, 4),
                      "scored_chain5": round(s5, 3)})
        print(f"fold {k + 1}/{args.folds} (held out): the drafter's chain of 5 {d5:.3f} tokens a step (top-1 {d1:.3f}), "
              f"scored {s5:.3f} ({s1:.3f})", file=sys.stderr)
    w = fit(rows)
    if not all(math.isfinite(x) for x in w) or not any(w):
        raise SpecchatError("the fit found no weights (no position where a candidate was right, or it diverged); "
                            "nothing written")
    meta = {"fitted_on": " ".join(map(str, data)), "replies": len(rows), "positions": n_pos, "datastore": str(args.datastore),
            "drafter_top_k": DR_TOP, "datastore_top_k": DS_TOP, "ngram": [args.ngram_min, args.ngram_max],
            "held_out_folds": folds}
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        cs.ChainScorer(w, meta).save(tmp)
        tmp.replace(out)
    except BaseException as e:  # a full disk, or Ctrl-C mid-write: no half-written file left behind
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise SpecchatError(f"{out}: cannot write the scorer ({e.strerror or e})") from None
        raise
    print(f"chain scorer ({cs.N} weights) -> {out}", file=sys.stderr)
    return 0
