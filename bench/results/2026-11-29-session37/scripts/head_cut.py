"""The drafter's head cut to its N most frequent tokens (frequency in the distilled replies it
learns from), teacher-forced: top-1 agreement and a greedy chain of 5 on the evaluation replies and
the self-prompted held-out replies (exact for greedy chains; session 27's oracle.py).

    .venv/bin/python bench/results/2026-11-29-session37/scripts/head_cut.py [N,N,...]
"""
import collections
import glob
import json
import lzma
import sys
from pathlib import Path

import torch  # noqa: F401

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from mixchain import REPO, ModelDrafter, chain, load, replies  # noqa: E402,F811  (this session's oracle script)


def main():
    Ns = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "4096,6144,8192,12288,100000").split(",")]
    cnt = collections.Counter()
    for f in glob.glob(str(REPO / "assets/distill/*/responses.jsonl*")):
        if "eval" in f:
            continue
        with (lzma.open if f.endswith(".xz") else open)(f, "rt") as fh:
            for line in fh:
                cnt.update(json.loads(line)["response_ids"])
    torch.set_num_threads(2)
    m = load(str(REPO / "assets/mamba-drafter-smollm2"), dtype="fp32").model
    dr = ModelDrafter(m, 49152, draft_vocab=getattr(m, "draft_vocab", None))
    dv = dr.draft_vocab.tolist()
    rank = {t: i for i, (t, _) in enumerate(cnt.most_common())}
    col_rank = torch.tensor([rank.get(t, 10**9) for t in dv])
    for data in ("smollm2-eval", "smollm2-self-eval"):
        res = {N: [0, 0, 0, 0] for N in Ns}
        with torch.inference_mode():
            for r in replies(REPO / "assets/distill" / data):
                ids, reply = r["prompt_ids"], r["response_ids"]
                mm = dr.model.with_own_cache()
                mm.allocate(len(ids) + len(reply) + 8)
                lg = dr._raw(mm.full_logits(ids + reply).float()[len(ids) - 1: len(ids) + len(reply) - 1])
                y = torch.tensor(reply)
                for N in Ns:
                    masked = lg.masked_fill(col_rank[None] >= N, float("-inf"))
                    hit = (dr.draft_vocab[masked.argmax(-1)] == y).tolist()
                    t, s = chain(hit)
                    v = res[N]
                    v[0] += sum(hit); v[1] += len(hit); v[2] += t; v[3] += s
        for N, (h, n, t, s) in res.items():
            print(f"{data:18s} head {min(N, len(dv)):>6} columns: top-1 {h / n:.4f}  chain of 5 {t / s:.3f} tokens a step")


if __name__ == "__main__":
    main()
