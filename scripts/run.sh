#!/usr/bin/env bash
# One entry point for a fresh clone: sets everything up (a .venv with the pinned CPU torch and attnzoo installed),
# then runs the requested task.
#   bash scripts/run.sh test         -> the default test suite (slow, GPU and wheel tests are skipped) against the
#                                       newest transformers release pip resolves, as a new user gets it, on two
#                                       processes (pytest-xdist; PYTEST_WORKERS=0 runs it in one)
#   bash scripts/run.sh test-oldest  -> the same suite against the oldest supported transformers release
#                                       (5.17.0, the GPU machine's), in a second environment (.venv-oldest)
#   bash scripts/run.sh test-wheel   -> builds the wheel and installs it, non-editable and with the core
#                                       dependencies only, into a fresh environment where every family must run
#   bash scripts/run.sh demo         -> trains a tokenizer and tiny models on bundled data and prints the results
#   bash scripts/run.sh gpu [STAGE ...] [--dry-run] -> the GPU validation (scripts/tools/gpu_check.py): pytest -m gpu, the
#                                       CUDA bf16 benchmark, a bf16 fine-tune per family; with the machine's own
#                                       python3/torch/transformers, no network and no venv (see scripts/README.md)
set -euo pipefail
cd "$(dirname "$0")/.."
task="${1:-test}"
shift || true
PY="${PYTHON:-python3}"
TORCH_VERSION="${ATTNZOO_TORCH_VERSION:-2.13.0}"
# The default suite runs on two processes: the machine the project is developed and tested on has two cores.
WORKERS="${PYTEST_WORKERS:-2}"
# Lower end of `transformers>=...` in pyproject.toml; CI tests both ends of the range.
OLDEST_TRANSFORMERS="5.17.0"

# setup_venv DIR [EXTRA_REQUIREMENT...]: create DIR with the pinned torch and attnzoo (editable, with the dev extra:
# training, plots, triton and the test tools).
setup_venv() {
    local venv="$1"
    shift
    if [ ! -x "$venv/bin/python" ]; then
        "$PY" -m venv "$venv"
    fi
    # Installing the pinned torch first keeps pip from resolving `torch` to the newest CUDA build.
    if ! "$venv/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" \
        2>/dev/null; then
        "$venv/bin/pip" install --quiet --upgrade pip
        "$venv/bin/pip" install --quiet "torch==$TORCH_VERSION"
    fi
    local stamp="$venv/.attnzoo-installed"
    if ! "$venv/bin/python" -c "import attnzoo, pytest, ruff, matplotlib, datasets, xdist" 2>/dev/null \
        || [ pyproject.toml -nt "$stamp" ] || [ "$*" != "$(cat "$stamp" 2>/dev/null)" ]; then
        "$venv/bin/pip" install --quiet -e ".[dev]" "$@"
        echo "$*" >"$stamp"
    fi
}

export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

case "$task" in
    test)
        setup_venv .venv
        .venv/bin/python -c "import transformers, torch; print(f'transformers {transformers.__version__}, torch {torch.__version__}')"
        .venv/bin/python -m pytest -n "$WORKERS" "$@"
        ;;
    test-oldest)
        setup_venv .venv-oldest "transformers==$OLDEST_TRANSFORMERS"
        .venv-oldest/bin/python -c "import transformers, torch; print(f'transformers {transformers.__version__}, torch {torch.__version__}')"
        .venv-oldest/bin/python -m pytest -n "$WORKERS" "$@"
        ;;
    test-wheel)
        setup_venv .venv
        .venv/bin/python -m pytest -m wheel tests/packaging "$@"
        ;;
    demo)
        setup_venv .venv
        .venv/bin/python scripts/demo.py "$@"
        ;;
    gpu)
        # `bash scripts/run.sh gpu speed` is issue 49's prepared run (about 8 minutes on one H100: sync sanity, the
        # proxies on CUDA, kernel micro-benchmarks, the base-size benchmark with the floor, the peers and the
        # crossover lengths, a profile per family); without a stage, the validation (scripts/tools/gpu_check.py).
        # A GPU machine brings its own torch/transformers/triton and may have no network: nothing is installed from
        # an index. Pure-Python packages it lacks travel as wheels in .whl/ (prepared where pip works, e.g.
        # `pip download --no-deps -d .whl datasets==...`) and go to a private folder on the path.
        GPU_PY="${PYTHON:-python3}"
        site="${TMPDIR:-/tmp}/attnzoo-gpu-site"
        mkdir -p "$site"
        if compgen -G ".whl/*.whl" >/dev/null; then
            "$GPU_PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" .whl/*.whl
        fi
        # attnzoo is the folder models/ under another name: a link on the path imports it without installing.
        if ! "$GPU_PY" -c "import importlib.util as u, sys; sys.exit(u.find_spec('attnzoo') is None)"; then
            ln -sfn "$PWD/models" "$site/attnzoo"
        fi
        export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
        "$GPU_PY" scripts/tools/gpu_check.py "$@"
        ;;
    *)
        echo "usage: bash scripts/run.sh {test|test-oldest|test-wheel|demo|gpu} [extra args]" >&2
        exit 2
        ;;
esac
