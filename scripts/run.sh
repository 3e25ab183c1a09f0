#!/usr/bin/env bash
# One entry point for a fresh clone: sets everything up (a .venv with the pinned CPU torch and attnzoo installed),
# then runs the requested task.
#   bash scripts/run.sh test   -> the default test suite (slow and GPU tests are skipped)
#   bash scripts/run.sh demo   -> trains a tokenizer and tiny models on bundled data and prints the results
set -euo pipefail
cd "$(dirname "$0")/.."
task="${1:-test}"
shift || true
PY="${PYTHON:-python3}"
TORCH_VERSION="${ATTNZOO_TORCH_VERSION:-2.13.0}"

if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
# Installing the pinned torch first keeps pip from resolving `torch` to the newest CUDA build.
if ! .venv/bin/python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
    .venv/bin/pip install --quiet --upgrade pip
    .venv/bin/pip install --quiet "torch==$TORCH_VERSION"
fi
if ! .venv/bin/python -c "import attnzoo, pytest, ruff, matplotlib" 2>/dev/null \
    || [ pyproject.toml -nt .venv/.attnzoo-installed ]; then
    .venv/bin/pip install --quiet -e ".[dev,plots]"
    touch .venv/.attnzoo-installed
fi
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

case "$task" in
    test)
        .venv/bin/python -m pytest "$@"
        ;;
    demo)
        .venv/bin/python scripts/demo.py "$@"
        ;;
    *)
        echo "usage: bash scripts/run.sh {test|demo} [extra args]" >&2
        exit 2
        ;;
esac
