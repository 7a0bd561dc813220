#!/bin/bash
# A/B of the q8 products: AMX-INT8 tiles (default where granted) vs the AVX-512 VNNI kernel
# (SPECCHAT_A8_PATH=vnni); same bits, so every reply is identical across the two.
# usage: bash ab_a8.sh [OUT_DIR] [ROUNDS]   (run idle)
cd "$(dirname "$0")/../../../.."  # the repository root
OUT=${1:-bench/results/2026-12-07-session42/ab-a8}; N=${2:-2}; mkdir -p $OUT
S=bench/results/2026-11-27-session26/scripts/summarize.py
for i in $(seq 1 $N); do for p in vnni amx; do
  SPECCHAT_A8_PATH=$p .venv/bin/python bench/quant_kernels.py --a8 --rows 1,2,4,6,8,12,16,24,32 > $OUT/kernels-$p-r$i.txt 2>&1
  SPECCHAT_A8_PATH=$p .venv/bin/specchat bench --dtype q8 --drafter none --verify-cost > $OUT/verify-cost-$p-r$i.txt 2>&1
  SPECCHAT_A8_PATH=$p .venv/bin/specchat bench --dtype q8 --strategies ar,pld:auto,hybrid:auto --max-new-tokens 128 --json > $OUT/q8-$p-r$i.json 2> $OUT/q8-$p-r$i.log
  echo "== $p r$i"; tail -4 $OUT/kernels-$p-r$i.txt; tail -9 $OUT/verify-cost-$p-r$i.txt; .venv/bin/python $S $OUT/q8-$p-r$i.json
done; done
