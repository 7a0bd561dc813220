#!/bin/bash
# the shipped drafter and a candidate, one after the other in bf16 (tokens a step are exact whatever the load)
# usage: bash ab_drafter.sh CANDIDATE OUT_DIR  (session 33: drafters/ft11.bf16, stage 9)
cd "$(dirname "$0")/../../../.."
C=${1:?candidate}; OUT=${2:-bench/results/2026-11-28-session33/drafter}; mkdir -p $OUT
for d in assets/mamba-drafter-smollm2 $C; do n=$(basename $d)
  OMP_WAIT_POLICY=PASSIVE .venv/bin/specchat bench --dtype bf16 --drafter $d --strategies sd:5,hybrid:auto --max-new-tokens 128 --json > $OUT/$n.json 2> $OUT/$n.log
  .venv/bin/python bench/results/2026-11-27-session26/scripts/summarize.py $OUT/$n.json
done
