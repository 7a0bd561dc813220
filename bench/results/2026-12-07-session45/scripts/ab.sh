#!/bin/bash
# alternate base (HEAD) and new (working tree) runs of the standard bench
set -u
OUT=${OUT:-/tmp/s45/ab}; mkdir -p $OUT
PY=/work/main/.venv/bin/python
ARGS="bench --drafter assets/mamba-drafter-smollm2 --dtype bf16 --strategies ar,pld:auto,hybrid:auto,sd:auto --max-new-tokens 128 --json"
for r in ${ROUNDS:-1 2}; do
  for side in ${ORDER:-base new}; do
    dir=/work/main; [ $side = base ] && dir=/tmp/s45/base
    (cd $dir && $PY -m engine.cli $ARGS > $OUT/$side-$r.json 2> $OUT/$side-$r.err)
    echo "$side $r done $(date +%T)" >> $OUT/log
  done
done
