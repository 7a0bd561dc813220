"""Prefill time of the default model, A/B alternated in one process:

  --ab native     long prefill chunks in the C pass (llama.NATIVE_LONG_PREFILL) vs the torch pass
  --ab attention  the torch pass's long chunks with common.prefill_attention vs the masked
                  attention (llama.PREFILL_ATTENTION; the C pass off for long chunks)

Usage: .venv/bin/python bench/prefill_ab.py [--ab native] [--tokens 1024] [--reps 5] [--dtype auto]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--ab", choices=("native", "attention"), default="native")
    a = ap.parse_args()
    from engine.models import llama
    from engine.session import ChatSession

    m = ChatSession.load(strategy="ar", dtype=a.dtype).target.model
    ids = [(i * 7919) % 40000 + 100 for i in range(a.tokens)]  # a fixed, varied token sequence

    def once(flag: bool) -> float:
        if a.ab == "native":
            llama.NATIVE_LONG_PREFILL = flag
        else:
            llama.NATIVE_LONG_PREFILL, llama.PREFILL_ATTENTION = False, flag
        m.rollback(0)
        t = time.perf_counter()
        m.prefill(ids)
        return time.perf_counter() - t

    once(True), once(False)  # warm-up
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(a.reps):
        for flag in (False, True):
            times[flag].append(once(flag))
    old, new = statistics.median(times[False]), statistics.median(times[True])
    off, on = ("torch pass", "C pass") if a.ab == "native" else ("masked attention", "prefill_attention")
    print(f"prefill {a.tokens} tokens ({a.dtype}): {off} {old:.3f} s ({a.tokens / old:.0f} tok/s), "
          f"{on} {new:.3f} s ({a.tokens / new:.0f} tok/s); ratio {new / old:.2f} "
          f"(median of {a.reps}, alternated)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
