#!/bin/bash
# A/B: copy calibration bins by match length (new, /work/main) vs one copy bin (old, 8bf4971 worktree)
cd /tmp/s37
for r in 1 2; do
  for v in old new; do
    dir=$([ $v = old ] && echo /tmp/s37/old || echo /work/main)
    (cd $dir && /work/main/.venv/bin/python -m engine.cli bench --dtype bf16 --strategies ar,pld:auto,hybrid:auto,hybrid:5 --max-new-tokens 128 --json > /tmp/s37/copy_${v}_$r.json 2> /tmp/s37/copy_${v}_$r.log)
    /work/main/.venv/bin/python /work/main/bench/results/2026-11-27-session26/scripts/summarize.py /tmp/s37/copy_${v}_$r.json
  done
done
