#!/usr/bin/env bash
# Wheels for the GPU suite and the GPU benchmarks on a machine that has CUDA torch, transformers, accelerate and peft
# but reaches no package registry (a GPU node cut off from the network). Run here, carry DIR there:
#
#   envs/gpu-wheels.sh .whl                                  # here: klstudy's other dependencies, pinned by the lock
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl   # there
#   PYTHONPATH=/tmp/site:src make test-gpu GPU_PYTHON=python3
#
# Python 3.12, manylinux x86-64; versions from requirements.lock. Packages with no wheel on PyPI (pure Python) are
# built into one here. A cluster with a registry needs none of this: `make venv` there installs CUDA torch from PyPI.
case "${1:-}" in -h | --help) sed -n '2,/^set -/{/^set -/!s/^# \{0,1\}//p}' "$0"; exit 0 ;; esac
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.whl}
# What klstudy's train, evaluate, divergence and prepare-data commands import beyond that machine's image (found by
# recording the modules every process of the suite's CPU rehearsal imported; wandb, which TRL imports only if installed,
# and huggingface_hub 2's httpx2 are not needed there).
PACKAGES=(transformers tokenizers trl datasets dill multiprocess fsspec jsonschema jsonschema-specifications referencing
          rpds-py math-verify latex2sympy2_extended antlr4-python3-runtime lm_eval evaluate sqlitedict pytablewriter
          DataProperty mbstrdecoder pathvalidate tabledata tcolorpy typepy chardet rouge-score nltk word2number
          more-itertools pytz)
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
mkdir -p "$DIR"
for name in "${PACKAGES[@]}"; do
    pin=$(grep -i -E "^${name//[-_]/[-_]}==" requirements.lock) || { echo "$name is not in requirements.lock" >&2; exit 1; }
    if ! python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            "${PLATFORMS[@]}" -d "$DIR" "$pin" 2>/dev/null; then
        python3 -m pip wheel -q --no-deps -w "$DIR" "$pin"  # sdist only on PyPI: a pure-Python wheel built here
    fi
done
size=$(du -sm "$DIR" | cut -f1)
echo "$(ls "$DIR"/*.whl | wc -l) wheels, ${size} MiB in $DIR"
if (( size > 60 )); then echo "more than the 64 MiB a device call carries" >&2; exit 1; fi
