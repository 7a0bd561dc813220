"""Drafting time of the shipped Mamba-2 drafter with the torch step (``exact_rows``) and with the
drafter numerics (``fast_rows``: GEMV where it pays, the C Mamba-2 block), same process, two
rounds, medians of 24 proposals after 4 warm-ups (ms).

Usage: .venv/bin/python bench/draft_step_ab.py [--drafter DIR] [--dtype fp32]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from pathlib import Path

import torch

from engine.drafters.base import DraftRequest
from engine.drafters.model import ModelDrafter
from engine.loading import load
from engine.models.common import exact_rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", default="assets/mamba-drafter-smollm2")
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--target-vocab", type=int, default=49152)
    a = ap.parse_args()
    dl = load(a.drafter, dtype=a.dtype)
    dv_path = Path(a.drafter) / "draft_vocab.json"
    dv = torch.tensor(json.loads(dv_path.read_text())["token_ids"]) if dv_path.exists() else None
    d = ModelDrafter(dl.model, a.target_vocab, draft_vocab=dv)
    history = torch.randint(0, a.target_vocab, (160,), generator=torch.Generator().manual_seed(0)).tolist()
    for rnd in range(2):
        for mode in ("torch step (exact_rows)", "drafter numerics (default)"):
            for shape in ((1,) * 5, (3, 2, 2, 1, 1)):
                d.reset()
                samples = []
                for i in range(28):
                    ctx = exact_rows() if mode.startswith("torch") else contextlib.nullcontext()
                    t0 = time.perf_counter()
                    with ctx:
                        d.propose(history[:120 + i], DraftRequest(shape=shape))
                    if i >= 4:
                        samples.append((time.perf_counter() - t0) * 1e3)
                print(f"round {rnd + 1}  {mode:<28} {str(shape):<18} {statistics.median(samples):7.2f} ms", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
