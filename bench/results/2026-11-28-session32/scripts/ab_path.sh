#!/bin/bash
# alternate SPECCHAT_BF16_PATH=avx512 / amx on the same bench, N rounds
# usage: PATHS="avx512 amx" bash ab_path.sh ROUNDS STRATEGIES OUT_DIR  (session 32: 1 round of the default six into ab-r1; PATHS="amx avx512", 2 rounds of ar,pld:auto,hybrid:auto into ab-r2)
cd "$(dirname "$0")/../../../.."  # the repository root
N=${1:-1}; S=${2:-ar,pld:auto,sd:5,hybrid:auto,optimal,mab}; OUT=${3:-bench/results/2026-11-28-session32/ab}
mkdir -p $OUT
for i in $(seq 1 $N); do for p in ${PATHS:-avx512 amx}; do
  SPECCHAT_BF16_PATH=$p OMP_WAIT_POLICY=PASSIVE .venv/bin/specchat bench --dtype bf16 --strategies $S --max-new-tokens 128 --json > $OUT/$p-r$i.json 2> $OUT/$p-r$i.log
  .venv/bin/python bench/results/2026-11-27-session26/scripts/summarize.py $OUT/$p-r$i.json
done; done
