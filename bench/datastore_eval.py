"""How well n-gram datastores predict the target's replies to the evaluation prompts, offline.

For each reply token of ``assets/distill/smollm2-eval`` (the target's greedy replies to
assets/prompts/bench.json, never indexed), teacher-forced: whether the datastore's top next token
(backing off from its longest context) is the target's, and how many tokens a greedy chain of up
to k datastore tokens would have had accepted. No model runs: deterministic, seconds.

Usage: .venv/bin/python bench/datastore_eval.py INDEX.npz [INDEX.npz ...] [--eval DIR]
"""

from __future__ import annotations

import argparse
import json
import lzma
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("indexes", nargs="+")
    ap.add_argument("--eval", default=str(REPO / "assets/distill/smollm2-eval"))
    a = ap.parse_args()
    from engine.drafters.corpus import CorpusIndex

    rows = []
    for f in sorted(Path(a.eval).glob("responses.jsonl*")):  # not the prompt files beside them
        with (lzma.open if f.suffix == ".xz" else open)(f, "rt") as fh:
            rows += [json.loads(line) for line in fh]
    print(f"{len(rows)} evaluation replies, {sum(len(r['response_ids']) for r in rows)} tokens")
    for path in a.indexes:
        idx = CorpusIndex.load(path)
        top1 = n = 0
        acc = {k: 0 for k in (1, 2, 4, 8)}
        for r in rows:
            ctx, rep = list(r["prompt_ids"]), r["response_ids"]
            for i in range(len(rep)):
                c = ctx + rep[:i]
                nx = idx.next(c)
                n += 1
                top1 += nx is not None and nx[0] == rep[i]
                for k in acc:
                    cc, got = list(c), 0
                    while got < k and i + got < len(rep):
                        nx = idx.next(cc)
                        if nx is None or nx[0] != rep[i + got]:
                            break
                        got += 1
                        cc.append(nx[0])
                    acc[k] += got
        print(f"{path}: {len(idx):,} contexts; top-1 {top1 / n:.3f}; greedy chain, accepted a step: "
              + "  ".join(f"k={k} {acc[k] / n:.3f}" for k in acc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
