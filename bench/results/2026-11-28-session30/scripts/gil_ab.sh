#!/usr/bin/env bash
# Session 30: the app's GIL switch interval, alternated in one sitting (app / no-UI decode rate).
#   bash bench/results/2026-11-28-session30/scripts/gil_ab.sh "0.5 0.1" ROUNDS STRATEGY [DTYPE]
set -uo pipefail
values=${1:-"0.5 0.1"}; rounds=${2:-4}; strategy=${3:-pld:auto}; dtype=${4:-auto}
for r in $(seq "$rounds"); do
  for sw in $values; do
    line=$(OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/app_stream.py --strategy "$strategy" --dtype "$dtype" \
           --prompts 6 --gil-switch-ms "$sw" 2>&1 | grep -o "decode *[0-9.]*" | awk '{print $2}' | tr '\n' ' ')
    set -- $line
    echo "round $r  switch ${sw} ms  app $1  no-UI $2  ratio $(python3 -c "print(f'{$1/$2:.3f}')")"
  done
done
