"""Plain decoding (`ar`) and `pld` at long contexts: SmolLM2 (q8 by default) continues this repository's
README.md, cut to 400 / 1,000 / 1,800 tokens, for 128 new tokens each; tokens/s of each (one warm-up
of 8 tokens per context). The chat benchmark's prompts stay under ~300 tokens of context, where a
decode step reads mostly weights; a long chat reads the whole KV cache every step too.

Usage: .venv/bin/python bench/long_context.py [--dtype q8] [--contexts 400,1000,1800]
Prints the KV cache's dtype, then `ctxN name tok/s` per context and strategy. To compare two
versions, run it from each tree alternately (PYTHONPATH=<tree>); `pld`'s figure depends on the
continuation's text, which any change of numerics changes.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from engine import native  # noqa: F401 - first: the engine's OpenMP wait policy before torch loads

from engine.generate import Decoder, run_generation
from engine.loading import load
from engine.strategy import preset


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="q8")
    ap.add_argument("--contexts", default="400,1000,1800")
    a = ap.parse_args()
    lm = load("smollm2-135m-instruct", dtype=a.dtype)
    enc = lm.tokenizer.encode((Path(__file__).resolve().parent.parent / "README.md").read_text())
    ids = list(getattr(enc, "ids", enc))
    dec = Decoder(lm.model, lm.model)
    out = []
    for n in (int(c) for c in a.contexts.split(",")):
        prompt = ids[:n]
        run_generation(dec, prompt, preset("ar"), 8)
        for name in ("ar", "pld"):
            t0 = time.perf_counter()
            evs, _ = run_generation(dec, prompt, preset(name), 128)
            t = time.perf_counter() - t0
            out.append(f"ctx{n} {name} {sum(len(e.emitted) for e in evs) / t:.1f}")
    print(str(lm.model.cache.k.dtype).ljust(15), "  ".join(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
