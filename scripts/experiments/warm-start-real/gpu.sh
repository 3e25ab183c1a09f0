#!/usr/bin/env bash
# The study on one GPU: every row of every step side by side (run.py all --profile gpu), in at most 8 minutes
# (7.5 for the study, the rest for unpacking). PROFILE=gpu-ectsum runs step 3b alone for five epochs instead (a second
# call: its own work folder, so that nothing of the first call's rows is reused).
#
# The source checkpoint, ECTSum, WikiText and the wheels the machine lacks (datasets, rouge_score, ...) do not travel
# with the repository (MiniLM alone is 87 MB; a device call carries 64 MiB with the tree), so `device_pack.py` cuts
# them into parts under outputs/devicepack/ and each device call carries one part (`carry`), the machine staying warm
# between calls:
#   bash scripts/experiments/warm-start-real/gpu.sh receive outputs/devicepack/part1        # every part but the last
#   bash scripts/experiments/warm-start-real/gpu.sh run outputs/devicepack/part3 "$OUT"     # the last one, then the run
# `run` joins the parts, installs the wheels into a private folder, puts attnzoo on the path (a link to models/, as
# `scripts/run.sh gpu` does), runs the study and copies its tables and records to OUT (logs as one archive).
# Environment: SECONDS_LIMIT (default 450: the study, its programs stopped a minute before), PROFILE (gpu),
# DEVICE (cuda), FAMILIES (all), PARALLEL (the profile's), REVIEWS (the tracked 2,500 IMDB reviews), STAGING
# (/tmp/warm-start-real).
set -euo pipefail
cd "$(dirname "$0")/../../.."
action="${1:-}"
part="${2:-}"
staging="${STAGING:-/tmp/warm-start-real}"
if [ "$action" != receive ] && [ "$action" != run ] || [ ! -d "$part" ]; then
    echo "usage: gpu.sh {receive|run} PART_FOLDER [OUT]  (PART_FOLDER from device_pack.py)" >&2
    exit 2
fi
mkdir -p "$staging/chunks"
cp "$part"/chunk-* "$staging/chunks/"
if [ "$action" = receive ]; then
    echo "gpu.sh: received $(ls "$part") into $staging/chunks"
    exit 0
fi
out="${3:?gpu.sh run needs an output folder}"
expected="$(cat "$part/chunks")"
found="$(ls "$staging/chunks" | wc -l)"
if [ "$found" -ne "$expected" ]; then
    echo "gpu.sh: $found of $expected chunks received; run 'gpu.sh receive' with every other part first" >&2
    exit 2
fi
cat "$staging"/chunks/chunk-* | tar -x -C "$staging"
PY="${PYTHON:-python3}"
site="$staging/site"
mkdir -p "$site"
if compgen -G "$staging/payload/whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" "$staging"/payload/whl/*.whl
fi
if ! "$PY" -c "import importlib.util as u, sys; sys.exit(u.find_spec('attnzoo') is None)"; then
    ln -sfn "$PWD/models" "$site/attnzoo"
fi
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
profile="${PROFILE:-gpu}"
args=(all --profile "$profile" --device "${DEVICE:-cuda}" --source "$staging/payload/source"
    --ectsum "$staging/payload/ectsum" --wikitext "$staging/payload/wikitext.txt"
    --reviews "${REVIEWS:-tests/fixtures/data/imdb/train_subset_2500.tsv}"
    --work "$staging/work/$profile" --results "$out/results" --deadline "${SECONDS_LIMIT:-450}")
if [ -n "${FAMILIES:-}" ]; then
    read -ra families <<<"$FAMILIES"
    args+=(--families "${families[@]}")
fi
if [ -n "${PARALLEL:-}" ]; then
    args+=(--jobs "$PARALLEL")
fi
status=0
"$PY" scripts/experiments/warm-start-real/run.py "${args[@]}" >"$staging/run.log" 2>&1 || status=$?
tar -czf "$out/logs.tar.gz" -C "$staging" run.log "work/$profile/logs" 2>/dev/null || true
echo "gpu.sh: run.py exited $status; tables in $out/results/README.md"
exit "$status"
