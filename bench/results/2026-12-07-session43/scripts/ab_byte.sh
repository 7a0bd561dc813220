#!/bin/bash
# usage: ab_byte.sh NEW_DRAFTER_DIR OUTDIR  — stage 3 (shipped) and NEW alternated twice, bf16, 12 prompts x 128
set -e
cd "$(dirname "$0")/../../../.."
NEW=$1; OUT=$2; mkdir -p $OUT
for r in 1 2; do
  for d in assets/mamba-byte-drafter $NEW; do
    n=$(basename $d)
    .venv/bin/specchat bench --drafter $d --dtype bf16 --strategies ar,sd:8@slem,sd:12@slem,sd:6@slem --max-new-tokens 128 --json > $OUT/$n-r$r.json 2> $OUT/$n-r$r.err
    python3 - $OUT/$n-r$r.json <<'PY'
import json,sys
d=json.load(open(sys.argv[1]))
for r in d["rows"]:
    if r["prompt"]=="ALL": print(sys.argv[1].split("/")[-1], r["strategy"], r["tokens_per_s"], r["speedup"], r["mean_accepted"], r["identical_to_ar"])
PY
  done
done
