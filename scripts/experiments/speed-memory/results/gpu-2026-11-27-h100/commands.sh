#!/usr/bin/env bash
# The device call of 2026-11-27, from the repository root with .whl/ (datasets, dill, multiprocess wheels) carried:
# `bash scripts/experiments/speed-memory/results/gpu-2026-11-27-h100/commands.sh`. LRA Text rows that decide the
# long-document bar, side by side, beside `pytest -m gpu`:
#   - dense attention at 1,024 bytes, default learned positions, 1,500 steps, seeds 2-4 (seeds 0-1 ran on 2026-11-26);
#   - the same for 2,400 steps (as long as the self-pretrained rows' 900 + 1,500), seeds 0-4;
#   - rotary positions from scratch: dense at 1,024 bytes, A²-Former and the Sparse Transformer at 4,096, seeds 0-4.
set -u
TEXT_SECONDS="${1:-450}"
S=/tmp/site; mkdir -p $S
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $S .whl/*.whl || exit 1
ln -sfn "$PWD/models" $S/attnzoo; export PYTHONPATH=$S
# 23 training processes share 16 cores; the work is on the GPU, so each keeps two CPU threads.
export OMP_NUM_THREADS=2
W=/tmp/w; mkdir -p $W
git rev-parse HEAD > $W/commit.txt 2>/dev/null; nvidia-smi > $W/nvidia-smi.txt
start=$(date +%s)
( timeout 320 python3 -m pytest -m gpu -q -p no:cacheprovider --continue-on-collection-errors --timeout 150 \
    --junitxml $W/tests.xml > $W/tests.log 2>&1; echo "pytest exit $?" >> $W/tests.log ) &
rope=position_embedding_type=rotary
ROWS="1024 dense_transformer" bash scripts/experiments/long-inputs/gpu_lra_text.sh $W/text "$TEXT_SECONDS" 3 2 3 4 > $W/text-learned.log 2>&1 &
STEPS=2400 ROWS="1024 dense_transformer" bash scripts/experiments/long-inputs/gpu_lra_text.sh $W/text "$TEXT_SECONDS" 5 0 1 2 3 4 \
    > $W/text-2400.log 2>&1 &
ROWS="1024 dense_transformer:$rope;4096 a2former:$rope;4096 sparse_transformer:$rope" \
    bash scripts/experiments/long-inputs/gpu_lra_text.sh $W/text "$TEXT_SECONDS" 15 0 1 2 3 4 > $W/text-rotary.log 2>&1 &
wait
echo "all $(( $(date +%s) - start )) s" >> $W/times.txt
(cd $W && tar czf "$OUT/results.tgz" --exclude='*.pt' .)

# The second command (the base-size benchmark group that ran out of time on 2026-11-26; attnzoo on PYTHONPATH as
# above):
# timeout 250 python3 scripts/tools/gpu_check.py bench-base --lengths 16384 --rounds 3 --warmup 2 \
#     --rows dense "sbm:fastrg-2%" smart_bird hf:bigbird hf:longformer --output-dir $OUT/base2
# The third (self-pretraining with rotary positions, seeds 0-4, ten runs side by side):
# OMP_NUM_THREADS=2 PRETRAIN_STEPS=900 ROWS="1024 dense_transformer:$rope;4096 a2former:$rope" \
#     bash scripts/experiments/long-inputs/gpu_lra_text.sh /tmp/w2/text 285 10 0 1 2 3 4
