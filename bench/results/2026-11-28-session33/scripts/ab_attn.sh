#!/bin/bash
# alternate SPECCHAT_AMX_ATTN=0 (attend_group's vector attention) / 1 (attend_group_amx) on the same bench, N rounds
# usage: bash ab_attn.sh ROUNDS STRATEGIES OUT_DIR  (session 33: 2 rounds of ar,pld:auto,hybrid:auto into ab)
cd "$(dirname "$0")/../../../.."  # the repository root
N=${1:-2}; S=${2:-ar,pld:auto,hybrid:auto}; OUT=${3:-bench/results/2026-11-28-session33/ab}
mkdir -p $OUT
for i in $(seq 1 $N); do for a in 0 1; do
  SPECCHAT_AMX_ATTN=$a OMP_WAIT_POLICY=PASSIVE .venv/bin/specchat bench --dtype bf16 --strategies $S --max-new-tokens 128 --json > $OUT/attn$a-r$i.json 2> $OUT/attn$a-r$i.log
  echo "SPECCHAT_AMX_ATTN=$a round $i"; .venv/bin/python bench/results/2026-11-27-session26/scripts/summarize.py $OUT/attn$a-r$i.json
done; done
