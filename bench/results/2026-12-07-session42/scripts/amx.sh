#!/bin/bash
# Session 42, a 2-core AMX Xeon: issue 10's table again at this HEAD (bf16, then what --dtype auto
# picks), peers in the same run. usage: bash amx.sh [OUT_DIR] (run idle; ~15 min)
cd "$(dirname "$0")/../../../.."  # the repository root
OUT=${1:-bench/results/2026-12-07-session42}; mkdir -p $OUT
B=".venv/bin/specchat bench --max-new-tokens 128"
S=bench/results/2026-11-27-session26/scripts/summarize.py
$B --dtype bf16 --drafter none --verify-cost > $OUT/verify-cost-bf16.txt 2>&1
$B --dtype bf16 --strategies ar,pld:auto,hybrid:auto,hybrid:5,hybrid:3,sd:5 --compare transformers,llama.cpp --json > $OUT/bf16.json 2> $OUT/bf16.log
.venv/bin/python $S $OUT/bf16.json
$B --dtype auto --strategies ar,pld:auto,hybrid:auto --compare llama.cpp --json > $OUT/auto.json 2> $OUT/auto.log
.venv/bin/python $S $OUT/auto.json
