#!/usr/bin/env bash
# Session 31: the shipped drafter and a candidate end to end in bf16, one after the other in one
# sitting (12 bench prompts, 128 new tokens, greedy; every row checked identical to `ar` by bench).
#   bash bench/results/2026-11-28-session31/scripts/ab_drafter.sh CANDIDATE OUT_DIR
set -euo pipefail
new=${1:?candidate drafter}; out=${2:?out dir}; mkdir -p "$out"
for d in assets/mamba-drafter-smollm2 "$new"; do
  n=$(basename "$d")
  OMP_WAIT_POLICY=PASSIVE .venv/bin/specchat bench --dtype bf16 --drafter "$d" --strategies sd:5,hybrid:auto \
    --max-new-tokens 128 --json > "$out/bf16-$n.json" 2> "$out/bf16-$n.log"
  echo "== $n"; .venv/bin/python bench/results/2026-11-27-session26/scripts/summarize.py "$out/bf16-$n.json"
done
