"""Per-strategy totals of `specchat bench --json` files: tokens/s (all prompts' tokens over their
time), tokens a step, the ratio to the same run's `ar`, and whether every row was identical to ar.

    python summarize.py FILE.json ...
"""
import json
import sys
from collections import defaultdict

for path in sys.argv[1:]:
    d = json.load(open(path))
    tot = defaultdict(lambda: [0, 0.0, 0.0, True])  # tokens, seconds, steps, identical
    for r in d["rows"]:
        if r["engine"] != "specchat":
            continue
        t = tot[r["strategy"]]
        t[0] += r["new_tokens"]
        t[1] += r["new_tokens"] / r["tokens_per_s"]
        t[2] += r["new_tokens"] / r["mean_accepted"]
        t[3] = t[3] and r["identical_to_ar"] is not False
    ar = tot["ar"][0] / tot["ar"][1]
    out = [f"ar {ar:.1f} tok/s"]
    for s, (n, secs, steps, same) in tot.items():
        if s != "ar":
            out.append(f"{s} {n / secs:.1f} tok/s {n / secs / ar:.2f}x {n / steps:.3f} tok/step{'' if same else ' NOT IDENTICAL'}")
    print(f"{path.split('/')[-1]}: {d['settings']['dtype']}; " + "; ".join(out))
