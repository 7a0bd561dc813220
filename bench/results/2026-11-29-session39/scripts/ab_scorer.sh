#!/bin/bash
# A/B: hybrid:K's chain with the shipped chain scorer (new: assets/mamba-drafter-smollm2 as is) vs the
# gate's calibration bins (old: the same drafter directory without chain_scorer.json, symlinked files)
# usage: [DTYPE=q8] bash ab_scorer.sh ROUNDS STRATEGIES OUT_DIR  (session 39: 2 rounds of ar,sd:5,hybrid:5 in bf16 into ab/; 1 round of ar,hybrid:5,pld:auto in q8 into ab-q8/)
cd "$(dirname "$0")/../../../.."  # the repository root
N=${1:-2}; S=${2:-ar,hybrid:5}; OUT=${3:-bench/results/2026-11-29-session39/ab}; DT=${DTYPE:-bf16}
OLD=/tmp/s39/drafter-noscorer
mkdir -p $OLD $OUT
for f in assets/mamba-drafter-smollm2/*; do b=$(basename $f); [ $b = chain_scorer.json ] || ln -sf $PWD/$f $OLD/$b; done
for i in $(seq 1 $N); do for v in old new; do
  d=$([ $v = old ] && echo $OLD || echo assets/mamba-drafter-smollm2)
  .venv/bin/specchat bench --dtype $DT --drafter $d --strategies $S --max-new-tokens 128 --json > $OUT/$v-r$i.json 2> $OUT/$v-r$i.log
  echo "== $v r$i"; .venv/bin/python bench/results/2026-11-27-session26/scripts/summarize.py $OUT/$v-r$i.json
done; done
