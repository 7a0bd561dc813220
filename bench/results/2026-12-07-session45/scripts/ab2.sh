#!/bin/bash
set -u
OUT=/tmp/s45/ab2; mkdir -p $OUT
PY=/work/main/.venv/bin/python
ARGS="bench --drafter assets/mamba-drafter-smollm2 --dtype bf16 --strategies ar,pld:auto,hybrid:auto,sd:auto --max-new-tokens 128 --json"
cd /work/main
for r in 1 2 3; do
  for side in base spin0; do
    if [ $side = spin0 ]; then export GOMP_SPINCOUNT=0; else unset GOMP_SPINCOUNT; fi
    $PY -m engine.cli $ARGS > $OUT/$side-$r.json 2> $OUT/$side-$r.err
    echo "$side $r done $(date +%T)" >> $OUT/log
  done
done
