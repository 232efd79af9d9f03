"""The Snakemake workflow: its DAG, a reduced end-to-end run of every stage, and the report."""

import json
import os
import re
import shlex
import subprocess
import sys

import pandas as pd
import pytest
import yaml
from snakemake.utils import update_config
from workflow_helpers import ROOT, expected_jobs, forest_metrics, job_counts, snakemake

from klstudy.claims_rule import VERDICTS
from klstudy.train import models

pytestmark = pytest.mark.workflow  # the end-to-end workflow tier: `make test-workflow` (docs/testing.md)


def test_dry_run_job_counts_match_the_grid(tmp_path):
    """config.yaml's; config/paper.yaml's is the documented dry run (test_docs.py, the documentation tier)."""
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    counts = job_counts(snakemake("-n", "--cores", "1", "--configfile", str(ROOT / "config.yaml"), cwd=tmp_path))
    assert counts == expected_jobs(config)


def test_the_separation_overlay_merges_into_the_default(tmp_path):
    """config/separation.yaml holds only what differs from config.yaml: Snakemake merges it in (mappings key by key,
    lists replaced), and `klstudy status` merges it the same way, so both see the same grid."""
    overlay = [str(ROOT / "config.yaml"), str(ROOT / "config/separation.yaml")]
    merged = yaml.safe_load((ROOT / "config.yaml").read_text())
    update_config(merged, yaml.safe_load((ROOT / "config/separation.yaml").read_text()))
    counts = job_counts(snakemake("-n", "--cores", "1", "--configfile", *overlay, cwd=tmp_path))
    assert counts == expected_jobs(merged)
    # on-policy: no KL and six penalties at three β, four seeds; bridge: no KL and three at two β, seeds 4-7; then 18
    assert counts["train_rl"] == (1 + 6 * 3) * 4 + (1 + 3 * 2) * 4 + 18
    assert merged["studies"]["bridge"]["seeds"] == [4, 5, 6, 7]  # seeds the runs that suggested its claims did not see
    onpolicy = merged["studies"]["onpolicy"]["train"]
    assert onpolicy["batch_prompts"] == onpolicy["minibatch_prompts"] == 16  # one update a batch: still on-policy
    assert onpolicy["learning_rate"] == 1e-4 and onpolicy["steps"] == 15  # the rest of config.yaml's settings
    assert merged["studies"]["offpolicy_k1_loss"]["train"]["batch_prompts"] == 8  # other studies untouched
    assert merged["claims"]["k1_reward_falls_with_beta"]["beta"] == "trend"
    assert merged["claims"]["k1_reward_falls_with_beta"]["candidate"] == "k1-reward"  # kept from config.yaml
    command = [sys.executable, "-m", "klstudy", "status", "--format", "csv", "--root", str(tmp_path), "--config"]
    listed = subprocess.run(command + overlay, capture_output=True, text=True, check=True).stdout
    assert sum(line.startswith("cell,onpolicy/") for line in listed.splitlines()) == (1 + 6 * 3) * 4


def test_paper_grid_sizes():
    """The paper's grid, by hand: 2 models × (4 configs × 4 β + β = 0) × 3 seeds on-policy; (4 + 4) × 3 off-policy;
    (4 + 1) × 3 and (4 + 1) × 1 asynchronous; 4 × 3 unbiased."""
    counts = expected_jobs(yaml.safe_load((ROOT / "config/paper.yaml").read_text()))
    assert counts["train_rl"] == 102 + 12 + 12 + 15 + 5 + 12
    assert counts["evaluate_cell"] == (48 + 6 + 12) * 5 and counts["evaluate_base"] == 2 * 2 * 5
    assert counts["figure"] == 12  # figures 2-12 and the regularisation figure


def test_one_cell_is_one_target(tmp_path):
    """Rerunning one cell: name its summary.json (the command in docs/running.md); only its own jobs run."""
    cell = "results/runs/onpolicy/qwen2.5-7b/k1-reward/beta~0.1/seed~2/summary.json"
    out = snakemake(cell, "-n", "--cores", "1", "--configfile", str(ROOT / "config/paper.yaml"), cwd=tmp_path)
    counts = job_counts(out)
    assert counts["train_rl"] == 1 and "evaluate_cell" not in counts
    assert "beta~0.1/seed~2" in out


def test_the_default_base_model_is_staged_from_its_pinned_copy(tmp_path):
    """config.yaml's base_model job, run from another directory as a user's would be: the repository's pinned copy,
    checked against the warm-start data the job stages, with the digest config.yaml names; no warm start runs."""
    snakemake("results/models/tiny", "--cores", "2", "--configfile", str(ROOT / "config.yaml"), cwd=tmp_path)
    pinned = yaml.safe_load((ROOT / "config.yaml").read_text())["models"]["tiny"]["pinned"]
    assert models.base_model_digest(tmp_path / "results/models/tiny") == pinned["sha256"]
    assert models.weights_digest(tmp_path / "results/models/tiny") == pinned["sha256"]
    log = (tmp_path / "logs/models/tiny.log").read_text()
    assert f"pinned copy of {ROOT / pinned['path']}" in log and "warm start step" not in log


# Cells of config/paper.yaml whose jobs' commands three tests read, from one dry run (building the paper's DAG is slow).
PAPER_TARGETS = {
    "async_math eval": "results/evals/async_math/qwen2.5-7b/k1-reward/beta~0.005/seed~0/math500.json",
    "onpolicy eval": "results/evals/onpolicy/qwen2.5-7b/k1-reward/beta~0.1/seed~0/math500.json",
    "base eval": "results/evals/base/qwen2.5-7b/template~on/math500.json",
    "async_countdown train": "results/runs/async_countdown/qwen3-4b-instruct-2507/k1-reward/beta~0.005/seed~0/"
    "summary.json",
    "async_math train": "results/runs/async_math/qwen2.5-7b/k1-reward/beta~0.005/seed~0/summary.json",
    "onpolicy train": "results/runs/onpolicy/qwen2.5-7b/k1-reward/beta~0.1/seed~0/summary.json",
}


@pytest.fixture(scope="module")
def paper_commands(tmp_path_factory) -> dict[str, str]:
    """The shell command of each PAPER_TARGETS job, by its name there."""
    out = snakemake(*PAPER_TARGETS.values(), "-n", "-p", "--cores", "1", "--configfile",
                    str(ROOT / "config/paper.yaml"), cwd=tmp_path_factory.mktemp("paper"))  # fmt: skip
    commands = [line for line in out.splitlines() if "-m klstudy evaluate" in line or "-m klstudy train" in line]
    found = {}
    for name, target in PAPER_TARGETS.items():
        study_or_base = target.split("/")[2]
        verb = "evaluate" if name.endswith("eval") else "train"
        found[name] = next(c for c in commands if f"-m klstudy {verb}" in c and f"/{study_or_base}/" in c)
    return found


def test_each_studys_cells_are_evaluated_at_its_own_length(paper_commands):
    """config/paper.yaml: the asynchronous cells' answers may be as long as they trained (4096 tokens), the on-policy
    cells' and the base models' 2048 (evaluation.study_max_tokens); vLLM's engine length is left to the job, which
    measures its prompts."""
    lengths = {}
    for name in ("async_math eval", "onpolicy eval", "base eval"):
        settings = json.loads(shlex.split(paper_commands[name].split("--settings ", 1)[1])[0])
        lengths[name] = (settings["max_tokens"], settings["vllm"]["max_model_len"])
    assert lengths == {"async_math eval": (4096, None), "onpolicy eval": (2048, None), "base eval": (2048, None)}


def test_a_study_trains_on_its_own_number_of_gpus(paper_commands):
    """config/paper.yaml: the Countdown cells launch 4 processes (studies.async_countdown.gpus), the others
    resources.train's 8; under SLURM no GPU allocator wraps them (gres gives each job its own)."""
    countdown, math_cell = paper_commands["async_countdown train"], paper_commands["async_math train"]
    assert "--num_processes 4 " in countdown and "--num_processes 8 " in math_cell
    assert "devices --count" not in countdown + math_cell


def test_jobs_that_run_vllm_use_the_vllm_environment(paper_commands, tmp_path):
    """At paper scale, generation in training and evaluation run vLLM: those jobs use the interpreter of the vLLM
    environment (`make vllm-env`), under `accelerate launch` for training; the embedded study runs neither."""
    vllm_python = str(ROOT / ".venv-vllm/bin/python")
    # The launch config is the repository's (as validated), whatever directory the workflow runs in.
    launch_config = ROOT / "config/accelerate/fsdp.yaml"
    # Each launch on one node at a port of its own; no GPU claim outside `klstudy drive --gpus`.
    launch = f"{vllm_python} -m accelerate.commands.launch --config_file {launch_config} --num_processes 8"
    assert f"{launch} --main_process_port 0 -m klstudy train" in paper_commands["onpolicy train"]
    assert f"{vllm_python} -m klstudy evaluate" in paper_commands["onpolicy eval"]
    targets = [
        "results/runs/onpolicy/tiny/k1-reward/beta~0.1/seed~0/summary.json",
        "results/evals/onpolicy/tiny/k1-reward/beta~0.1/seed~0/math500.json",
    ]
    out = snakemake(*targets, "-n", "-p", "--cores", "1", "--configfile", str(ROOT / "config.yaml"), cwd=tmp_path)
    assert vllm_python not in out and "python -m klstudy train" in out and "python -m klstudy evaluate" in out


@pytest.fixture(scope="module")
def two_node_job(tmp_path_factory) -> tuple[list[str], dict, str]:
    """A paper training job with resources.train.nodes = 2, H100s and a QOS: the words of its sbatch line, its
    resources and its dry run (one dry run for the three tests that read them)."""
    return training_sbatch(tmp_path_factory.mktemp("two_nodes"), nodes=2, gpu_model="h100", qos="long")


def test_a_training_job_on_two_nodes_starts_a_process_per_gpu_of_both(two_node_job):
    """resources.train.nodes = 2: one `accelerate launch` per node through srun, 16 processes in all (accelerate's
    --num_processes is the total over the nodes; the launch config's 8 would leave half the GPUs idle)."""
    out = two_node_job[2]
    assert "srun --nodes 2 --ntasks-per-node 1" in out
    assert "--num_processes 16 --num_machines $SLURM_NNODES" in out  # 2 nodes × 8 GPUs
    # The command as the job's shell reads it: srun with the CPUs of each task (the job step drops SLURM_* variables,
    # so srun would give one), then one bash -c word that holds the whole launch, paths quoted inside it.
    command = shlex.split(next(line for line in out.splitlines() if "srun --nodes" in line).strip())
    at = command.index("srun")
    assert command[at : at + 12] == [
        "srun", "--nodes", "2", "--ntasks-per-node", "1", "--cpus-per-task", "64", "--kill-on-bad-exit=1",
        "--export=ALL", "bash", "-c", command[at + 11],
    ], command  # fmt: skip
    assert command[at + 12 : at + 15] == ["launcher", "-m", "klstudy"], command
    script = shlex.split(command[at + 11])
    assert script[script.index("--config_file") + 1] == str(ROOT / "config/accelerate/fsdp.yaml"), script
    assert script[-1] == "$@" and "--machine_rank" in script, script


def test_lint_is_clean():
    out = snakemake("--lint", "--cores", "1")
    assert "Lints for" not in out, out


def test_end_to_end_outputs(reduced_run):
    workdir, config = reduced_run
    for name in ("fig01_toy_bias_variance", "fig_curves", "fig_bars", "fig_divergence", "training_onpolicy"):
        for ext in ("png", "pdf"):
            assert (workdir / "figures" / f"{name}.{ext}").stat().st_size > 0, name
    # One seed: no claim is testable, so no claims forest (it would draw untestable points); README.md says so.
    assert not list((workdir / "figures").glob("claims_forest*")) and not forest_metrics(config)
    readme = (workdir / "figures" / "README.md").read_text()
    assert "Pipeline checks (drawn by every run; nothing in them is testable" in readme
    for name in ("table1", "table2", "evaluation_differences", "evaluations"):
        assert (workdir / "figures" / f"{name}.md").stat().st_size > 0, name
    table = pd.read_csv(workdir / "figures" / "table1.csv")
    estimators, gradients = len(config["toy"]["estimators"]), len(config["toy"]["loss_gradients"])
    assert len(table) == 3 * estimators + estimators * gradients  # × reward/loss/both, then × the loss gradients
    assert set(table.unbiased_gradient) <= {"yes", "no"}
    assert table.set_index("config").exact_unbiased.to_dict() == {  # T = 2 and 6, enumerated exactly
        name: "yes" if name in ("k1-reward", "k1-both", "k3-both") else "no" for name in table.config
    }
    behaviour = table.set_index("config").behaviour
    assert behaviour["k1-reward"].split(" (")[0] in {"stable", "instabilities", "collapse"}
    assert behaviour["k3-loss"] == "not trained"
    assert (workdir / "figures" / "regularisation.md").stat().st_size > 0
    # The claims table, from the run's own files: RL against the base model paired by question (the runs log each
    # question's score), K1 in the reward against no KL paired by seed.
    claims = pd.read_csv(workdir / "figures" / "claims.csv").set_index("claim")
    assert sorted(claims.index) == sorted(config["claims"])
    assert set(claims.verdict) <= set(VERDICTS)
    assert claims.loc["rl_beats_base", "units"] == config["data"]["math_test"]["size"]  # questions
    assert claims.loc["k1_reward_regularises", "runs"] == 2 and claims.loc["k1_reward_regularises", "seeds"] == 1
    results = pd.read_csv(workdir / "results" / "toy" / "apart.csv")
    assert sorted(results["T"].unique()) == [2, 6]
    assert (results.trials == 30).all() and (results.sequences == 100).all()
    for setting in config["toy"]["settings"]:
        assert (workdir / "logs" / "toy" / f"{setting}.log").exists()
        assert (workdir / "results" / "benchmarks" / "toy" / f"{setting}.tsv").exists()


def test_every_cell_trained_and_recorded(reduced_run):
    workdir, config = reduced_run
    runs = sorted((workdir / "results" / "runs").glob("*/*/*/*/*/summary.json"))
    assert [str(p.relative_to(workdir / "results" / "runs").parent) for p in runs] == [
        "offpolicy_k1_loss/tiny/k1-loss/beta~0.1/seed~0",
        "onpolicy/tiny/k1-reward/beta~0.1/seed~0",
        "onpolicy/tiny/none/beta~0/seed~0",
    ]
    for summary_path in runs:
        summary = json.loads(summary_path.read_text())
        assert summary["status"] == "ok" and summary["steps_done"] == 2
        cell = summary_path.parent
        metrics = [row["step"] for row in map(json.loads, (cell / "metrics.jsonl").read_text().splitlines())]
        off_policy = "offpolicy" in str(cell)
        assert metrics == ([1, 1, 2, 2] if off_policy else [1, 2])  # off-policy: 2 optimiser steps per batch
        assert [row["step"] for row in map(json.loads, (cell / "heldout.jsonl").read_text().splitlines())] == [0, 1, 2]
        assert (cell / "final" / "model.safetensors").is_file()
        snapshots = sorted(p.name for p in (cell / "snapshots").iterdir() if p.name != ".snakemake_timestamp")
        assert snapshots == (["step~1", "step~2"] if off_policy else [])
    for name in config["data"]:
        assert (workdir / "results" / "data" / f"{name}.jsonl").stat().st_size > 0
    base = workdir / "results" / "models" / "tiny"
    assert (base / "klstudy_build.json").is_file()
    # the stage records its base model's digest, every run names it, and the claims table's caption and column too
    digest = json.loads((base / models.WEIGHTS_RECORD).read_text())["sha256"]
    assert digest == models.weights_digest(base)
    assert {json.loads(path.read_text())["base_model_sha256"] for path in runs} == {digest}
    assert f"tiny {digest[:12]}." in (workdir / "figures" / "claims.md").read_text()
    assert set(pd.read_csv(workdir / "figures" / "claims.csv", dtype={"base_model": str}).base_model) == {digest[:12]}


def test_every_cell_and_base_model_evaluated(reduced_run):
    workdir, _ = reduced_run
    evals = sorted(
        str(p.relative_to(workdir / "results" / "evals")) for p in (workdir / "results" / "evals").rglob("*.json")
    )
    assert evals == [
        "base/tiny/template~off/math500.json",
        "base/tiny/template~off/mmlu_college_biology.json",
        "base/tiny/template~on/math500.json",
        "base/tiny/template~on/mmlu_college_biology.json",
        "onpolicy/tiny/k1-reward/beta~0.1/seed~0/math500.json",
        "onpolicy/tiny/k1-reward/beta~0.1/seed~0/mmlu_college_biology.json",
        "onpolicy/tiny/none/beta~0/seed~0/math500.json",
        "onpolicy/tiny/none/beta~0/seed~0/mmlu_college_biology.json",
    ]
    tables = workdir / "results" / "tables"
    cells = pd.read_csv(tables / "cells.csv")
    assert len(cells) == 3 and set(cells.status) == {"ok"}
    assert len(pd.read_csv(tables / "evaluations.csv")) == (2 + 2) * 2  # (2 cells + base on/off) × 2 tasks
    divergence = pd.read_csv(tables / "divergence.csv")
    assert list(divergence.step) == [0, 1, 2] and divergence.forward_kl.iloc[0] == 0
    assert (divergence.forward_kl.iloc[1:] > 0).all() and (divergence.entropy > 0).all()
    row = json.loads((workdir / "results/evals/onpolicy/tiny/none/beta~0/seed~0/math500.json").read_text())
    assert row["k"] == 2 and row["cell_status"] == "ok" and 0 <= row["mean_at_k"] <= 1
    samples = (workdir / "results/evals/onpolicy/tiny/none/beta~0/seed~0/math500.samples.jsonl").read_text()
    assert len(samples.splitlines()) == 3


def test_report_contains_figure_table_captions_and_config(reduced_run):
    workdir, _ = reduced_run
    html = (workdir / "report.html").read_text()
    assert "fig01_toy_bias_variance.png" in html and "table1.csv" in html
    assert "fig_curves.png" in html and "fig_divergence.png" in html and "config.yaml" in html
    assert "Figure 1" in html and "Table 1" in html and "How to read the figures" in html  # figures/README.md
    assert "embedded" in html
    assert "Docutils System Messages" not in html  # every caption is valid reStructuredText


class _Resources(dict):
    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None


def training_sbatch(tmp_path, nodes: int = 1, **cluster) -> tuple[list[str], dict, str]:
    """The words of the sbatch line the SLURM plugin builds (with its own checks of gres and slurm_extra) from the
    resources Snakemake gives a paper training job with ``nodes`` and ``cluster`` keys; its resources and dry run."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string
    from snakemake_executor_plugin_slurm.validation import validate_slurm_extra

    config = yaml.safe_load((ROOT / "config/paper.yaml").read_text())
    config["resources"]["train"]["nodes"] = nodes
    config["cluster"].update(gpu_partition="gpu", **cluster)
    (tmp_path / "paper.yaml").write_text(yaml.safe_dump(config))
    cell = "results/runs/onpolicy/qwen2.5-7b/k1-reward/beta~0.1/seed~0/summary.json"
    out = snakemake(cell, "-n", "-p", "--cores", "1", "--configfile", str(tmp_path / "paper.yaml"), cwd=tmp_path)
    line = re.search(r"rule train_rl:.*?\n\s+resources: (.*?)\n", out, re.S).group(1)
    resources = _Resources(
        (key, int(value) if value.isdigit() else value)
        for key, value in (item.split("=", 1) for item in line.split(", "))
    )
    job = type("Job", (), {"resources": resources, "threads": resources["cpus_per_task"]})()
    validate_slurm_extra(job)
    params = dict(run_uuid="u", slurm_logfile="log", comment_str="c", account="", partition="", workdir=None)
    return (get_submit_command(job, params) + set_gres_string(job)).split(), resources, out  # as run_job joins them


def test_the_sbatch_line_of_a_two_node_training_job_asks_gpus_per_node(two_node_job):
    """The local SLURM has one node, so a job on two cannot run here: the sbatch line that the SLURM plugin builds from
    the resources Snakemake gives a training job with resources.train.nodes = 2 asks for 8 GPUs on each of 2 nodes
    (--gres, per node; not --gpus, per job) and one task per node (the rule's srun starts a launch on each)."""
    words, resources, _ = two_node_job
    assert {"--gres=gpu:h100:8", "--nodes=2", "--ntasks=2", "-t", "2880"} <= set(words), words
    assert not any(w.startswith(("--gpus", "--ntasks-per-gpu")) for w in words), words
    assert resources["slurm_partition"] == "gpu", resources


def test_a_gpu_name_the_plugin_refuses_fails_the_config_and_gpus_per_node_sends_it(tmp_path):
    """AutoDetect=nvml names GPUs like nvidia_a100-sxm4-80gb, which the plugin's gres check refuses at submission:
    the config check refuses it first, naming the key and the way out; with gpu_request: gpus-per-node the job asks
    --gpus-per-node=MODEL:N through slurm_extra, which the plugin lets through, and no --gres."""
    from klstudy.config import ConfigError, validate_config

    name = "nvidia_a100-sxm4-80gb"
    config = yaml.safe_load((ROOT / "config/paper.yaml").read_text())
    config["cluster"]["gpu_model"] = name
    with pytest.raises(ConfigError, match=r"cluster.gpu_model.*gpu_request: gpus-per-node"):
        validate_config(config)
    words, resources, _ = training_sbatch(tmp_path, gpu_model=name, gpu_request="gpus-per-node")
    assert f"--gpus-per-node={name}:8" in words and "--nodes=1" in words, words
    assert not any(w.startswith(("--gres", "--gpus=")) for w in words), words
    words, _, _ = training_sbatch(tmp_path, nodes=2, gpu_request="gpus-per-node")
    assert {"--gpus-per-node=8", "--nodes=2", "--ntasks=2"} <= set(words), words
    assert "--qos" not in " ".join(words), "no qos unless the config names one"


def test_the_qos_is_asked_by_every_job(two_node_job):
    assert "--qos=long" in two_node_job[0], two_node_job[0]


def test_training_slots_cap_the_cells_training_at_once(tmp_path):
    """Each training job holds one `training_slots`; the Snakefile provides cluster.training_slots of them (the
    command line's --resources wins), so at most that many cells train, and hold checkpoints, at once."""
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["cluster"] = {"training_slots": 2, "evaluation_slots": 5}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    data = ["results/data/math500.jsonl", "--cores", "1", "--configfile", str(tmp_path / "config.yaml")]
    provided = snakemake(*data, cwd=tmp_path)
    assert 'training_slots=Resource("training_slots", 2)' in provided
    assert 'evaluation_slots=Resource("evaluation_slots", 5)' in provided  # evaluations likewise
    out = snakemake(*data, "--forcerun", "prepare_data", "--resources", "training_slots=3", cwd=tmp_path)
    assert 'training_slots=Resource("training_slots", 3)' in out
    cell = "results/runs/onpolicy/tiny/k1-reward/beta~0.1/seed~0/summary.json"
    evaluation = "results/evals/base/tiny/template~on/math500.json"
    dry = snakemake(cell, evaluation, "-n", "--cores", "1", "--configfile", str(tmp_path / "config.yaml"), cwd=tmp_path)
    assert re.search(r"rule train_rl:.*?resources: [^\n]*training_slots=1", dry, re.S), dry[-2000:]
    assert re.search(r"rule evaluate_base:.*?resources: [^\n]*evaluation_slots=1", dry, re.S), dry[-2000:]


def test_make_stage_for_slurm_stages_every_input_and_nothing_else(tmp_path):
    """`make stage` (on the login node, before a driver without network): the `stage` target is every dataset and
    base model of the config, and no job that would be submitted."""
    make = subprocess.run(["make", "-n", "stage", "CONFIG=config/pilot.yaml"], cwd=ROOT, capture_output=True, text=True)
    assert "snakemake stage --cores 2 --configfile config/pilot.yaml" in make.stdout, make.stdout + make.stderr
    pilot = yaml.safe_load((ROOT / "config/pilot.yaml").read_text())
    out = snakemake("stage", "-n", "--cores", "2", "--configfile", str(ROOT / "config/pilot.yaml"), cwd=tmp_path)
    counts = job_counts(out)
    assert counts == {"prepare_data": len(pilot["data"]), "base_model": len(pilot["models"]), "stage": 1}, counts


def test_on_a_slurm_cluster_a_training_cell_is_retried_three_times(tmp_path, monkeypatch):
    """Once the executor is known (the Snakefile's onstart, where a non-local executor such as SLURM's runs it),
    train_rl is retried 3 times and every other rule as --retries says; locally nothing changes."""
    from types import SimpleNamespace

    # A cluster whose queue is empty, whether or not this machine has a (configured) squeue of its own.
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "squeue").write_text("#!/bin/sh\nexit 0\n")
    (fake / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")

    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import (
        ConfigSettings,
        DAGSettings,
        ExecutionSettings,
        OutputSettings,
        ResourceSettings,
    )

    with SnakemakeApi(OutputSettings()) as api:
        workflow_api = api.workflow(
            resource_settings=ResourceSettings(cores=1),
            config_settings=ConfigSettings(configfiles=[ROOT / "config.yaml"], config={"preflight": False}),
            snakefile=ROOT / "Snakefile",
            workdir=tmp_path,
        )
        workflow_api.dag(DAGSettings())
        workflow = workflow_api._workflow
        workflow.execution_settings = ExecutionSettings(retries=1)
        workflow._executor_plugin = SimpleNamespace(common_settings=SimpleNamespace(local_exec=True))
        workflow._onstart(None)
        assert workflow.get_rule("train_rl")._restart_times is None  # locally: --retries
        workflow._executor_plugin = SimpleNamespace(common_settings=SimpleNamespace(local_exec=False))
        workflow._onstart(None)
        assert workflow.get_rule("train_rl")._restart_times == 3
        assert workflow.get_rule("evaluate_cell")._restart_times is None  # --retries: the profile's 1


def test_a_slurm_jobs_caches_go_under_its_tmpdir_and_it_asks_no_hub(tmp_path):
    """Every job's shell prefix: inside a SLURM job, vLLM's, triton's and inductor's caches go under TMPDIR (else
    results/cache), not the home directory; one set beforehand is kept; outside SLURM nothing is set."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, DAGSettings, OutputSettings, ResourceSettings
    from snakemake.shell import shell

    with SnakemakeApi(OutputSettings()) as api:
        workflow_api = api.workflow(
            resource_settings=ResourceSettings(cores=1),
            config_settings=ConfigSettings(configfiles=[ROOT / "config.yaml"]),
            snakefile=ROOT / "Snakefile",
            workdir=tmp_path,
        )
        workflow_api.dag(DAGSettings())
        prefix = shell._process_prefix

    def caches(**env) -> dict:
        script = prefix + 'echo "${VLLM_CACHE_ROOT:-}|${TRITON_CACHE_DIR:-}|${TORCHINDUCTOR_CACHE_DIR:-}"'
        out = subprocess.run(["bash", "-c", script], cwd=tmp_path, env={"PATH": "/usr/bin:/bin", **env},
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
        return out.strip().split("|")

    assert caches() == ["", "", ""]
    under = f"{tmp_path}/scratch/klstudy-cache"
    assert caches(SLURM_JOB_ID="7", TMPDIR=f"{tmp_path}/scratch") == [
        f"{under}/vllm",
        f"{under}/triton",
        f"{under}/inductor",
    ]
    assert caches(SLURM_JOB_ID="7")[1] == f"{tmp_path}/results/cache/klstudy-cache/triton"
    node_local = {"SLURM_JOB_ID": "7", "SLURM_TMPDIR": "/local/job7", "TMPDIR": f"{tmp_path}/scratch"}
    assert caches(**node_local)[0] == "/local/job7/klstudy-cache/vllm"  # the site's node-local scratch first
    assert caches(SLURM_JOB_ID="7", VLLM_CACHE_ROOT="/big/vllm")[0] == "/big/vllm"

    def offline(**env) -> str:
        script = prefix + 'echo "${HF_HUB_OFFLINE:-}${HF_DATASETS_OFFLINE:-}${TRANSFORMERS_OFFLINE:-}"'
        return subprocess.run(["bash", "-c", script], cwd=tmp_path, env={"PATH": "/usr/bin:/bin", **env},
                              capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip

    assert offline(SLURM_JOB_ID="7") == "111" and offline() == ""  # a SLURM job asks no hub, a local run may


def test_the_slurm_test_counts_every_rule_that_is_submitted():
    """tests/test_slurm.py counts the jobs SLURM ran against the rules Snakemake submits: every rule that is not a
    localrule (a new one left out there fails the SLURM test only on a machine that runs it)."""
    from test_slurm import SUBMITTED_RULES

    snakefiles = [ROOT / "Snakefile", *sorted((ROOT / "workflow" / "rules").glob("*.smk"))]
    blocks = [b for path in snakefiles for b in re.split(r"^(?=rule \w+:)", path.read_text(), flags=re.M)]
    rules = {m.group(1): block for block in blocks if (m := re.match(r"rule (\w+):", block))}
    local = re.search(r"^localrules:\n((?:\s+\w+,?\n)+)", (ROOT / "Snakefile").read_text(), re.M).group(1)
    local = set(re.findall(r"\w+", local)) | {rule for rule, block in rules.items() if "localrule: True" in block}
    assert set(SUBMITTED_RULES) == set(rules) - local


def test_calibrate_reads_the_cells_a_run_finished(reduced_run):
    """klstudy calibrate's reading of finished cells, on what `klstudy train` wrote (not a hand-made file)."""
    from klstudy.config import all_cells
    from klstudy.run import pilot

    workdir, config = reduced_run
    cells = pilot.measured(workdir / "results")
    assert len(cells) == len(all_cells(config)) and all(c.gpus == 1 for c in cells), cells
    assert all(c.seconds_per_step > 0 and c.response_length > 0 and c.completions_per_step > 0 for c in cells), cells
