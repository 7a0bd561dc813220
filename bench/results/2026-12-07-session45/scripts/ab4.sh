#!/bin/bash
set -u
OUT=/tmp/s45/ab4; mkdir -p $OUT
PY=/work/main/.venv/bin/python
ARGS="bench --drafter assets/mamba-drafter-smollm2 --dtype bf16 --strategies ar,pld:auto,hybrid:auto,sd:auto --max-new-tokens 128 --json"
cd /work/main
for r in 1 2 3; do
  $PY -m engine.cli $ARGS > $OUT/base-$r.json 2> $OUT/base-$r.err; echo "base $r $(date +%T)" >> $OUT/log
  $PY /tmp/s45/bench1.py $ARGS > $OUT/one-$r.json 2> $OUT/one-$r.err; echo "one $r $(date +%T)" >> $OUT/log
done
