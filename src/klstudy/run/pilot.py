"""From the pilot to the grid: config/pilot-7b.yaml, derived from config/paper.yaml, and `klstudy calibrate`, which
turns a finished pilot's measured step times into the grid's GPU-hours per study.

The estimate (estimate.py) divides FLOPs by assumed throughputs. A pilot measures instead: each finished cell's
seconds per training step (the mean gap between its logged steps: generation, scoring, update, and the held-out
evaluations and checkpoints that fall between them; a slice's restart is left out), on its GPUs, for its tokens per
step (its batch × rollouts × the assumed prompt + its mean response length). That gives a rate, parameter-tokens per
GPU-second, for its model and its kind of training (on-policy or asynchronous); each study of the grid is then
priced with the rate of a pilot cell of the same model and kind, with every response at its maximum length (as the
estimate) and at the pilot's mean length.
"""

from __future__ import annotations

import copy
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from klstudy.config import all_cells
from klstudy.run.estimate import PROMPT_TOKENS, parameters

PILOT_STEPS, PILOT_CHECKPOINT_EVERY, PILOT_RUNTIME = 20, 5, 30  # minutes: less than a cell takes, so it slices
# The paper's studies the pilot runs a cell of: its models and β (K1 in the reward, seed 0).
PILOT_STUDIES = {"onpolicy": (["qwen2.5-7b", "llama-3.1-8b-instruct"], 0.1), "async_math": (["qwen2.5-7b"], 0.005)}


def pilot_7b(paper: dict) -> dict:
    """config/pilot-7b.yaml: three cells of the paper's settings (the two on-policy 7-8B models and the asynchronous
    one, K1 in the reward, one seed) for PILOT_STEPS steps; no evaluation beyond held-out pass@1; Fig. 12 for one."""
    config = {key: copy.deepcopy(paper[key]) for key in ("scale", "toy", "claims_rule", "resources", "cluster")}
    config["data"] = {k: paper["data"][k] for k in ("math_train", "math_test", "math500", "mmlu_college_biology")}
    config["models"] = {k: paper["models"][k] for k in ("qwen2.5-7b", "llama-3.1-8b-instruct")}
    config["studies"] = {}
    for name, (models, beta) in PILOT_STUDIES.items():  # named apart, so that no pilot cell is one of the grid's
        study = copy.deepcopy(paper["studies"][name])
        study.update(description=f"{name} of config/paper.yaml: K1 in the reward, {PILOT_STEPS} steps", models=models,
                     kl=["k1-reward"], betas=[beta], seeds=[0])  # fmt: skip
        study["train"].update(steps=PILOT_STEPS, eval_every=PILOT_STEPS // 2, checkpoint_every=PILOT_CHECKPOINT_EVERY)
        config["studies"][f"pilot_{name}"] = study
    evaluation = copy.deepcopy(paper["evaluation"])
    evaluation.update(tasks=["math500", "mmlu_college_biology"], studies={}, k=4)
    evaluation.pop("study_max_tokens", None)
    config["evaluation"] = evaluation
    config["divergence"] = {**copy.deepcopy(paper["divergence"]), "study": "pilot_onpolicy", "models": ["qwen2.5-7b"],
                            "kl": ["k1-reward"], "betas": [0.1], "seeds": [0], "steps": [0, PILOT_STEPS],
                            "tasks": ["math_test"], "prompts": 50}  # fmt: skip
    config.update(claims={}, figures={})
    config["resources"]["train"]["runtime"] = PILOT_RUNTIME
    return config


HEADER = """# klstudy: from the pilot to the grid, the paper's 7-8B models on its path for 20 steps, to measure them.
#
#   make preflight CONFIG=config/pilot-7b.yaml
#   .venv/bin/snakemake --profile slurm --configfile config/pilot-7b.yaml
#   .venv/bin/python -m klstudy calibrate
#
# Three training cells at the paper's settings (batch, rollouts, response lengths, FSDP on 8 GPUs, vLLM inside
# training): Qwen2.5-7B and Llama-3.1-8B-Instruct on-policy, and Qwen2.5-7B asynchronous (level 10, 4096-token
# responses); K1 in the reward, one seed, 20 steps, a checkpoint every 5. A training job asks 30 minutes, less than
# a cell takes at the estimate's throughputs, so each cell crosses a slice boundary (docs/running.md): it saves,
# requeues its job and resumes. No evaluation beyond held-out pass@1 (evaluation.tasks only because the schema asks
# for them: no study is evaluated); Fig. 12 for one cell at steps 0 and 20. Its studies are named pilot_*, apart from
# the grid's cells.
# `klstudy calibrate` then turns the measured step times into the grid's GPU-hours per study.
#
# Written from config/paper.yaml (src/klstudy/run/pilot.py) by
#   .venv/bin/python -m klstudy pilot-config --out config/pilot-7b.yaml
# Change the paper's settings there, and the cluster's names there too, then write this file again.

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
        for cell in (c for c in all_cells(grid) if c["study"] == study):
            like = [c for c in cells if c.model == cell["model"] and c.asynchronous == (train["async_level"] > 0)]
            like = like or [c for c in cells if c.model == cell["model"]]
            if not like:
                lines.append(f"{study}: no finished pilot cell of {cell['model']}: not calibrated")
                hours = None
                break
            rate = statistics.fmean(c.rate(pilot_config) for c in like)
            size = parameters(grid, cell["model"])
            completions = train["steps"] * train["batch_prompts"] * train["rollouts"]
            lengths = (train["max_response_tokens"], statistics.fmean(c.response_length for c in like))
            for i, length in enumerate(lengths):
                hours[i] += completions * (PROMPT_TOKENS + length) * size / rate / 3600
        if hours:
            lines.append(f"{study}: {hours[0]:,.0f} GPU-hours with every response at its maximum length, "
                         f"{hours[1]:,.0f} at the pilot's mean length")  # fmt: skip
            totals = [t + h for t, h in zip(totals, hours, strict=True)]
    lines.append(f"training, the studies calibrated: {totals[0]:,.0f} GPU-hours (responses at their maximum length), "
                 f"{totals[1]:,.0f} (at the pilot's)")  # fmt: skip
    return lines
