#!/usr/bin/env bash
# Issue 4 on a lent GPU: train the SmolLM2 drafter in one device call, from what a call can carry:
# the replies (assets/distill/smollm2, ~26 MB) and the tokenizer, not the target's 98 MB GGUF
# (a call carries 64 MiB in all), so `distill train --tokenizer` (the embedding starts at random)
# and `--time-budget` (the schedule ends on time; the state is saved when it does).
#
#   on the device:  bash bench/gpu_train_drafter.sh "$OUT" 420 [more `distill train` options]
#                   carry: assets/distill/smollm2, assets/mamba-drafter-smollm2/tokenizer.json,
#                          assets/mamba-drafter-smollm2/tokenizer_config.json
#   back here:      mkdir -p drafters && cat DIR/gpu-drafter.tar.part-* | tar -x -C drafters/
#                   specchat distill export --from drafters/gpu-drafter --to DIR2 --dtype bf16
#                   specchat bench --drafter DIR2 --strategies sd:5,hybrid:auto,pld:auto
#
# Continuing the shipped drafter on both reply sets instead (what session 14 found the GPU time is
# best spent on: from scratch, 270 s did not reach it; see bench/results/2026-11-26-h200-distill/):
#   here:       mkdir -p .gpu3/old && xz -9 -c assets/distill/smollm2/responses.jsonl > .gpu3/old/responses.jsonl.xz
#               (/.gpu3/ in .git/info/exclude; ~66 MB travel in all, just under the 64 MiB)
#   carry:      .gpu3, assets/mamba-drafter-smollm2, assets/distill/smollm2-gpu, assets/distill/smollm2-eval
#   on the device: bash bench/gpu_train_drafter.sh "$OUT" 480 --data .gpu3/old assets/distill/smollm2-gpu \
#                   --init assets/mamba-drafter-smollm2 --lr 5e-4 --eval-data assets/distill/smollm2-eval
#   (checked on this CPU with --device cpu --steps 2; --init takes the drafter's own shape)
#
# The byte drafter beside it, in the same call (a second process on the same GPU; the name keeps
# the two apart; the byte replies are the same replies, as UTF-8):
#   GPU_DRAFTER_NAME=gpu-byte bash bench/gpu_train_drafter.sh "$OUT" 480 --data .gpu3/old assets/distill/smollm2-gpu \
#       --byte-level --init assets/mamba-byte-drafter --lr 1e-3 --batch 64 --eval-data assets/distill/smollm2-eval &
#   (carry assets/mamba-byte-drafter too, 7 MB)
#
# Both train under bf16 autocast on CUDA (`--amp auto`; TF32 for what stays fp32).
# Writes $OUT/<name>.log and the trained directory as a tar in 15 MB pieces (a file that comes back
# is at most 16 MiB; 4 pieces for a 56 MB fp32-trained drafter of the shipped size). Defaults: the
# shipped drafter's shape (d_model 480, 3 layers: 56 MB in bf16 under the 60 MB cap), batch 32 x
# 512 tokens; later options override earlier ones.
set -euo pipefail
out=${1:?usage: gpu_train_drafter.sh OUT_DIR [SECONDS] [distill train options]}
budget=${2:-420}
shift $(( $# >= 2 ? 2 : 1 ))
name=${GPU_DRAFTER_NAME:-gpu-drafter}
work=/tmp/$name
rm -rf "$work"
python3 -m engine.cli distill train --data assets/distill/smollm2 --tokenizer assets/mamba-drafter-smollm2 \
    --out "$work" --device cuda --time-budget "$budget" --steps 1000000 --batch 32 --seq-len 512 \
    --d-model 480 --layers 3 --d-state 64 --head-dim 64 --lr 2e-3 --negatives 256 --vocab-min-count 3 \
    --eval-every 500 --save-every 1000000 "$@" 2> "$out/$name.log" || { tail -c 3000 "$out/$name.log"; exit 1; }
rm -f "$work/train_state.pt"  # the optimizer's state: not needed here, and 3x the weights
tar -C /tmp -cf - "$name" | split -b 15M - "$out/$name.tar.part-"
tail -c 1500 "$out/$name.log" | tr '\r' '\n' | tail -8
ls -la "$out"
