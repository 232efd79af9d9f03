"""Tidy tables of everything the grid produced (``results/tables/*.csv``), the input of every figure.

Tables (one row per ...):
    cells.csv        cell: its status (ok | collapsed | diverged | missing), reason, final numbers and the SHA-256
                     of the base model's weights it started from
    training.csv     cell × optimiser step: the columns of metrics.jsonl
    heldout.csv      cell × evaluation step: held-out pass@1 during training, its standard error and each question's
                     score (per_prompt, a JSON list)
    evaluations.csv  (cell or base model) × task: lm-eval mean@k and its standard error; base models have
                     study "base", kl "base", and chat_template on/off
    divergence.csv   cell × snapshot step × task: forward KL(π_ref‖π_θ) and entropy (Fig. 12)

A cell is identified by (study, model, kl, beta, seed), with ``estimator`` and ``placement`` split out of
``kl``. The grid comes from the config, not from whatever files happen to exist: a cell whose run is
missing is a row with status "missing", so figures and tables show the gap instead of silently dropping it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from klstudy.config import (
    AGGREGATED_TABLES,
    all_cells,
    base_templates,
    divergence_cells,
    evaluated_base_models,
    evaluated_cells,
    run_path,
)
from klstudy.kl import NO_KL, KLSpec

CELL_COLUMNS = ["study", "model", "kl", "estimator", "placement", "beta", "seed"]


def cell_columns(cell: dict) -> dict:
    spec = KLSpec.from_name(cell["kl"], cell["beta"])
    return dict(
        study=cell["study"], model=cell["model"], kl=cell["kl"], estimator=spec.estimator or NO_KL,
        placement=spec.placement,
        beta=float(cell["beta"]), seed=int(cell["seed"]),
    )  # fmt: skip


def _jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def cells_table(config: dict, results: Path) -> pd.DataFrame:
    rows = []
    for cell in all_cells(config):
        summary_path = results / "runs" / run_path(cell) / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
        rows.append(
            {
                **cell_columns(cell),
                "status": summary.get("status", "missing"),
                "reason": summary.get("reason", "no summary.json" if not summary else ""),
                "steps_done": summary.get("steps_done"),
                "steps_planned": config["studies"][cell["study"]]["train"]["steps"],
                "final_task_reward": summary.get("final_task_reward"),
                "final_kl_k3": summary.get("final_kl_k3"),
                "final_heldout_pass_at_1": summary.get("final_heldout_pass_at_1"),
                "base_model_sha256": summary.get("base_model_sha256"),
            }
        )
    return pd.DataFrame(rows)


def _per_cell_jsonl(config: dict, results: Path, name: str) -> pd.DataFrame:
    frames = []
    for cell in all_cells(config):
        rows = _jsonl(results / "runs" / run_path(cell) / name)
        if rows:
            frames.append(pd.DataFrame(rows).assign(**cell_columns(cell)))
    if not frames:
        return pd.DataFrame(columns=CELL_COLUMNS + ["step"])
    table = pd.concat(frames, ignore_index=True)
    return table[CELL_COLUMNS + [c for c in table.columns if c not in CELL_COLUMNS]]


def training_table(config: dict, results: Path) -> pd.DataFrame:
    return _per_cell_jsonl(config, results, "metrics.jsonl")


def heldout_table(config: dict, results: Path) -> pd.DataFrame:
    """per_prompt (each question's score, where the run logged them) is kept as a JSON list in one column."""
    table = _per_cell_jsonl(config, results, "heldout.jsonl")
    if "per_prompt" in table:
        table["per_prompt"] = table.per_prompt.map(lambda v: json.dumps(v) if isinstance(v, list) else None)
    return table


def question_scores(rows: pd.DataFrame) -> list:
    """Each row's per_prompt decoded (heldout_table keeps it as JSON); None where the run logged none."""
    column = rows["per_prompt"] if "per_prompt" in rows else [None] * len(rows)
    return [json.loads(v) if isinstance(v, str) else v if isinstance(v, list) else None for v in column]


EVALUATION_RESULTS = ["mean_at_k", "stderr", "unread", "k", "cell_status"]  # unread: answers no rule could read
EVALUATION_COLUMNS = CELL_COLUMNS + ["chat_template", "task", *EVALUATION_RESULTS]


def _evaluation_row(path: Path, identity: dict) -> dict:
    if not path.is_file():
        return {**identity, **dict.fromkeys(EVALUATION_RESULTS), "cell_status": "missing"}
    result = json.loads(path.read_text())
    return {**identity, **{key: result.get(key) for key in EVALUATION_RESULTS}}


def evaluations_table(config: dict, results: Path) -> pd.DataFrame:
    tasks = config["evaluation"]["tasks"]
    rows = [
        _evaluation_row(
            results / "evals" / run_path(cell) / f"{task}.json",
            {**cell_columns(cell), "chat_template": "on", "task": task},
        )
        for cell in evaluated_cells(config)
        for task in tasks
    ]
    for model in evaluated_base_models(config):
        for template in base_templates(config):
            for task in tasks:
                identity = dict(study="base", model=model, kl="base", estimator="none", placement="none", beta=0.0,
                                seed=0, chat_template=template, task=task)  # fmt: skip
                path = results / "evals" / "base" / model / f"template~{template}" / f"{task}.json"
                rows.append(_evaluation_row(path, identity))
    return pd.DataFrame(rows, columns=EVALUATION_COLUMNS)


DIVERGENCE_COLUMNS = CELL_COLUMNS + [
    "task", "step", "forward_kl", "forward_kl_stderr", "entropy", "entropy_stderr",
]  # fmt: skip


def divergence_table(config: dict, results: Path) -> pd.DataFrame:
    frames = []
    for cell in divergence_cells(config):
        for task in config["divergence"]["tasks"]:
            path = results / "divergence" / run_path(cell) / f"{task}.csv"
            if path.is_file() and path.stat().st_size:
                frames.append(pd.read_csv(path).assign(**cell_columns(cell), task=task))
    return (
        pd.concat(frames, ignore_index=True)[DIVERGENCE_COLUMNS] if frames else pd.DataFrame(columns=DIVERGENCE_COLUMNS)
    )


def write_tables(config: dict, results: Path, out_dir: Path) -> dict[str, pd.DataFrame]:
    """Every table of config.AGGREGATED_TABLES, written as ``out_dir/<name>.csv``; returns them by name."""
    out_dir.mkdir(parents=True, exist_ok=True)
    builders = {"cells": cells_table, "training": training_table, "heldout": heldout_table,
                "evaluations": evaluations_table, "divergence": divergence_table}  # fmt: skip
    tables = {name: builders[name](config, results) for name in AGGREGATED_TABLES}
    for name, table in tables.items():
        table.to_csv(out_dir / f"{name}.csv", index=False)
    return tables


def read_tables(directory: Path) -> dict[str, pd.DataFrame]:
    """The tables write_tables wrote, by name."""
    return {name: pd.read_csv(Path(directory) / f"{name}.csv") for name in AGGREGATED_TABLES}


def step_values(run: pd.DataFrame, column: str) -> pd.Series:
    """One run's ``column`` per logged step (several updates a step log it once: the step's first value), NaN at a
    step that logged none: a step's value is never dropped, so that a non-finite one stays visible."""
    return run.groupby("step")[column].first().sort_index()


def window_mean(values: pd.Series) -> tuple[float, float]:
    """(mean, its standard error) of a run's steps: non-finite if any step is. The error is the residual standard
    deviation about the steps' least-squares line, over √n (NaN under three steps). Each logged K3 is the policy's KL
    at that step plus the Monte Carlo error of that step's fresh batch, errors uncorrelated from step to step (each
    has mean zero given the run so far, although the next update uses it); what makes successive values correlated
    is the policy's own KL moving, which the line takes out instead of counting it as noise."""
    y = values.to_numpy(dtype=float)
    mean = float(y.mean()) if len(y) else math.nan
    if len(y) < 3 or not np.isfinite(y).all():
        return mean, math.nan
    x = values.index.to_numpy(dtype=float)
    residuals = y - np.polyval(np.polyfit(x, y, 1), x)
    return mean, float(np.sqrt((residuals**2).sum() / (len(y) - 2) / len(y)))


def final_values(training: pd.DataFrame, config: dict, column: str = "kl_k3") -> pd.DataFrame:
    """Per cell that logged steps: ``column`` at the end of training, the mean over its last ``final_steps`` logged
    steps (the study's setting, fixed before the runs; a run that stopped early ends where it stopped; non-finite if
    any of those steps is), ``<column>_stderr``, that mean's error (window_mean), and last_step, where the window
    ends."""
    columns = CELL_COLUMNS + [column, f"{column}_stderr", "last_step"]
    rows = []
    if column not in training:  # nothing logged yet
        return pd.DataFrame(columns=columns)
    for keys, run in training.groupby(CELL_COLUMNS, sort=False):
        last = step_values(run, column).tail(config["studies"][keys[0]].get("final_steps", 5))
        mean, stderr = window_mean(last)
        rows.append({**dict(zip(CELL_COLUMNS, keys, strict=True)), column: mean, f"{column}_stderr": stderr,
                     "last_step": last.index.max()})  # fmt: skip
    return pd.DataFrame(rows, columns=columns)


def stderr_of_mean(stderrs: pd.Series) -> float:
    """The standard error of the mean of independent estimates with these standard errors; unknown (NaN) if any
    one is unknown."""
    return (stderrs.astype(float) ** 2).sum(min_count=len(stderrs)) ** 0.5 / len(stderrs)


# The one uncertainty convention of every figure and table (figures/, tables.py): a quantity measured once per
# training seed, each measurement with its own standard error (over questions, prompts or a run's last steps), is
# shown as the mean over the n seeds ± one standard error of that mean, se = max(s/√n, √(Σ eᵢ²)/n): the seeds' spread
# (s, the standard deviation over seeds), never below what the measurements' own errors eᵢ alone give (two or three
# seeds can agree by chance). With one seed, its own error alone. The claims table's se of a paired difference is
# the same rule applied to the differences.
UNCERTAINTY = (
    "mean over n seeds ± 1 standard error, se = max(s/√n, √(Σ eᵢ²)/n): s the standard deviation over seeds, eᵢ seed "
    "i's own standard error (over questions, prompts or steps); one seed: its own error"
)


def mean_and_se(values, own_se=None) -> tuple[float, float, int]:
    """(mean, se, n) of one value per seed by the UNCERTAINTY convention; NaN values are left out, and se is NaN where
    neither the seeds' spread (one seed) nor the measurements' own errors (some unknown, or none given) give one."""
    values = np.asarray(values, dtype=float)
    known = ~np.isnan(values)
    n = int(known.sum())
    if n == 0:
        return math.nan, math.nan, 0
    spread = values[known].std(ddof=1) / math.sqrt(n) if n > 1 else math.nan
    own = math.nan
    if own_se is not None:
        errors = np.asarray(own_se, dtype=float)[known]
        own = math.sqrt((errors**2).sum()) / n  # NaN if any one is unknown
    candidates = [x for x in (spread, own) if not math.isnan(x)]
    return float(values[known].mean()), max(candidates) if candidates else math.nan, n


def trailing_mean(run: pd.DataFrame, column: str, window: int) -> pd.DataFrame:
    """One run's ``column`` at each logged step as final_values measures the end of training, over the last ``window``
    logged steps up to it (step_values, window_mean), so that a curve's last point is the run's final value: columns
    step, value, se (NaN under three steps)."""
    logged = step_values(run, column).dropna()  # several updates a batch: steps that logged no value are skipped
    rows = [(step, *window_mean(logged.iloc[max(0, i + 1 - window) : i + 1])) for i, step in enumerate(logged.index)]
    return pd.DataFrame(rows, columns=["step", "value", "se"])
