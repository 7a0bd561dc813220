#!/bin/bash
# HEAD (MarkdownStream) vs the working tree (one batch a frame): bench/app_stream.py alternated
for i in 1 2 3; do
  for t in old new; do
    d=/work/main; [ $t = old ] && d=/tmp/s38/old
    echo "== $t run $i"
    (cd $d && /work/main/.venv/bin/python bench/app_stream.py --strategy pld:auto --prompts 6 --dtype bf16 2>&1 | grep -E "decode")
  done
done
