"""Where an adaptive strategy's steps go: the 12 evaluation prompts decoded twice through one chat
session (the second pass with what the gate learnt in the first), steps grouped by what the gate
decided (plain by the acceptance gate, plain or drafting by the measured arm of gate.drafting_pays,
...), with their count, ms and tokens a step.

    python bench/gate_steps.py sd:auto [--dtype auto] [--drafter assets/mamba-drafter-smollm2]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.session import ChatSession  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("strategy")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--drafter", default="assets/mamba-drafter-smollm2")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    s = ChatSession.load(drafter=args.drafter, strategy=args.strategy, dtype=args.dtype)
    prompts = json.loads(Path("assets/prompts/bench.json").read_text())
    for rep in range(2):
        n, ms, tok = collections.Counter(), collections.Counter(), collections.Counter()
        for p in prompts:
            s.decoder.reset()
            for ev in s.stream_chat([{"role": "user", "content": p["text"]}], args.max_new_tokens, threading.Event()):
                g = s.decoder.gate.last if s.decoder.gate is not None else {}
                arm = {None: "", True: " drafter ran", False: " drafter rested"}[g.get("drafting")]
                key = ("drafted" if ev.drafted else "plain") + arm
                n[key] += 1
                ms[key] += ev.ms
                tok[key] += len(ev.emitted)
        total_ms, total_tok = sum(ms.values()), sum(tok.values())
        print(f"{args.strategy} pass {rep + 1} ({s.target.compute}): {total_tok / total_ms * 1000:.1f} tok/s over the steps, "
              f"{total_tok / sum(n.values()):.2f} tokens a step")
        for key in sorted(n):
            print(f"  {key:24s} {n[key]:5d} steps  {ms[key] / n[key]:6.2f} ms  {tok[key] / n[key]:.2f} tokens a step")


if __name__ == "__main__":
    main()
