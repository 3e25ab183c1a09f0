#!/usr/bin/env bash
# The first device call of 2026-11-26 on the H200, run from the repository root with .whl/ (datasets, dill,
# multiprocess wheels) carried: `bash scripts/experiments/speed-memory/results/gpu-2026-11-26-h200/commands.sh 900 370`. Tests beside the
# self-pretrained Text runs, then the benchmarks.
set -u
P="${1:-900}"; TEXT_SECONDS="${2:-380}"
S=/tmp/site; mkdir -p $S
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $S .whl/*.whl || exit 1
ln -sfn "$PWD/models" $S/attnzoo; export PYTHONPATH=$S
W=/tmp/w; mkdir -p $W
git rev-parse HEAD > $W/commit.txt 2>/dev/null; nvidia-smi > $W/nvidia-smi.txt
pack() { (cd $W && tar czf "$OUT/results.tgz" --exclude='*.pt' .); }
start=$(date +%s)
( timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider --continue-on-collection-errors --timeout 150 \
    --junitxml $W/tests.xml > $W/tests.log 2>&1; echo "pytest exit $?" >> $W/tests.log ) &
PRETRAIN_STEPS=$P bash scripts/experiments/long-inputs/gpu_lra_text.sh $W/text "$TEXT_SECONDS" 15 0 1 2 3 4 > $W/text.log 2>&1
wait
echo "phase A $(( $(date +%s) - start )) s" >> $W/times.txt; pack
timeout 70 python3 scripts/tools/gpu_check.py bench-small --lengths 16384 --rows dense smart_bird "sbm:fastrg-2%" \
    --rounds 3 --warmup 2 --output-dir $W/gpu > $W/bench-small.log 2>&1
echo "bench-small $(( $(date +%s) - start )) s" >> $W/times.txt; pack
timeout 100 python3 scripts/tools/gpu_check.py bench-base --lengths 16384 --rounds 3 --warmup 2 \
    --rows dense a2former sparse_transformer fsat --output-dir $W/base1 > $W/bench-base1.log 2>&1
echo "bench-base1 $(( $(date +%s) - start )) s" >> $W/times.txt; pack
timeout 80 python3 scripts/tools/gpu_check.py bench-base --lengths 16384 --rounds 3 --warmup 2 \
    --rows dense "sbm:fastrg-2%" smart_bird hf:bigbird hf:longformer --output-dir $W/base2 > $W/bench-base2.log 2>&1
echo "bench-base2 $(( $(date +%s) - start )) s" >> $W/times.txt; pack

# The second command (the A²-Former rows at 1,024 bytes, five seeds side by side; attnzoo on PYTHONPATH as above):
# for s in 0 1 2 3 4; do timeout 225 python3 scripts/run_long_eval.py --tasks text --text_lengths 1024 \
#     --text_dense_lengths --text_pooling mean --group_by_length --steps 1500 --batch_size 16 --learning_rate 1e-3 \
#     --warmup_steps 150 --device cuda --pretrain_steps 900 --seed $s --output_dir $W/spt900-seed$s --families \
#     --variant a2former:position_embedding_type=sinusoidal > $W/log-a2-1024-seed$s.txt 2>&1 & done; wait
