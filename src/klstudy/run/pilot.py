"""From the pilot to the grid: config/pilot-7b.yaml, derived from config/paper.yaml, and `klstudy calibrate`, which
turns a finished pilot's measured step times into the grid's GPU-hours per study.

The estimate (estimate.py) divides FLOPs by assumed throughputs. A pilot measures instead: each finished cell's
seconds per training step (the mean gap between its logged steps: generation, scoring, update, and the held-out
evaluations and checkpoints that fall between them; a slice's restart is left out), on its GPUs, for its tokens per
step (its batch × rollouts × the assumed prompt + its mean response length). That gives a rate, parameter-tokens per
GPU-second, for its model and its kind of training (on-policy or asynchronous); each study of the grid is then
priced with the rate of a pilot cell of the same model and kind, with every response at its maximum length (as the
estimate) and at the pilot's mean length. Tested by tests/test_pilot.py (and test_workflow.py, on what `klstudy train`
wrote).
"""

from __future__ import annotations

import copy
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from klstudy.config import all_cells, validate_config
from klstudy.run.estimate import PROMPT_TOKENS, CellTimes, cell_times, parameters

# The paper's studies the pilot runs a cell of: its models, KL configuration and β (seed 0). The off-policy and the
# Countdown cells are the plans closest to the GPU's memory (docs/paper-scale.md).
PILOT_STUDIES = {
    "onpolicy": (["qwen2.5-7b", "llama-3.1-8b-instruct"], "k1-reward", 0.1),
    "offpolicy_k1_loss": (["qwen2.5-7b"], "k1-loss", 0.1),
    "async_math": (["qwen2.5-7b"], "k1-reward", 0.005),
    "async_countdown": (["qwen3-4b-instruct-2507"], "k1-reward", 0.005),
}
# The study whose cell logs vLLM's log-probs against the trainer's (sampling_logp_difference in metrics.jsonl): TRL
# computes them only with vllm_importance_sampling on, which also corrects that cell's loss by their ratio.
LOGP_DIFFERENCE_STUDY = "async_math"
PILOT_CHECKPOINT_EVERY = 2  # steps: two checkpoints early in the first job
# Minutes of every job before its first step, an allowance (not a throughput the estimate has): loading the model on
# its GPUs, starting vLLM's engines, resuming a checkpoint.
STARTUP_MINUTES = 10


def first_slice(config: dict, times: CellTimes) -> float:
    """Seconds a cell trains in its first job, at the least: the runtime less STARTUP_MINUTES, the reserve SLURM warns
    the job that long before its limit (cluster.save_before_limit_minutes, slices.py) and a margin of two steps."""
    minutes = config["resources"]["train"]["runtime"] - STARTUP_MINUTES - config["cluster"]["save_before_limit_minutes"]
    return 60 * minutes - 2 * times.step


def slicing_problems(config: dict) -> list[str]:
    """Each cell of a (validated) pilot config that, at the estimate's throughputs, does not reach two checkpoints
    within its first job, or ends within it (crossing no slice boundary: it never saves, requeues and resumes)."""
    problems = []
    for cell in all_cells(config):
        train = config["studies"][cell["study"]]["train"]
        times, name = cell_times(config, cell["study"], cell["model"]), f"{cell['study']} {cell['model']}"
        second, usable = 2 * train["checkpoint_every"], first_slice(config, times)
        if second > train["steps"] or times.until(second, train) > usable:
            problems.append(f"{name}: its second checkpoint (step {second}) takes {times.until(second, train) / 60:.0f}"
                            f" of the {usable / 60:.0f} minutes it trains in its first job")  # fmt: skip
        if times.until(train["steps"], train) <= usable:
            problems.append(f"{name}: ends in {times.until(train['steps'], train) / 60:.0f} of the {usable / 60:.0f}"
                            " minutes it trains in its first job, crossing no slice boundary")  # fmt: skip
    return problems


def _size_slices(config: dict) -> None:
    """Set the training job's runtime (10-minute units) so that every cell reaches its second checkpoint in its first
    job, and each study's steps so that its cells outlast that job (slicing_problems)."""
    validated = validate_config(copy.deepcopy(config))
    cells = [(c["study"], cell_times(validated, c["study"], c["model"])) for c in all_cells(validated)]
    train = {study: validated["studies"][study]["train"] for study, _ in cells}
    held_back = STARTUP_MINUTES + config["cluster"]["save_before_limit_minutes"]
    needed = max(times.until(2 * PILOT_CHECKPOINT_EVERY, train[study]) + 2 * times.step for study, times in cells)
    runtime = 10 * math.ceil((needed / 60 + held_back) / 10)
    config["resources"]["train"]["runtime"] = validated["resources"]["train"]["runtime"] = runtime
    steps = {study: 2 * PILOT_CHECKPOINT_EVERY for study in train}
    for study, times in cells:  # the study's steps: enough for the slowest of its cells to outlast its first job
        while times.until(steps[study], train[study]) <= first_slice(validated, times):
            steps[study] += PILOT_CHECKPOINT_EVERY
    for study, count in steps.items():
        config["studies"][study]["train"]["steps"] = count


def pilot_7b(paper: dict) -> dict:
    """config/pilot-7b.yaml: one cell of each of the paper's kinds of training (PILOT_STUDIES: on-policy with both 7-8B
    models, off-policy, asynchronous on math and on Countdown; one seed), sized so that each reaches two checkpoints
    and crosses a slice boundary (_size_slices), named pilot_* apart from the grid's cells; the paper's settings but
    for LOGP_DIFFERENCE_STUDY's; no evaluation beyond held-out pass@1 (the schema asks for tasks); Fig. 12 for one."""
    config = {key: copy.deepcopy(paper[key]) for key in ("scale", "toy", "claims_rule", "resources", "cluster")}
    data = ("math_train", "math_test", "math500", "countdown_train", "countdown_test", "mmlu_college_biology")
    config["data"] = {k: paper["data"][k] for k in data}
    models = ("qwen2.5-7b", "llama-3.1-8b-instruct", "qwen3-4b-instruct-2507")
    config["models"] = {k: paper["models"][k] for k in models}
    config["studies"] = {}
    for name, (models, kl, beta) in PILOT_STUDIES.items():  # named apart, so that no pilot cell is one of the grid's
        study = copy.deepcopy(paper["studies"][name])
        study.update(description=f"{name} of config/paper.yaml: {kl}, β = {beta:g}", models=models, kl=[kl],
                     betas=[beta], seeds=[0])  # fmt: skip
        study["train"].update(steps=2 * PILOT_CHECKPOINT_EVERY, eval_every=10, checkpoint_every=PILOT_CHECKPOINT_EVERY)
        if name == LOGP_DIFFERENCE_STUDY:  # TRL logs vLLM's log-probs against the trainer's only with its correction
            study["train"]["vllm_importance_sampling"] = True
        config["studies"][f"pilot_{name}"] = study
    evaluation = copy.deepcopy(paper["evaluation"])
    evaluation.update(tasks=["math500", "mmlu_college_biology"], studies={}, k=4)
    evaluation.pop("study_max_tokens", None)
    config["evaluation"] = evaluation
    config["divergence"] = {**copy.deepcopy(paper["divergence"]), "study": "pilot_onpolicy", "models": ["qwen2.5-7b"],
                            "kl": ["k1-reward"], "betas": [0.1], "seeds": [0], "tasks": ["math_test"],
                            "prompts": 50}  # fmt: skip
    config.update(claims={}, figures={})
    config["divergence"]["steps"] = [0, 2 * PILOT_CHECKPOINT_EVERY]
    _size_slices(config)
    config["divergence"]["steps"] = [0, config["studies"]["pilot_onpolicy"]["train"]["steps"]]
    return config


HEADER = """# klstudy: from the pilot to the grid, a cell of each of the paper's kinds of training at 7-8B, measured.
#
#   make preflight CONFIG="config/pilot-7b.yaml config/cluster.yaml"
#   .venv/bin/snakemake --profile slurm --configfile config/pilot-7b.yaml config/cluster.yaml
#   .venv/bin/python -m klstudy calibrate
#
# Its cells, what each changes from the paper's settings and why: pilot_7b in src/klstudy/run/pilot.py; what to
# check after it: docs/running.md, "From the pilot to the grid". Written from config/paper.yaml by
#   .venv/bin/python -m klstudy pilot-config --out config/pilot-7b.yaml
# Change the paper's settings there, then write this file again; the cluster's names are config/cluster.yaml's.

"""


def paper_config() -> dict:
    import yaml

    return yaml.safe_load((Path(__file__).resolve().parents[3] / "config" / "paper.yaml").read_text())


def config_text(config: dict) -> str:
    import yaml

    return HEADER + yaml.safe_dump(config, sort_keys=False, width=100, default_flow_style=None, allow_unicode=True)


@dataclass(frozen=True)
class Measured:
    run: str  # the cell's path under results/runs
    model: str
    asynchronous: bool
    gpus: int
    seconds_per_step: float
    completions_per_step: int  # batch prompts × rollouts
    response_length: float  # mean tokens of its responses

    def rate(self, config: dict) -> float:
        """Parameter-tokens per GPU-second."""
        tokens = self.completions_per_step * (PROMPT_TOKENS + self.response_length)
        return parameters(config, self.model) * tokens / (self.seconds_per_step * self.gpus)


def measured(results: Path) -> list[Measured]:
    """Every cell under ``results``/runs that ended ok, with its step times (module docstring)."""
    found = []
    for summary_path in sorted(Path(results).glob("runs/**/summary.json")):
        summary = json.loads(summary_path.read_text())
        rows = [json.loads(line) for line in (summary_path.parent / "metrics.jsonl").read_text().splitlines() if line]
        gaps = [b["time"] - a["time"] for a, b in zip(rows, rows[1:], strict=False) if b["time"] > a["time"]]
        lengths = [row["response_length"] for row in rows if "response_length" in row]
        if summary["status"] != "ok" or not gaps or not lengths:
            continue
        cell, train = summary["cell"], summary["cell"]["train"]
        found.append(Measured(
            cell["run"], cell["model"], train["async_level"] > 0, summary["processes"], statistics.fmean(gaps),
            train["batch_prompts"] * train["rollouts"], statistics.fmean(lengths),
        ))  # fmt: skip
    return found


def calibrate(grid: dict, pilot_config: dict, results: Path) -> list[str]:
    """The grid's training GPU-hours per study, at the rates the pilot measured (module docstring)."""
    cells = measured(results)
    if not cells:
        return [f"calibrate: no finished cell under {results}/runs: run the pilot first"]
    lines = [f"measured: {c.run}: {c.seconds_per_step:.1f} s a step on {c.gpus} GPUs, responses of "
             f"{c.response_length:.0f} tokens on average: {c.rate(pilot_config) / 1e9:,.1f} G parameter-tokens per "
             "GPU-second" for c in cells]  # fmt: skip
    totals = [0.0, 0.0]
    for study, spec in grid["studies"].items():
        train, hours = spec["train"], [0.0, 0.0]
        for model in (c["model"] for c in all_cells(grid) if c["study"] == study):
            same = [c for c in cells if c.model == model]
            like = [c for c in same if c.asynchronous == (train["async_level"] > 0)] or same
            if not like:
                lines.append(f"{study}: no finished pilot cell of {model}: not calibrated")
                break
            size, rate = parameters(grid, model), statistics.fmean(c.rate(pilot_config) for c in like)
            completions = train["steps"] * train["batch_prompts"] * train["rollouts"]
            lengths = (train["max_response_tokens"], statistics.fmean(c.response_length for c in like))
            for i, length in enumerate(lengths):
                hours[i] += completions * (PROMPT_TOKENS + length) * size / rate / 3600
        else:
            lines.append(f"{study}: {hours[0]:,.0f} GPU-hours with every response at its maximum length, "
                         f"{hours[1]:,.0f} at the pilot's mean length")  # fmt: skip
            totals = [t + h for t, h in zip(totals, hours, strict=True)]
    lines.append(f"training, the studies calibrated: {totals[0]:,.0f} GPU-hours (responses at their maximum length), "
                 f"{totals[1]:,.0f} (at the pilot's)")  # fmt: skip
    return lines
