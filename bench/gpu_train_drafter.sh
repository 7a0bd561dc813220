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
#                   cp assets/mamba-drafter-smollm2/tokenizer.json drafters/gpu-drafter.bf16/
#                   specchat distill scorer --drafter drafters/gpu-drafter.bf16 --datastore assets/ngram-smollm2.npz \
#                       --data assets/distill/smollm2-self-eval   # hybrid:K's chain scorer for it (~1 min; session 39)
#                   specchat bench --drafter drafters/gpu-drafter.bf16 --strategies sd:5,hybrid:5,hybrid:auto,pld:auto
#
# Continuing the shipped drafter on both reply sets instead (what session 14 found the GPU time is
# best spent on: from scratch, 270 s did not reach it; see bench/results/2026-11-26-h200-distill/),
# with the byte drafter trained beside it from scratch (a second process on the same GPU; the name
# keeps the two apart; its replies are the same replies, as UTF-8; its 7 MB init would not fit):
#   here:    PATH=.venv/bin:$PATH bash bench/gpu_train_drafter.sh --pack
#              .gpu3/: old/ (the first reply set, xz), init/ (the shipped drafter without its
#              tokenizer, its embedding table cut to the rows the reply sets use), tok/ (the
#              tokenizer, xz); prints what a call then carries: ~44 MiB of the 64 with the rest of
#              the tree (session 38; 64.9 MiB with the whole table). A call copies tracked and non-ignored files, and the
#              tracked tree is 111 MB: put /.gpu3/ and /assets/ in .git/info/exclude and
#              `git rm -r --cached -q assets` for the call, `git reset -q assets` after.
#   carry:   .gpu3 assets/distill/smollm2-gpu assets/distill/smollm2-eval
#            (+ assets/distill/smollm2-copy, 0.7 MB, session 26's copy tasks: 64.2 MiB with the rest, so
#            take bench/results out of the call's tree too, `git rm -r --cached -q bench/results`, 2.6 MB;
#            then add it to both commands' --data)
#   on the device (one call, timeout_s ~560):
#     GPU_DRAFTER_NAME=gpu-byte bash bench/gpu_train_drafter.sh "$OUT" 450 --data .gpu3/old assets/distill/smollm2-gpu \
#         --byte-level --d-model 256 --layers 4 --lr 3e-3 --batch 64 --eval-data assets/distill/smollm2-eval &
#     bash bench/gpu_train_drafter.sh "$OUT" 450 --data .gpu3/old assets/distill/smollm2-gpu \
#         --init .gpu3/init --lr 5e-4 --batch 64 --eval-data assets/distill/smollm2-eval; wait
#   (checked on this CPU with --device cpu --steps 2; --init takes the drafter's own shape; the
#   tokenizer comes from .gpu3/tok where the drafter's own is not there)
#
# Session 27's view: the H200 trained ~10x this CPU's tokens/s (two runs sharing it; transformers' PyTorch Mamba-2 path),
# while it writes replies ~40x faster, and the drafter already overfits the three reply sets: a
# GPU session's first use is new replies (`bench/gpu_distill.sh --gen`, two calls), this script second.
#
# Both train under bf16 autocast on CUDA (`--amp auto`; TF32 for what stays fp32).
# Writes $OUT/<name>.log and the trained directory, exported to bf16, as a tar in 15 MB pieces (a file that comes back
# is at most 16 MiB; 4 pieces for a drafter of the shipped size). Defaults: the
# shipped drafter's shape (d_model 480, 3 layers: 56 MB in bf16 under the 60 MB cap), batch 32 x
# 512 tokens; later options override earlier ones.
set -euo pipefail
if [ "${1:-}" = --pack ]; then
    src=assets/mamba-drafter-smollm2
    rm -rf .gpu3 && mkdir -p .gpu3/old .gpu3/init .gpu3/tok
    xz -9 -T2 -c assets/distill/smollm2/responses.jsonl > .gpu3/old/responses.jsonl.xz
    # the init with embedding rows only for the tokens the reply sets hold (`distill export
    # --shrink-vocab`, 56 -> 35 MB; `--init` widens it back, exact for every stored row): with the
    # whole 56 MB table the call carried 64.9 MiB of the 64 (session 38)
    sets=$(ls -d assets/distill/smollm2*/ | grep -v -e '-eval/$' -e '-self-eval/$' | tr '\n' ' ')
    python3 -m engine.cli distill export --from "$src" --to .gpu3/init-x --dtype bf16 --shrink-vocab $sets > /dev/null
    cp .gpu3/init-x/config.json .gpu3/init-x/generation_config.json .gpu3/init-x/draft_vocab.json .gpu3/init-x/model.safetensors .gpu3/init/
    rm -rf .gpu3/init-x
    xz -9 -c "$src"/tokenizer.json > .gpu3/tok/tokenizer.json.xz
    cp "$src"/tokenizer_config.json .gpu3/tok/
    rest=$(git ls-files -z | grep -zv '^assets/' | xargs -0 du -cb | tail -1 | cut -f1)
    carried=$(du -cb .gpu3 assets/distill/smollm2-gpu assets/distill/smollm2-eval | tail -1 | cut -f1)
    echo "carried $carried bytes + the tree outside assets/ $rest = $(( (carried + rest) / 1048576 )) MiB of 64"
    exit 0
fi
out=${1:?usage: gpu_train_drafter.sh OUT_DIR [SECONDS] [distill train options] | --pack}
budget=${2:-420}
shift $(( $# >= 2 ? 2 : 1 ))
name=${GPU_DRAFTER_NAME:-gpu-drafter}
work=/tmp/$name
rm -rf "$work"
tok=assets/mamba-drafter-smollm2
if [ ! -f "$tok/tokenizer.json" ] && [ -f .gpu3/tok/tokenizer.json.xz ]; then  # a call that carried --pack's .gpu3
    tok=/tmp/$name-tok && mkdir -p "$tok" && xz -dc .gpu3/tok/tokenizer.json.xz > "$tok/tokenizer.json"
    cp .gpu3/tok/tokenizer_config.json "$tok/"
fi
python3 -m engine.cli distill train --data assets/distill/smollm2 --tokenizer "$tok" \
    --out "$work" --device cuda --time-budget "$budget" --steps 1000000 --batch 32 --seq-len 512 \
    --d-model 480 --layers 3 --d-state 64 --head-dim 64 --lr 2e-3 --negatives 256 --vocab-min-count 3 \
    --eval-every 500 --save-every 1000000 "$@" 2> "$out/$name.log" || { tail -c 3000 "$out/$name.log"; exit 1; }
# what comes back from a call is at most 64 MiB in all: the weights in bf16 (`distill export`), and
# a tokenizer over 1 MB (SmolLM2's, 3.5 MB) left out: copy it back in from assets/mamba-drafter-smollm2
rm -rf "$work.bf16"
# GPU_DRAFTER_SHRINK="DIR ...": store embedding rows only for the tokens those sets hold (`distill
# export --shrink-vocab`; 25,880 of 49,152 rows for the shipped sets): a deeper drafter then still
# fits the 60 MB cap and comes back in fewer pieces. Deeper, session 31: `--init .gpu3/init
# --grow-layers 8` (the shipped layers kept, copies with zeroed output projections between them).
python3 -m engine.cli distill export --from "$work" --to "$work.bf16" --dtype bf16 \
    ${GPU_DRAFTER_SHRINK:+--shrink-vocab $GPU_DRAFTER_SHRINK} > /dev/null
if [ "$(stat -c %s "$work.bf16/tokenizer.json")" -gt 1000000 ]; then rm "$work.bf16/tokenizer.json"; fi
tar -C /tmp -cf - "$name.bf16" | split -b 15M - "$out/$name.tar.part-"
tail -c 1500 "$out/$name.log" | tr '\r' '\n' | tail -8
ls -la "$out"
