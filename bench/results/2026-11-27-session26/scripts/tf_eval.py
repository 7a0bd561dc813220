"""A drafter's teacher-forced agreement with stored target replies, per prompt kind, and the sd:5
acceptance it implies (session 22 measured the sd:5 loop accepting exactly what teacher forcing
predicts: a step accepts the run of consecutive top-1 hits from its position, up to 5, plus the
target's own token). No target run: a fast, exact-for-greedy comparison of drafters.

    python tf_eval.py DRAFTER_DIR DATA_DIR [N_REPLIES] [SEED] [--skip-first K]
"""
import json
import lzma
import random
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from engine.drafters.model import ModelDrafter  # noqa: E402
from engine.loading import load  # noqa: E402


def replies(data: Path):
    for name in ("responses.jsonl", "responses.jsonl.xz"):
        p = data / name
        if p.exists():
            with (lzma.open if name.endswith(".xz") else open)(p, "rt", encoding="utf-8") as f:
                return [json.loads(line) for line in f]
    raise SystemExit(f"{data}: no responses")


def sim_sd(hit: list[bool], k: int = 5) -> int:
    pos = steps = 0
    while pos < len(hit):
        run = 0
        while run < k and pos + run < len(hit) and hit[pos + run]:
            run += 1
        pos += run + 1
        steps += 1
    return steps


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    drafter, data = args[0], Path(args[1])
    n = int(args[2]) if len(args) > 2 else 10**9
    seed = int(args[3]) if len(args) > 3 else 0
    torch.set_num_threads(int(__import__("os").environ.get("THREADS", "2")))
    m = load(drafter, dtype="fp32").model
    dr = ModelDrafter(m, 49152, draft_vocab=getattr(m, "draft_vocab", None))
    rows = replies(data)
    random.Random(seed).shuffle(rows)
    rows = rows[:n]
    by = defaultdict(lambda: [0, 0, 0])  # kind -> hits, tokens, sd:5 steps
    with torch.inference_mode():
        for r in rows:
            ids, reply = r["prompt_ids"], r["response_ids"]
            mm = dr.model.with_own_cache()
            mm.allocate(len(ids) + len(reply) + 8)
            lg = mm.full_logits(ids + reply).float()[len(ids) - 1: len(ids) + len(reply) - 1]
            arg = lg.argmax(-1)
            pred = dr.draft_vocab[arg] if dr.draft_vocab is not None else arg
            hit = (pred == torch.tensor(reply)).tolist()
            kind = r.get("kind", "?")
            kind = "copyeval" if kind.startswith("copyeval") else kind  # copy_eval_prompts.py's 48 prompts, one group
            for kind in (kind, "ALL"):
                b = by[kind]
                b[0] += sum(hit); b[1] += len(hit); b[2] += sim_sd(hit)
    for kind, (h, t, s) in sorted(by.items(), key=lambda kv: (kv[0] == "ALL", kv[0])):
        print(f"{kind:<10} replies-tokens {t:6d}  top-1 {h / t:.3f}  sd:5 tokens/step {t / s:.3f}")


if __name__ == "__main__":
    main()
