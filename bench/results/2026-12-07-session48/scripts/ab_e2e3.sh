#!/bin/bash
# alternated end-to-end A/B: the session's first commit's parent (old) vs the working tree (new), bf16 and q8 (auto)
OUT=$1; mkdir -p $OUT
for r in 1 2 3; do
  for t in old new; do
    d=$([ $t = old ] && echo /tmp/s48/oldtree || echo /work/main)
    for dt in bf16 auto; do
      (cd $d && PYTHONPATH=$d timeout 900 /work/main/.venv/bin/python -m engine.cli bench --dtype $dt --strategies ar,pld:auto --max-new-tokens 128 --json > $OUT/$t-$dt-r$r.json 2> $OUT/$t-$dt-r$r.err)
    done
  done
done
echo done > $OUT/DONE
