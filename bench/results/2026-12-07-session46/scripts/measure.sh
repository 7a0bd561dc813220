#!/bin/bash
# Session 46: the feature head against the shipped Mamba-2 drafter and pld:auto, one sitting, idle.
# usage: HEAD=DIR OUT=DIR bash measure.sh
set -u
cd /work/main
PY=.venv/bin/python
mkdir -p $OUT
$PY bench/feature_head/draft_cost.py $HEAD > $OUT/draft_cost.txt 2>&1
$PY - > $OUT/sim.txt 2>&1 <<PYEOF
import sys; sys.path.insert(0, '.')
from pathlib import Path
import torch
from engine.distill_head import _load_dir, simulate
from engine.feature_head import load_head
from engine.loading import load
t = load("smollm2-135m-instruct", dtype="bf16").model
lm = t.logits(torch.eye(576, dtype=t.compute_dtype)).t().float()
h = load_head(Path("$HEAD")).attach(t.embed.float(), lm)
for name in ("distill-smollm2-eval", "distill-smollm2-self-eval"):
    seqs = _load_dir(Path("$HEAD") / "features" / name)
    tps, d = simulate(h, seqs)
    print(f"{name}: {len(seqs)} replies, greedy chain of 5: {tps:.3f} tokens a step; accepted by depth {' '.join(f'{x:.3f}' for x in d)}")
PYEOF
for r in 1 2; do
  $PY -m engine.cli bench --drafter $HEAD --dtype bf16 --strategies ar,pld:auto,sd:5,sd:auto,hybrid:auto,hybrid:5 --max-new-tokens 128 --json > $OUT/head-$r.json 2> $OUT/head-$r.err
  $PY -m engine.cli bench --drafter assets/mamba-drafter-smollm2 --dtype bf16 --strategies ar,pld:auto,sd:5,sd:auto,hybrid:auto,hybrid:5 --max-new-tokens 128 --json > $OUT/mamba-$r.json 2> $OUT/mamba-$r.err
done
