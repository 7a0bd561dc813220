#!/usr/bin/env bash
# Session 28: a new drafter against session 27's teacher-forced numbers of the shipped one, then
# end to end in bf16 (tokens a step are exact whatever the machine's speed).
#   bash bench/results/2026-11-27-session28/scripts/eval_new.sh NEW_DRAFTER_DIR OUT_DIR
set -euo pipefail
new=${1:?new drafter dir}; out=${2:?out dir}
s26=bench/results/2026-11-27-session26/scripts
mkdir -p "$out"
n=$(basename "$new")
for data in bench/results/2026-11-27-session26/copy-eval assets/distill/smollm2-eval; do
  echo "== $n on $data"; THREADS=2 .venv/bin/python "$s26/tf_eval.py" "$new" "$data"
done > "$out/tf-$n.txt"
grep -A0 "^==\|^ALL" "$out/tf-$n.txt"
.venv/bin/specchat bench --dtype bf16 --drafter "$new" --strategies sd:5,hybrid:auto,pld:auto --max-new-tokens 128 --json > "$out/bf16-$n.json" 2> "$out/bf16-$n.log"
.venv/bin/python "$s26/summarize.py" "$out/bf16-$n.json"
