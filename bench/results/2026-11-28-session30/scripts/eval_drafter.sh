#!/usr/bin/env bash
# Session 30: a drafter teacher-forced on three held-out reply sets (the 300 self-prompted replies
# of assets/distill/smollm2-self-eval: 47,943 tokens, the bench's kind of prompt; the 12 bench
# prompts' replies; the copy evaluation), then end to end in bf16 (tokens a step are exact
# whatever the machine's load).
#   bash bench/results/2026-11-28-session30/scripts/eval_drafter.sh DRAFTER_DIR OUT_DIR [--no-bench]
set -euo pipefail
new=${1:?drafter dir}; out=${2:?out dir}
s26=bench/results/2026-11-27-session26/scripts
mkdir -p "$out"
n=$(basename "$new")
for data in assets/distill/smollm2-self-eval assets/distill/smollm2-eval bench/results/2026-11-27-session26/copy-eval; do
  echo "== $n on $data"; THREADS=2 .venv/bin/python "$s26/tf_eval.py" "$new" "$data"
done > "$out/tf-$n.txt" 2>/dev/null
grep "^==\|^ALL" "$out/tf-$n.txt"
[[ "${3:-}" == "--no-bench" ]] && exit 0
.venv/bin/specchat bench --dtype bf16 --drafter "$new" --strategies sd:5,hybrid:auto,pld:auto --max-new-tokens 128 --json > "$out/bf16-$n.json" 2> "$out/bf16-$n.log"
.venv/bin/python "$s26/summarize.py" "$out/bf16-$n.json"
