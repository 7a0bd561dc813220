"""How well a drafter's own probability predicts acceptance, and what catching up costs it.

    .venv/bin/python bench/drafter_confidence.py [--drafter assets/mamba-drafter-smollm2] [--max-new-tokens 128]
        [--dtype auto] [--lengths 1,2,4,8,16,24,32,48] [--catch-up-only]

1. Calibration: the target's greedy replies to the evaluation prompts (assets/prompts/bench.json),
   then the drafter teacher-forced over prompt + reply: for every reply token, the drafter's
   probability of its own top token and whether that token is the target's. A greedy chain's
   accepted prefix is exactly these teacher-forced hits, so the table is the per-token acceptance
   engine/gate.py's confidence cut relies on (it learns the same calibration online). Beside it,
   the same agreement for the session's n-gram datastore (engine/drafters/corpus.py).
2. Catch-up: ModelDrafter._sync over n new tokens, stepped by the C block (advance_fast) vs a
   torch prefill + verify pass (FAST_ADVANCE_MAX in engine/drafters/model.py), median of 5.
"""

from __future__ import annotations

import argparse
import statistics
import time

import engine  # noqa: F401  (first: its OMP_WAIT_POLICY default must precede torch's OpenMP)
import torch

import engine.drafters.model as dm
from engine.bench import load_prompts
from engine.generate import run_generation
from engine.session import ChatSession
from engine.strategy import preset


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--drafter", default="assets/mamba-drafter-smollm2")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="auto", help="the target's compute type")
    ap.add_argument("--lengths", default="1,2,4,8,16,24,32,48", help="catch-up lengths (new tokens) to time")
    ap.add_argument("--catch-up-only", action="store_true", help="only part 2 (the catch-up table)")
    args = ap.parse_args()
    s = ChatSession.load(drafter=args.drafter, dtype=args.dtype)
    dec, dr = s.decoder, s.decoder.drafters["model"]
    print(f"target {s.target.description if hasattr(s.target, 'description') else ''} dtype {dec.target.dtype}")
    if not args.catch_up_only:
        calibration(s, args.max_new_tokens)
    catch_up_table(dr, [int(n) for n in args.lengths.split(",")])


def calibration(s, max_new_tokens: int) -> None:
    """Part 1: the drafter's and the datastore's teacher-forced agreement, by the drafter's p."""
    dec, dr = s.decoder, s.decoder.drafters["model"]
    bins = [[0, 0] for _ in range(10)]
    ds_hits, dr_hits = [0, 0], [0]
    for p in load_prompts(None):
        ids = s.encode_chat([{"role": "user", "content": p["text"]}])
        dec.reset()
        evs, _ = run_generation(dec, ids, preset("ar"), max_new_tokens)
        reply = [t for e in evs for t in e.emitted]
        with torch.inference_mode():
            m = dr.model.with_own_cache()
            m.allocate(len(ids) + len(reply) + 8)
            lg = m.full_logits(ids + reply).float()[len(ids) - 1: len(ids) + len(reply) - 1]
        conf, arg = torch.softmax(lg, -1).max(-1)
        pred = dr.draft_vocab[arg] if dr.draft_vocab is not None else arg
        hit = (pred == torch.tensor(reply)).tolist()
        corpus = dec.drafters["ngram"].corpus  # the session's n-gram datastore, if any: the same question
        if corpus is not None:
            seq = ids + reply
            nxt = [corpus.next(seq[max(0, len(ids) + i - corpus.n_max):len(ids) + i]) for i in range(len(reply))]
            ds_hits[0] += sum(1 for x, t in zip(nxt, reply) if x is not None and x[0] == t)
        ds_hits[1] += len(reply)
        dr_hits[0] += sum(hit)
        for c, h in zip(conf.tolist(), hit):
            b = min(9, int(c * 10))
            bins[b][0] += 1
            bins[b][1] += h
        print(f"{p['name']:<10} {len(reply):4d} tokens, teacher-forced top-1 agreement {sum(hit) / len(hit):.2f}")
    print(f"\nall replies, {ds_hits[1]} tokens: the drafter's top token matched {dr_hits[0] / max(ds_hits[1], 1):.3f}"
          + (f", the n-gram datastore's ({s.datastore}) {ds_hits[0] / ds_hits[1]:.3f}" if s.datastore else ""))
    print("\n| drafter's p | tokens | matched the target |\n|---|---|---|")
    for i, (n, h) in enumerate(bins):
        print(f"| {i / 10:.1f}-{(i + 1) / 10:.1f} | {n} | {h / max(n, 1):.2f} |")


def catch_up_table(dr, lengths: list[int]) -> None:
    """Part 2: ModelDrafter._sync over n new tokens after 100, the C blocks against torch, median of 5."""
    print("\n| new tokens | C steps (ms) | torch prefill + verify (ms) |\n|---|---|---|")
    hist = list(range(1000, 1100 + max(lengths)))
    for n in lengths:
        row = []
        for limit in (10 ** 6, 0):
            dm.FAST_ADVANCE_MAX = limit
            ts = []
            for _ in range(5):
                dr.reset()
                dr._sync(hist[:100])
                t0 = time.perf_counter()
                dr._sync(hist[:100 + n])
                ts.append(time.perf_counter() - t0)
            row.append(statistics.median(ts) * 1e3)
        print(f"| {n} | {row[0]:.2f} | {row[1]:.2f} |")


if __name__ == "__main__":
    main()
