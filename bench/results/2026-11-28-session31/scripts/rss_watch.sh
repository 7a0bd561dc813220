#!/usr/bin/env bash
# Session 31: a `distill train` resumed from a saved state for a few dozen steps, its resident
# memory sampled every 8 s beside its progress line (the OOM-killer diagnosis of section 1).
#   bash bench/results/2026-11-28-session31/scripts/rss_watch.sh STATE_DIR   (STATE_DIR/train_state.pt: a 6-layer run)
set -euo pipefail
st=${1:?a directory with train_state.pt}
DATA="assets/distill/smollm2 assets/distill/smollm2-gpu assets/distill/smollm2-copy assets/distill/smollm2-cpu27 assets/distill/smollm2-cpu29 assets/distill/smollm2-cpu30 assets/distill/smollm2-cpu30 assets/distill/smollm2-cpu30"
out=$(mktemp -d); cp "$st/train_state.pt" "$out/"
step=$(.venv/bin/python -c "import torch,sys; print(torch.load(sys.argv[1], weights_only=True)['step'])" "$out/train_state.pt")
.venv/bin/specchat distill train --data $DATA --out "$out" --init assets/mamba-drafter-smollm2 --grow-layers 6 --batch 8 \
  --seq-len 512 --steps $((step + 40)) --lr 3e-4 --negatives 256 --vocab-min-count 3 --save-every 1000 --threads 2 --amp bf16 > "$out/log" 2>&1 &
sleep 45
while p=$(pgrep -f "out $out"); do
  echo "$(date +%T) $(grep VmRSS /proc/$p/status) $(tail -c 80 "$out/log" | tr '\r' '\n' | tail -1)"; sleep 8
done
