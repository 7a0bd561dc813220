#!/usr/bin/env bash
# Session 30: the app's decode rate against stream_chat without a UI, variants alternated in one
# sitting: full collections held while a reply streams (the default) or not, GIL switch 0.5 / 0.1 ms.
#   bash bench/results/2026-11-28-session30/scripts/app_ab.sh ROUNDS STRATEGY [EXTRA ARGS...]
set -uo pipefail
rounds=${1:-3}; strategy=${2:-pld:auto}; shift 2 || true
for r in $(seq "$rounds"); do
  for variant in "hold:--gil-switch-ms 0.5" "no-hold:--no-gc-hold --gil-switch-ms 0.5" "hold-0.1ms:--gil-switch-ms 0.1"; do
    name=${variant%%:*}; args=${variant#*:}
    out=$(OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/app_stream.py --strategy "$strategy" --prompts 6 $args "$@" 2>&1)
    gc2=$(grep -o "gen2 [0-9]* x [0-9.]* ms" <<<"$out")
    set -- $(grep -o "decode *[0-9.]*" <<<"$out" | awk '{print $2}' | tr '\n' ' ')
    echo "round $r  $name  app $1  no-UI $2  ratio $(python3 -c "print(f'{$1/$2:.3f}')")  full collections: $gc2"
    shift 2
  done
done
