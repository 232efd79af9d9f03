# Helpers shared by the rules: how a stage runs, wildcard constraints, target lists.

import json
import os
import re
import shlex
import shutil
import subprocess

from snakemake.io import is_flagged
from snakemake.settings.types import DeploymentMethod

from klstudy.kl import NAME_PATTERN
from klstudy.config import (
    AGGREGATED_TABLES,
    RUN_DIR,
    RUN_PATH,
    SLICE_ENDED,
    STUDY_TABLES,
    all_cells,
    cell_settings,
    training_settings,
    divergence_targets,
    evaluation_settings,
    evaluation_targets,
    figure_targets,
    train_gpus,
    training_processes,
)
from klstudy.figure_plan import CLAIMS_FIGURE, claims_figures, training_figures
from klstudy.run import adopt, devices, failures
from klstudy.run.estimate import gpu_resources
from klstudy.run.preflight import job_partition, runtime_cap

# Every stage is `python -m klstudy <stage>`, with the klstudy source tree importable. Without
# --software-deployment-method conda, `python` is the interpreter running Snakemake (the project's
# environment from `make venv`), whether or not it is activated; with conda, it is the rule's
# envs/klstudy.yaml environment. PYTHONPATH is set inside the command because Snakemake clears the
# inherited one for conda jobs.
_SRC = shlex.quote(str(Path(workflow.basedir) / "src"))
_PYTHON_BIN = shlex.quote(str(Path(sys.executable).parent))
_USES_CONDA = DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method
# In a SLURM job, vLLM's, triton's and inductor's caches go under the job's node-local scratch (SLURM_TMPDIR where the
# site sets it, else TMPDIR, else results/cache), not the home directory, which is often small on a cluster; a cache
# directory set beforehand is kept. Such a job reads only staged files (staging is a localrule, on the submit host), so
# it asks no hub, whoever submitted it: compute nodes often have no network, and a timeout there costs GPU hours.
_CACHES = (
    'if [ -n "${{SLURM_JOB_ID:-}}" ]; then _cache="${{SLURM_TMPDIR:-${{TMPDIR:-$PWD/results/cache}}}}/klstudy-cache"; '
    'export VLLM_CACHE_ROOT="${{VLLM_CACHE_ROOT:-$_cache/vllm}}"'
    ' TRITON_CACHE_DIR="${{TRITON_CACHE_DIR:-$_cache/triton}}"'
    ' TORCHINDUCTOR_CACHE_DIR="${{TORCHINDUCTOR_CACHE_DIR:-$_cache/inductor}}"'
    ' HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1; fi; '
)
shell.prefix(
    "set -euo pipefail; "
    f"export PYTHONPATH={_SRC}${{{{PYTHONPATH:+:$PYTHONPATH}}}}; "
    + ("" if _USES_CONDA else f'export PATH={_PYTHON_BIN}:"$PATH"; ')
    + _CACHES
)


# Snakemake removes a failed job's log before the next attempt, so a training job's output also goes to a history of
# every attempt (params.history, outside the declared files), each under a line that says which: its number (the
# headers before it + 1), the SLURM job id (or "local"), the host, the GPUs it sees and the time.
# The host is SLURM's name for the node, which a retry excludes after a node failure (failures.py reads the header).
HISTORY = f"logs/attempts/train/{RUN_PATH}.log"
ATTEMPT_HEADER = (
    'mkdir -p "$(dirname {params.history:q})"; '
    '_attempt=$(( $(grep -c "^=== attempt " {params.history:q} 2>/dev/null || true) + 1 )); '
    'echo "=== attempt $_attempt: job ${{SLURM_JOB_ID:-local}} on ${{SLURMD_NODENAME:-$(hostname)}},'
    ' GPUs ${{CUDA_VISIBLE_DEVICES:-none}}, $(date -Iseconds)" >> {params.history:q}; '
)
# A job whose trainer stopped on SLURM's warning before the time limit (train/slices.py) left the slice mark: the job
# goes back in the queue under its id (scontrol requeue) and SLURM ends this run of it; never a success here, since
# the outputs are missing. Outside SLURM (a test's injected warning) the next run of the workflow goes on.
REQUEUE_SLICE = (
    f"if [ -e {{params.checkpoints:q}}/{SLICE_ENDED} ]; then "
    'if [ -z "${{SLURM_JOB_ID:-}}" ]; then echo "slice: stopped before the time limit, no SLURM job to requeue:'
    ' run the workflow again" >&2; exit 75; fi; '
    'echo "slice: requeueing job $SLURM_JOB_ID"; scontrol requeue "$SLURM_JOB_ID" || exit 75; sleep 300; exit 75; fi'
)


# ---- Adoption (adopt.py, adopt.smk's rules): the jobs an earlier Snakemake of this directory left in the queue, {the
# plugin's comment (adopt.comment): job id}, asked of squeue once by the main Snakemake. Without an answer, a run that
# submits stops before its first job (the Snakefile's onstart: which executor runs is not known yet here), as it would
# run those jobs a second time; a dry run or one machine's run adopts nothing.
SQUEUE_FAILED = None


def left_jobs():
    global SQUEUE_FAILED
    if not (workflow.is_main_process and shutil.which("squeue")):
        return {}
    try:
        return adopt.left_jobs(Path.cwd())
    except (OSError, subprocess.CalledProcessError) as error:
        said = (getattr(error, "stderr", None) or str(error)).strip().splitlines() or [""]
        SQUEUE_FAILED = f"squeue did not answer ({said[-1]})"
        if workflow.global_resources["_nodes"].value is not None:  # --jobs: a cluster's run, or its dry run
            print(f"klstudy: {SQUEUE_FAILED}: no job left in the queue is adopted", file=sys.stderr)
        return {}


ADOPTED = left_jobs()


def only_adopted(rule):
    """adopted_<rule>'s input: none for a job of ``rule`` left in the queue, UNMADE for any other."""
    return lambda wildcards: [] if adopt.comment(rule, wildcards) in ADOPTED else [UNMADE]


def adopted_job(rule):
    """The SLURM job that adopted_<rule> waits for."""
    return lambda wildcards: Unrecorded(ADOPTED[adopt.comment(rule, wildcards)])


def updated(file):
    """An adopted rule's output: ``file``'s pattern, a directory where it is one, update(). A new string: flagging the
    rule's own would make its outputs update() too."""
    return update(directory(str(file)) if is_flagged(file, "directory") else str(file))


# Waits while the job is in the queue (a requeued slice pends, then runs again under its id), polling squeue as the
# SLURM plugin itself does; an squeue that fails is asked again (adopt.left_queue).
ADOPTED_WAIT = (
    '{{ echo "adopted: waiting for job {params.job} ({wildcards})"; python -m klstudy.run.adopt {params.job}; }}'
    " > {log} 2>&1"
)
# ---- end of adoption


# An adopted job's (adopt.smk) and refused_train_rl's input for a job that is not theirs: a file that nothing makes, so
# that Snakemake passes the rule over (a missing input) for the next that makes the job's files, and at last the rule's.
UNMADE = ".snakemake/klstudy: a file that nothing makes"


# A retry within a run after a deterministic failure, or once the cell has had cluster.max_attempts jobs (failures.py),
# says why and exits at once: Snakemake retries by count alone, so it is submitted, as the smallest job
# (_training_retries). Before a run, such a cell is not submitted at all (train.smk's refused_train_rl).
LAST_FAILURE = (  # why a cell is refused (failures.py); refused_train_rl's shell too
    f"python -m klstudy last-failure --history {{params.history:q}} --max-attempts {config['cluster']['max_attempts']}"
)
REFUSED_RETRY = f"if [ {{resources.retry_refused}} = 1 ]; then {LAST_FAILURE} >&2; exit 1; fi; "


wildcard_constraints:
    setting=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    dataset=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    model=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    study=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    kl=NAME_PATTERN,
    beta=r"[0-9][0-9.e-]*",
    seed=r"[0-9]+",
    task=r"[A-Za-z0-9_]+",
    figure=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    template=r"on|off",


def toy_outputs():
    """Everything the §3 analysis produces: Figure 1 and Table 1, where each configuration's training ends, and the
    atlas (the frameworks' setups, advantage normalisation, effective β, length)."""
    return [
        "figures/fig01_toy_bias_variance.png",
        "figures/fig01_toy_bias_variance.pdf",
        "figures/toy_fixed_points.png",
        "figures/toy_claims.csv",
        "figures/atlas.png",
        "figures/atlas_grid.png",
        "figures/atlas_length.png",
        "figures/atlas.csv",
    ]


def input_outputs():
    """Every staged dataset and base model."""
    return expand("results/data/{dataset}.jsonl", dataset=config["data"]) + expand(
        "results/models/{model}", model=config["models"]
    )


def data_file(name):
    return f"results/data/{name}.jsonl"


class Unrecorded:
    """A param that Snakemake passes to the job but does not record, so that changing it reruns nothing: its params
    trigger compares only params of Python's builtin types (persistence's _params drops the others as
    unrepresentable). For what a job needs but its outputs do not depend on: paths, the launcher line, operational
    settings. The training cells' params trigger is tested by dry runs (tests/test_reruns.py)."""

    def __init__(self, text: str):
        self.text = text

    def __str__(self):
        return self.text


CELL_WILDCARDS = ("study", "model", "kl", "beta", "seed")  # RUN_PATH's


def unrecorded_path(pattern: str):
    """A param of a cell's path (``pattern`` with its wildcards filled in), not recorded (Unrecorded)."""
    return lambda wildcards: Unrecorded(pattern.format(**{key: wildcards[key] for key in CELL_WILDCARDS}))


def recorded_settings(settings: dict) -> str:
    """A staging job's settings as Snakemake records them: without ``local_dir``, a path on this machine (a copy
    moved elsewhere is the same data; a pinned model's sha256 says which build it is)."""
    return json.dumps({key: value for key, value in settings.items() if key != "local_dir"})


def cell_config(wildcards):
    """What `klstudy train --settings` gets (config.cell_settings)."""
    return cell_settings(config, **{key: wildcards[key] for key in CELL_WILDCARDS})


def training_param(wildcards):
    """The one param Snakemake records for a cell (train.smk): what it trains."""
    return json.dumps(training_settings(cell_config(wildcards)), sort_keys=True)


def run_outputs():
    """summary.json of every cell of every study."""
    return [f"{RUN_DIR}/summary.json".format(**cell) for cell in all_cells(config)]


def retry_runtime(stage):
    """runtime × attempt, capped: a retry asks for at most cluster.max_runtime, or else the smaller of the partition's
    MaxTime and the QOS's MaxWall (read with sinfo and sacctmgr only when a retry is submitted), since a longer ask
    is refused or pends for ever. With neither limit, runtime × attempt. A training job asks its runtime every time:
    it runs in slices of that length (slices.py) and resumes from its checkpoint."""
    first = config["resources"][stage]["runtime"]

    def runtime(wildcards, attempt):
        if attempt == 1 or stage == "train":
            return first  # the preflight checks that it fits
        cluster = config["cluster"]
        cap = cluster["max_runtime"] or runtime_cap(job_partition(config, stage), cluster["qos"])
        return first * attempt if cap is None else min(first * attempt, max(cap, first))

    return runtime


# On a cluster a training cell may be killed more than once (its time limit, a preempted or lost node) and resumes from
# its checkpoint each time: it is retried this often (the Snakefile's onstart, once the executor is known), other jobs
# as --retries says (the profile's 1). Locally, as --retries says (none by default).
CLUSTER_TRAIN_RETRIES = 3


def _study_gpus(wildcards, attempt=1):
    """GPUs per node of a training job: its study's (studies.<study>.gpus, else resources.train.gpus)."""
    return train_gpus(config, wildcards.study)


def _train_gpu_resource(key):
    """A training job's GPU request (gres or slurm_extra) for its study's GPUs."""
    return lambda wildcards, attempt=1: gpu_resources(_study_gpus(wildcards), config["cluster"])[key]


def _history(wildcards):
    return HISTORY.format(**{key: wildcards[key] for key in CELL_WILDCARDS})


def _refused(wildcards, attempt):
    """Whether a training cell's job is refused: the cell has had cluster.max_attempts SLURM jobs, counted in its history
    whichever driver submitted them, or its last attempt failed deterministically (failures.py), on the cluster or, on
    a retry, in this run (one machine's runs start again)."""
    history = _history(wildcards)
    failure = failures.previous_failure(history)
    deterministic = failure and failure.kind == "deterministic" and (attempt > 1 or failure.job != "local")
    return bool(deterministic) or failures.jobs(history) >= config["cluster"]["max_attempts"]


def only_refused(wildcards):
    """refused_train_rl's input: none for a cell refused before its first job, UNMADE for any other."""
    return [] if _refused(wildcards, 1) else [UNMADE]


def _unless_refused(value, refused_value):
    """A training job's resource: ``refused_value`` for a refused retry (None drops it), else ``value``."""

    def resource(wildcards, attempt):
        if _refused(wildcards, attempt):
            return refused_value
        return value(wildcards, attempt) if callable(value) else value

    return resource


def _training_retries(resources):
    """A training job's resources: SLURM's warning before its time limit (slices.py, sent to the job's steps, not
    the plugin's batch shell) and its log appended to, not replaced, when the job requeues itself (the plugin's
    <rule>/<cell>/%j.log keeps its name); on a retry after a node failure, that node excluded (sbatch --exclude); and
    `retry_refused`, which its shell reads (REFUSED_RETRY). A refused retry is the smallest job: one CPU, 1 GB, five
    minutes, no GPU, the CPU partition (or the cluster's default); its account and QOS are kept."""
    extra = resources.get("slurm_extra", "")
    warning = f"--signal=USR1@{60 * config['cluster']['save_before_limit_minutes']} --open-mode=append"

    def excluding(wildcards, attempt):
        hours = config["cluster"]["exclude_node_hours"]
        nodes = failures.failed_nodes(_history(wildcards), hours) if attempt > 1 else []
        exclude = nodes and f"--exclude={','.join(nodes)}"
        gpus = extra(wildcards) if callable(extra) else extra  # --gpus-per-node, with cluster.gpu_request
        return " ".join(filter(None, [gpus, warning, exclude]))

    smallest = dict(runtime=5, mem_mb=1000, cpus_per_task=1, nodes=1, slurm_partition=config["cluster"]["cpu_partition"],
                    retry_refused=1, training_slots=1, **{key: resources.get(key) for key in ("slurm_account", "qos")})
    ask = {**resources, "slurm_extra": excluding, "retry_refused": 0}
    return {key: _unless_refused(value, smallest.get(key)) for key, value in ask.items()}


def job_resources(stage):
    """The scheduler resources of a kind of job (config `resources` and `cluster`).

    GPUs are asked per node (`gres: gpu[:MODEL]:N`, or --gpus-per-node with cluster.gpu_request, with `nodes`), never
    as the plugin's `gpu`, which becomes --gpus, GPUs for the whole job. `local_gpus` is what one machine's `klstudy
    drive --gpus` counts (no scheduler)."""
    spec = config["resources"][stage]
    cluster = config["cluster"]
    resources = dict(runtime=retry_runtime(stage), mem_mb=spec["mem_mb"], cpus_per_task=spec["cpus"])
    if cluster["account"]:
        resources["slurm_account"] = cluster["account"]
    if job_partition(config, stage):
        resources["slurm_partition"] = job_partition(config, stage)
    if cluster["qos"]:
        resources["qos"] = cluster["qos"]
    if stage == "train":
        resources["training_slots"] = 1  # the global limit is cluster.training_slots (Snakefile)
    if stage in ("evaluate", "divergence"):
        resources["evaluation_slots"] = 1  # the global limit is cluster.evaluation_slots (Snakefile)
    if spec["gpus"]:
        per_node, local_gpus = gpu_resources(spec["gpus"], cluster), spec["gpus"]
        if stage == "train":  # a study may train on its own number of GPUs (studies.<study>.gpus)
            per_node, local_gpus = {key: _train_gpu_resource(key) for key in per_node}, _study_gpus
        resources.update(**per_node, nodes=spec["nodes"], local_gpus=local_gpus, cpus_per_gpu=0, tasks_per_gpu=0)
        if cluster["constraint"]:
            resources["constraint"] = cluster["constraint"]
    if spec["nodes"] > 1:
        # One task per node, each running `accelerate launch` for that node's GPUs.
        resources.update(nodes=spec["nodes"], tasks=spec["nodes"], mpi="srun")
    return _training_retries(resources) if stage == "train" else resources


def threads_of(stage):
    return config["resources"][stage]["cpus"]


def stage_python(uses_vllm):
    """`python` (the environment that runs Snakemake, or the rule's conda env), or for a job that runs vLLM the
    vLLM environment's interpreter (config `vllm_python`, from `make vllm-env`): vLLM pins its own torch."""
    if not uses_vllm:
        return "python"
    return shlex.quote(str(Path(workflow.basedir) / config["vllm_python"]))


def job_python(stage, uses_vllm=False, gpus=None):
    """The interpreter of a stage's job (stage_python); under `klstudy drive --gpus` (one machine, no scheduler), a
    GPU job on one node first claims GPUs of its own, `gpus` or the stage's (klstudy.run.devices)."""
    python = stage_python(uses_vllm)
    spec = config["resources"][stage]
    if not spec["gpus"] or spec["nodes"] > 1 or not os.environ.get(devices.GPUS_ENV):
        return python
    return f"{python} -m klstudy.run.devices --count {gpus or spec['gpus']} -- {python}"


def evaluate_python(wildcards):
    return job_python("evaluate", config["evaluation"]["backend"] == "vllm")


# Evaluation jobs (config evaluation.jobs): one per (model, task), or with per_model one per model for every task.
EVAL_PER_MODEL = config["evaluation"]["jobs"] == "per_model"


def evaluation_files(directory, suffix):
    """An evaluation job's outputs in a model's `directory`: the {task} wildcard's file, or every task's file."""
    pattern = f"{directory}/{{task}}{suffix}"
    return expand(pattern, task=config["evaluation"]["tasks"], allow_missing=True) if EVAL_PER_MODEL else pattern


def evaluation_job(path):
    """The name of an evaluation job's log or benchmark: per model, `path`; per task, the task's name under it."""
    return path if EVAL_PER_MODEL else f"{path}/{{task}}"


def evaluated_tasks(wildcards):
    return config["evaluation"]["tasks"] if EVAL_PER_MODEL else [wildcards.task]


def evaluated_data(wildcards):
    return [data_file(task) for task in evaluated_tasks(wildcards)]


def train_launcher(wildcards):
    """The cell's interpreter (stage_python), or `accelerate launch` under it with the study's multi-GPU config
    (FSDP / ZeRO-3) when it names one; on several nodes, one launch per node through srun, rendezvous at the
    first node."""
    train = config["studies"][wildcards.study]["train"]
    python = job_python("train", train["generation"] == "vllm", _study_gpus(wildcards))
    if train.get("accelerate_config") is None:
        return python
    launch_config = Path(workflow.basedir) / train["accelerate_config"]  # relative to the repository, as validated
    # --num_processes: the config's GPUs per node × its nodes (accelerate reads it as the total over the nodes),
    # which the job's gres (or `klstudy drive --gpus`) gives it exactly.
    launch = (
        f"{python} -m accelerate.commands.launch --config_file {shlex.quote(str(launch_config))}"
        f" --num_processes {training_processes(config, wildcards.study)}"
    )
    nodes = config["resources"]["train"]["nodes"]
    if nodes == 1:  # a free port of its own (accelerate's choice): cells on one machine must not share 29500
        return f"{launch} --main_process_port 0"
    # bash -c '... "$@"' launcher <the rest of the command>: each node's shell fills in its own rank. The SLURM job
    # step drops the job's SLURM_* variables before it runs this, so srun is told the CPUs of each task itself (it
    # would give one), to end every node's launch when one fails, and to hand on the environment.
    # The nested step's processes start with SLURM's warning (slices.py) not ignored: the node's shell ignores it
    # before it starts the launcher, which inherits that; the trainer catches it.
    script = (
        f"trap '' USR1; {launch} --num_machines $SLURM_NNODES --machine_rank $SLURM_NODEID --main_process_port 29500"
        ' --main_process_ip $(scontrol show hostnames $SLURM_JOB_NODELIST | head -n 1) "$@"'
    )
    cpus = config["resources"]["train"]["cpus"]
    return (
        f"srun --nodes {nodes} --ntasks-per-node 1 --cpus-per-task {cpus} --kill-on-bad-exit=1 --export=ALL"
        f" bash -c {shlex.quote(script)} launcher"
    )


def evaluation_outputs():
    return evaluation_targets(config)


def divergence_outputs():
    return divergence_targets(config)


def figure_outputs():
    return figure_targets(config)


# train_rl's shell (train.smk): composed here, where the pieces are, so that the rule names one string.
TRAIN_SHELL = "".join(
    [
        REFUSED_RETRY,
        ATTEMPT_HEADER,
        "{{ {params.launcher} -m klstudy train --settings {params.settings:q} --model {input.model}",
        " --train-data {input.train_data} --heldout-data {input.heldout_data} --out {params.out}",
        " --checkpoints {params.checkpoints} --threads {threads}; ",
        REQUEUE_SLICE,
        "; }} 2>&1 | tee -a {params.history:q} > {log}",
    ]
)
