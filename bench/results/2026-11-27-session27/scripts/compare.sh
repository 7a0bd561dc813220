#!/usr/bin/env bash
# Session 27: the shipped drafter against a new one, teacher-forced then end to end, back to back
# (session 26's script with the bf16 runs at the engine's own passive waits: OMP_WAIT_POLICY=ACTIVE
# slows the bf16 C pass, session 23).
#   bash bench/results/2026-11-27-session27/scripts/compare.sh NEW_DRAFTER_DIR OUT_DIR
set -euo pipefail
new=${1:?new drafter dir}; out=${2:?out dir}; old=assets/mamba-drafter-smollm2
s26=bench/results/2026-11-27-session26/scripts
mkdir -p "$out"
for d in "$old" "$new"; do
  n=$(basename "$d")
  for data in bench/results/2026-11-27-session26/copy-eval assets/distill/smollm2-eval; do
    echo "== $n on $data"; THREADS=2 .venv/bin/python "$s26/tf_eval.py" "$d" "$data"
  done > "$out/tf-$n.txt"
done
for round in 1 2; do
  for d in "$old" "$new"; do
    n=$(basename "$d")
    .venv/bin/specchat bench --drafter "$d" --strategies sd:5,hybrid:auto --max-new-tokens 128 --json > "$out/q8-$n-r$round.json" 2> "$out/q8-$n-r$round.log"
    .venv/bin/specchat bench --dtype bf16 --drafter "$d" --strategies sd:5,hybrid:auto,pld:auto --max-new-tokens 128 --json > "$out/bf16-$n-r$round.json" 2> "$out/bf16-$n-r$round.log"
  done
done
