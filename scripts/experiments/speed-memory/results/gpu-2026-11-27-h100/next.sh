#!/usr/bin/env bash
# The next GPU session's runs ("What the next GPU session should run" in this folder's README), from the repository
# root with .whl/ (datasets, dill, multiprocess wheels) carried. One part per device call:
#   bash scripts/experiments/speed-memory/results/gpu-2026-11-27-h100/next.sh listops [SECONDS]   # ListOps at LRA's lengths, 18 runs
#   bash scripts/experiments/speed-memory/results/gpu-2026-11-27-h100/next.sh text [SECONDS]      # A²-Former@1024 and the Sparse Transformer
#                                                                         # @4096 with rotary + self-pretraining
# Results are packed into $OUT/results.tgz (the per-seed folders and the logs).
set -u
part="${1:?listops or text}"
limit="${2:-420}"
if [ "$part" != listops ] && [ "$part" != text ]; then  # before any device time is spent
    echo "next.sh: the part is 'listops' or 'text', got '$part'" >&2
    exit 2
fi
S=/tmp/site; mkdir -p $S
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $S .whl/*.whl || exit 1
ln -sfn "$PWD/models" $S/attnzoo; export PYTHONPATH=$S
export OMP_NUM_THREADS=2  # many training processes share 16 cores; the work is on the GPU
W=/tmp/w; mkdir -p $W
git rev-parse HEAD > $W/commit.txt 2>/dev/null; nvidia-smi > $W/nvidia-smi.txt
start=$(date +%s)
case "$part" in
    listops)
        # The short-tree CPU table's size and learning rate (scripts/experiments/long-inputs/results/listops-lra/) at LRA's tree
        # lengths, with a longer budget: on this CPU dense attention at 2,048 was still on the label prior after
        # 1,200 steps of batch 8 (scripts/experiments/long-inputs/results/listops-2048-cpu/). STEPS / BATCH / SEEDS override;
        # CURRICULUM=N starts with N steps of 100-500 token trees, as the CPU table did
        # (scripts/experiments/long-inputs/results/listops-curriculum/).
        steps="${STEPS:-3000}"
        for s in ${SEEDS:-0 1 2}; do
            for f in dense_transformer a2former sparse_transformer fsat sbm smart_bird; do
                timeout "$limit" python3 scripts/run_long_eval.py --tasks listops --listops_lengths 2048 \
                    --steps "$steps" --warmup_steps $(( steps / 10 )) --batch_size "${BATCH:-16}" \
                    --group_by_length --device cuda --seed $s ${CURRICULUM:+--listops_curriculum_steps $CURRICULUM} \
                    --output_dir $W/listops-seed$s --families $f > $W/log-listops-$s-$f.txt 2>&1 &
            done
        done
        wait
        python3 scripts/experiments/long-inputs/seeds.py $W/listops-seed* --task listops --baseline "dense_transformer@2048" \
            --output $W/listops-seeds.md > /dev/null 2>&1
        ;;
    text)
        rope=position_embedding_type=rotary
        PRETRAIN_STEPS=900 ROWS="1024 a2former:$rope;4096 sparse_transformer:$rope" \
            bash scripts/experiments/long-inputs/gpu_lra_text.sh $W/text "$limit" 10 0 1 2 3 4 > $W/text.log 2>&1
        ;;
esac
echo "$part $(( $(date +%s) - start )) s" >> $W/times.txt
(cd $W && tar czf "$OUT/results.tgz" --exclude='*.pt' .)
