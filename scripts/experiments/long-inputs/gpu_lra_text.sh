#!/usr/bin/env bash
# LRA Text (bytes) on one GPU: the paired comparison behind the long-document bar, over several training seeds.
#
# Every run uses the CPU protocol of this study's README ("LRA Text": the 2,000 / 500 split of the shipped reviews,
# IMDB size, 1,500 steps of batch 16, AdamW 1e-3, 150 warm-up steps, mean pooling, length-grouped batches, fp32) on
# CUDA.
# Jobs, in priority order (each its own process: the models are small, so one GPU trains many side by side; each seed
# its own results folder, since a folder holds one budget):
#   1. for every seed: dense attention truncated to 1,024 bytes and A²-Former reading 4,096, fixed (sinusoidal)
#      positions;
#   2. seed 0 of the other sparse families at 4,096 bytes, fixed positions;
#   3. for every seed: the same pair with the default learned position table.
# With PRETRAIN_STEPS=P (environment) every run first pretrains its encoder for P masked-language-model steps on the
# training reviews (self-pretraining, `run_long_eval.py --pretrain_steps`), and the jobs are, for every seed, dense at
# 1,024 bytes, A²-Former and the Sparse Transformer at 4,096, fixed positions.
# STEPS=S (environment) sets the fine-tuning steps (default 1,500), e.g. a from-scratch run as long as another row's
# pretraining plus fine-tuning. ROWS="LENGTH ROW[;LENGTH ROW...]" replaces the job list: every entry for every seed, a
# ROW as `--variant` takes it (`a2former:position_embedding_type=sinusoidal`) or a bare family (its defaults).
# Results in OUT_DIR/[spt<P>-][steps<S>-]seed<N>/ (the parts that differ from the defaults). DRY_RUN=1 prints the jobs
# ("SEED LENGTH ROW" per line) and the folder prefix instead of running them.
# A job that fails on the fast (Triton) path is run again with `attention_backend=reference` under its own label.
#
# Usage (repository root, attnzoo importable):
#   [PRETRAIN_STEPS=P] [STEPS=S] [ROWS=...] bash scripts/experiments/long-inputs/gpu_lra_text.sh OUT_DIR [SECONDS] [PARALLEL] [SEED...]
#   SECONDS: wall-clock limit for all jobs (default 360); PARALLEL: jobs at once (default 14); seeds default to 0-4.
set -uo pipefail
out="$1"
limit="${2:-360}"
parallel="${3:-14}"
shift $(($# < 3 ? $# : 3))
seeds=("${@}")
[ ${#seeds[@]} -gt 0 ] || seeds=(0 1 2 3 4)
pretrain="${PRETRAIN_STEPS:-0}"
steps="${STEPS:-1500}"
for value in "$pretrain" "$steps"; do
    if ! [[ "$value" =~ ^[0-9]+$ ]]; then
        echo "gpu_lra_text: PRETRAIN_STEPS and STEPS take a step count, got '$value'" >&2
        exit 2
    fi
done
# ROWS entries, trimmed, empty ones dropped. Each is "LENGTH ROW"; a malformed one would otherwise fail inside a job,
# after the device time is spent.
rows=()
IFS=';' read -ra entries <<< "${ROWS:-}"
for entry in "${entries[@]}"; do
    read -r entry <<< "$entry"  # trims the spaces around it
    [ -n "$entry" ] || continue
    if ! [[ "$entry" =~ ^[0-9]+\ [a-z0-9_]+(:[^\ ]+)?$ ]]; then
        echo "gpu_lra_text: a ROWS entry is 'LENGTH FAMILY[:FIELD=VALUE,...]', got '$entry'" >&2
        exit 2
    fi
    rows+=("$entry")
done
if [ -n "${ROWS:-}" ] && [ ${#rows[@]} -eq 0 ]; then
    echo "gpu_lra_text: ROWS='$ROWS' names no job" >&2
    exit 2
fi
folder=seed
[ "$steps" -ne 1500 ] && folder="steps$steps-$folder"
[ "$pretrain" -gt 0 ] && folder="spt$pretrain-$folder"

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
        --group_by_length --steps "$steps" --batch_size 16 --learning_rate 1e-3 --warmup_steps 150 --device cuda
        --pretrain_steps "$pretrain" --seed "$seed" --output_dir "$out/$folder$seed")
    python3 scripts/run_long_eval.py "${args[@]}" "${first[@]}" >"$log" 2>&1 \
        || python3 scripts/run_long_eval.py "${args[@]}" "${fallback[@]}" >>"$log" 2>&1
}
export -f job
export out pretrain steps folder

# The job list, one "SEED LENGTH ROW" per line.
job_list() {
    local sin=position_embedding_type=sinusoidal seed entry
    if [ ${#rows[@]} -gt 0 ]; then
        for seed in "${seeds[@]}"; do
            for entry in "${rows[@]}"; do
                echo "$seed $entry"
            done
        done
    elif [ "$pretrain" -gt 0 ]; then
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
    fi
}

if [ -n "${DRY_RUN:-}" ]; then
    echo "folder $folder"
    job_list
    exit 0
fi
mkdir -p "$out"
job_list | timeout "$limit" xargs -P "$parallel" -L 1 bash -c 'job "$0" "$1" "$2"'
echo "gpu_lra_text: jobs ended (exit $?); results in $out/$folder*/long_eval.json"
