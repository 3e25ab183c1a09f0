#!/usr/bin/env bash
# LRA Text (bytes) on one GPU: the paired comparison behind the long-document bar, over several training seeds.
#
# Every run uses the README's CPU protocol ("LRA Text on this CPU": the 2,000 / 500 split of the shipped reviews, IMDB
# size, 1,500 steps of batch 16, AdamW 1e-3, 150 warm-up steps, mean pooling, length-grouped batches, fp32) on CUDA.
# Jobs, in priority order (each its own process: the models are small, so one GPU trains many side by side; each seed
# its own results folder, since a folder holds one budget):
#   1. for every seed: dense attention truncated to 1,024 bytes and A²-Former reading 4,096, fixed sinusoidal positions;
#   2. seed 0 of the other sparse families at 4,096 bytes, fixed positions;
#   3. for every seed: the same pair with the default learned position table.
# With PRETRAIN_STEPS=P (environment) every run first pretrains its encoder for P masked-language-model steps on the
# training reviews (self-pretraining, `run_long_eval.py --pretrain_steps`), and the jobs are, for every seed, dense at
# 1,024 bytes, A²-Former and the Sparse Transformer at 4,096, fixed positions; results in OUT_DIR/spt<P>-seed<N>/.
# A job that fails on the fast (Triton) path is run again with `attention_backend=reference` under its own label.
#
# Usage (repository root, attnzoo importable): [PRETRAIN_STEPS=P] bash scripts/gpu_lra_text.sh OUT_DIR [SECONDS]
#   [PARALLEL] [SEED...]
#   SECONDS: wall-clock limit for all jobs (default 360); PARALLEL: jobs at once (default 14); seeds default to 0-4.
set -uo pipefail
out="$1"
limit="${2:-360}"
parallel="${3:-14}"
shift $(($# < 3 ? $# : 3))
seeds=("${@}")
[ ${#seeds[@]} -gt 0 ] || seeds=(0 1 2 3 4)
pretrain="${PRETRAIN_STEPS:-0}"
folder=seed
[ "$pretrain" -gt 0 ] && folder="spt$pretrain-seed"
mkdir -p "$out"

# One job: SEED LENGTH ROW, the row a family's default (`a2former`) or a variant (`a2former:FIELD=VALUE`).
# Writes $out/$folder<SEED>/ and a log beside it.
job() {
    local seed="$1" length="$2" row="$3"
    local log="$out/log-$folder$seed-${row//[^a-z0-9_]/-}-$length.txt"
    local first=(--families "$row") fallback=(--families --variant "$row:attention_backend=reference")
    if [[ "$row" == *:* ]]; then
        first=(--families --variant "$row")
        fallback=(--families --variant "$row,attention_backend=reference")
    fi
    local args=(--tasks text --text_lengths "$length" --text_dense_lengths --text_pooling mean
        --group_by_length --steps 1500 --batch_size 16 --learning_rate 1e-3 --warmup_steps 150 --device cuda
        --pretrain_steps "$pretrain" --seed "$seed" --output_dir "$out/$folder$seed")
    python3 scripts/run_long_eval.py "${args[@]}" "${first[@]}" >"$log" 2>&1 \
        || python3 scripts/run_long_eval.py "${args[@]}" "${fallback[@]}" >>"$log" 2>&1
}
export -f job
export out pretrain folder

sin=position_embedding_type=sinusoidal
if [ "$pretrain" -gt 0 ]; then
    for seed in "${seeds[@]}"; do
        echo "$seed 1024 dense_transformer:$sin"
        echo "$seed 4096 a2former:$sin"
        echo "$seed 4096 sparse_transformer:$sin"
    done
else
    for seed in "${seeds[@]}"; do
        echo "$seed 1024 dense_transformer:$sin"
        echo "$seed 4096 a2former:$sin"
    done
    for family in sparse_transformer smart_bird fsat sbm; do
        echo "${seeds[0]} 4096 $family:$sin"
    done
    for seed in "${seeds[@]}"; do
        echo "$seed 1024 dense_transformer"
        echo "$seed 4096 a2former"
    done
fi | timeout "$limit" xargs -P "$parallel" -L 1 bash -c 'job "$0" "$1" "$2"'
echo "gpu_lra_text: jobs ended (exit $?); results in $out/$folder*/long_eval.json"
