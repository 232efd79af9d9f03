#!/usr/bin/env bash
# One GPU session's checks in one call, in order of value, each writing its results to OUT_DIR as it finishes, each
# under a time limit so that a slow part cannot starve the next (docs/paper-scale.md, "Running at paper scale"):
#   1. the GPU suite (`make test-gpu`: tests/test_gpu.py)  -> suite.log, suite.json
#   2. time and peak memory of training steps by phase at the paper's settings (benchmarks/step_phases.py), for each
#      shape in PHASE_SHAPES (empty: none)                 -> phases-SHAPE.json, phases-SHAPE.log
# plus nvidia-smi's view of the GPU (gpu.txt).
#
#   benchmarks/gpu-session.sh OUT_DIR
#
# On a GPU machine with CUDA torch, transformers, accelerate and peft but no package registry, carry the other
# dependencies as wheels made here by `envs/gpu-wheels.sh .whl`: the script installs WHEELS (default .whl) when that
# folder exists. Rehearse it on a CPU (what CI cannot: the order, the limits, the files it leaves):
#   KLSTUDY_GPU_SUITE_ON_CPU=1 GPU_PYTHON=.venv/bin/python WHEELS= PHASE_SHAPES=tiny \
#     PHASE_ARGS="--prompts 2 --response-tokens 32" benchmarks/gpu-session.sh /tmp/gpu-session
case "${1:-}" in -h | --help) sed -n '2,/^set -/{/^set -/!s/^# \{0,1\}//p}' "$0"; exit 0 ;; esac
set -uo pipefail
OUT=${1:?usage: benchmarks/gpu-session.sh OUT_DIR}
mkdir -p "$OUT"
PYTHON=${GPU_PYTHON:-python3}
WHEELS=${WHEELS-.whl}
PHASE_SHAPES=${PHASE_SHAPES-qwen2.5-0.5b qwen3-4b}  # empty: the suite alone
# Seconds for each part: the suite, then each shape's benchmark (a shape not named here gets the last).
SUITE_SECONDS=${SUITE_SECONDS:-280}
read -r -a PHASE_SECONDS <<< "${PHASE_SECONDS:-100 180}"

if [ -n "$WHEELS" ] && [ -d "$WHEELS" ]; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$WHEELS"/*.whl \
        || { echo "installing the wheels in $WHEELS failed" >&2; exit 1; }
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1 || echo "no nvidia-smi" > "$OUT/gpu.txt"

started=$(date +%s)
export KLSTUDY_GPU_SUITE_REPORT="$OUT/suite.json"
# The suite's own temporary folder, removed after it: its FSDP checkpoints (float32 weights and Adam's state, several
# per cell) fill tens of GiB, which a node's local disk may not hold beside the next part's 7B stand-in.
SUITE_TMP=$(mktemp -d)
export PYTEST_ADDOPTS="--basetemp=$SUITE_TMP${PYTEST_ADDOPTS:+ $PYTEST_ADDOPTS}"
if command -v make > /dev/null; then
    timeout "$SUITE_SECONDS" make test-gpu GPU_PYTHON="$PYTHON" > "$OUT/suite.log" 2>&1
else  # the Makefile's recipe
    timeout "$SUITE_SECONDS" "$PYTHON" -m pytest -m gpu -s tests/test_gpu.py > "$OUT/suite.log" 2>&1
fi
echo "GPU suite: exit $? after $(( $(date +%s) - started )) s ($(tail -n 1 "$OUT/suite.log"))"
rm -rf "$SUITE_TMP"
unset PYTEST_ADDOPTS

index=0
for shape in $PHASE_SHAPES; do
    seconds=${PHASE_SECONDS[$index]:-${PHASE_SECONDS[-1]}}
    index=$((index + 1))
    started=$(date +%s)
    # shellcheck disable=SC2086  # PHASE_ARGS holds several arguments
    timeout "$seconds" "$PYTHON" benchmarks/step_phases.py --shape "$shape" ${PHASE_ARGS:-} \
        --out "$OUT/phases-$shape.json" > "$OUT/phases-$shape.log" 2>&1
    echo "step phases, $shape: exit $? after $(( $(date +%s) - started )) s"
done
