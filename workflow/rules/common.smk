# Helpers shared by the rules: how a stage runs, wildcard constraints, target lists.

import json
import shlex

from snakemake.settings.types import DeploymentMethod

# Every stage is `python -m klstudy <stage>`, with the klstudy source tree importable. Without
# --software-deployment-method conda, `python` is the interpreter running Snakemake (the project's
# environment from `make venv`), whether or not it is activated; with conda, it is the rule's
# envs/klstudy.yaml environment. PYTHONPATH is set inside the command because Snakemake clears the
# inherited one for conda jobs.
_SRC = shlex.quote(str(Path(workflow.basedir) / "src"))
_PYTHON_BIN = shlex.quote(str(Path(sys.executable).parent))
_USES_CONDA = DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method
shell.prefix(
    "set -euo pipefail; "
    f"export PYTHONPATH={_SRC}${{{{PYTHONPATH:+:$PYTHONPATH}}}}; "
    + ("" if _USES_CONDA else f'export PATH={_PYTHON_BIN}:"$PATH"; ')
)


wildcard_constraints:
    setting=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    dataset=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    model=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    study=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    kl=r"none|k[123]-(reward|loss|both)",
    beta=r"[0-9][0-9.e-]*",
    seed=r"[0-9]+",
    task=r"[A-Za-z0-9_]+",
    template=r"on|off",


def toy_outputs():
    """Everything the §3 analysis produces: Figure 1 and Table 1."""
    return [
        "figures/fig01_toy_bias_variance.png",
        "figures/fig01_toy_bias_variance.pdf",
        "figures/table1.md",
        "figures/table1.csv",
    ]


def input_outputs():
    """Every staged dataset and base model."""
    return expand("results/data/{dataset}.jsonl", dataset=config["data"]) + expand(
        "results/models/{model}", model=config["models"]
    )


# One directory per grid cell, readable by a person: results/runs/onpolicy/tiny/k1-reward/beta~0.1/seed~0/
RUN_PATH = "{study}/{model}/{kl}/beta~{beta}/seed~{seed}"
RUN_DIR = f"results/runs/{RUN_PATH}"


def data_file(name):
    return f"results/data/{name}.jsonl"


def study_cells(study):
    """Every (model, kl, beta, seed) of a study; the β = 0 baseline ("none") once per model and seed."""
    spec = config["studies"][study]
    cells = []
    for model in spec["models"]:
        for kl in spec["kl"]:
            for beta in [0] if kl == "none" else spec["betas"]:
                for seed in spec["seeds"]:
                    cells.append(dict(study=study, model=model, kl=kl, beta=beta, seed=seed))
    return cells


def cell_config(wildcards):
    """What `klstudy train --cell` gets: the cell's KL, β and seed, and its study's trainer settings."""
    spec = config["studies"][wildcards.study]
    return dict(kl=wildcards.kl, beta=float(wildcards.beta), seed=int(wildcards.seed), train=spec["train"],
                health=spec.get("health", {}))


def run_outputs():
    """summary.json of every cell of every study."""
    return [f"{RUN_DIR}/summary.json".format(**cell) for study in config["studies"] for cell in study_cells(study)]


def train_launcher(wildcards):
    """`python`, or `accelerate launch` with the study's multi-GPU config (FSDP / ZeRO-3) when it names one."""
    accelerate_config = config["studies"][wildcards.study]["train"].get("accelerate_config")
    if accelerate_config is None:
        return "python"
    return f"accelerate launch --config_file {shlex.quote(accelerate_config)}"


def evaluation_outputs():
    """Every evaluated study cell on every task, and every base model with (and, if asked, without) its template."""
    tasks = config["evaluation"]["tasks"]
    cells = [
        f"results/evals/{RUN_PATH}/{{task}}.json".format(task=task, **cell)
        for study in config["evaluation"]["studies"]
        for cell in study_cells(study)
        for task in tasks
    ]
    templates = ["on", "off"] if config["evaluation"]["base_without_chat_template"] else ["on"]
    bases = expand(
        "results/evals/base/{model}/template~{template}/{task}.json",
        model=sorted({m for s in config["evaluation"]["studies"] for m in config["studies"][s]["models"]}),
        template=templates,
        task=tasks,
    )
    return cells + bases
