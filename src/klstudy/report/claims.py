"""The claims table: which of the paper's claims a run shows, by how much, and with what error.

Each claim (config ``claims``) compares a candidate KL configuration with a baseline (another configuration, the same
one at another β, or the base model) on one metric, and predicts the sign of the difference: from the paper, or from
Table 1's exact computation in the toy model (``predicted: table1``, for the KL to the reference against no KL).

Each row is judged by the rule of claims_rule.py (config ``claims_rule``), which its docstring states with what it
promises.

Which runs enter a row. A run counts as whole when cells.csv says ``ok``, it trained every planned step and each of
its values is finite. Metrics measured during training (final_kl, heldout, and a trend over β) are compared at one
common step: the last one that every run of the row reached with finite values (the end of training when all are
whole); metrics of the final policy (evaluation, forward_kl, entropy) leave out each seed whose runs are not all
whole. The note names every run that moved the step or was left out, with its status and step, and every run of the
grid that has no results.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from klstudy.claims_rule import (
    BASE,
    FDR_NAMES,
    FDR_VALID_UNDER,
    MARGIN_ENDS,
    SHOWN,
    judged,
    margin_ends,
    paired_test,
)
from klstudy.config import baseline_beta_of, claim_models, selected_betas
from klstudy.report.aggregate import question_scores, window_mean

METRICS = {
    "final_kl": "KL(π_θ‖π_ref) at the end of training (K3 estimate, mean of the last final_steps steps)",
    "heldout": "held-out pass@1 at the last evaluation during training",
    "evaluation": "lm-eval mean@k of the final policy, mean over the claim's tasks",
    "forward_kl": "forward KL(π_ref‖π_θ) at the last saved snapshot, mean over the claim's tasks (Fig. 12)",
    "entropy": "token entropy of π_θ at the last saved snapshot, mean over the claim's tasks (Fig. 12)",
}
DURING_TRAINING = ("final_kl", "heldout")  # compared at a common step; the others measure the final policy

COLUMNS = [
    "claim", "text", "paper", "metric", "study", "model", "base_model", "candidate", "baseline", "beta",
    "baseline_beta", "predicted", "basis", "candidate_mean", "baseline_mean", "effect", "se", "se_above", "se_below",
    "z", "critical", "df", "p", "q_value", "pair_by", "units", "seeds", "runs", "step", "verdict", "note",
]  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------
# The runs and their values.


def _label(study: str, kl: str, beta: float, seeds, with_study: bool) -> str:
    """A run (or runs: ``seeds`` a list) as the note names it: "k1-reward β 0.1 seed 0", the study where not the
    claim's own."""
    seeds = ", ".join(map(str, seeds)) if isinstance(seeds, list) else seeds
    where = f" of {study}" if with_study else ""
    return f"{kl}{'' if kl == 'none' else f' β {beta:g}'}{where} seed {seeds}"


def _tasks(claim: dict, config: dict, metric: str) -> list[str]:
    """The tasks a claim averages over: evaluation tasks by domain, or the divergence tasks; a named task alone."""
    if metric == "evaluation":
        tasks, in_domain = config["evaluation"]["tasks"], config["evaluation"]["in_domain"]
        domain = claim.get("domain", "all")
        if domain == "in-domain":
            return [t for t in tasks if t in in_domain]
        if domain == "out-of-domain":
            return [t for t in tasks if t not in in_domain]
        return tasks if domain == "all" else [domain]
    tasks = config["divergence"]["tasks"]
    return [claim["task"]] if claim.get("task") else tasks


def _mean_over_tasks(rows: pd.DataFrame, tasks: list[str], value: str, stderr: str) -> pd.DataFrame:
    """Per seed: the mean of ``value`` over ``tasks`` and its standard error (tasks independent; unknown if any
    task's is: aggregate.stderr_of_mean); a seed that lacks a task is left out (a non-finite value stays, for the
    caller to name)."""
    rows = rows[rows.task.isin(tasks)].dropna(subset=[value])
    variance = (rows[stderr].astype(float) ** 2).rename("variance")
    grouped = pd.concat([rows[["seed", "task", value]], variance], axis=1).groupby("seed")
    parts = grouped.agg(value=(value, "mean"), variance=("variance", "sum"), known=("variance", "count"),
                        tasks=("task", "nunique"), n=("task", "size"))  # fmt: skip
    se = np.sqrt(parts.variance.where(parts.known == parts.n)) / parts.n
    return pd.DataFrame({"value": parts.value, "se": se})[parts.tasks == len(tasks)]


def run_status(cells: pd.DataFrame) -> dict:
    """Per seed of ``cells`` (one configuration's rows of cells.csv): its status, steps_done, steps_planned, and
    whole (ok and every planned step)."""
    if "status" not in cells:
        return {}
    done = pd.to_numeric(cells.get("steps_done", pd.Series(index=cells.index)), errors="coerce")
    planned = pd.to_numeric(cells.get("steps_planned", pd.Series(index=cells.index)), errors="coerce")
    return {
        int(seed): dict(status=status, steps_done=d, steps_planned=p, whole=bool(status == "ok" and d >= p))
        for seed, status, d, p in zip(cells.seed, cells.status, done, planned, strict=True)
    }


def training_series(metric: str, rows: pd.DataFrame) -> dict:
    """Per seed of ``rows`` (one configuration's rows of training.csv or heldout.csv), the metric at each step it was
    measured during training (final_kl: each logged step's K3; heldout: each evaluation, with its stderr and
    per_prompt)."""
    if metric == "final_kl":
        if "kl_k3" not in rows:
            return {}
        values = rows.groupby(["seed", "step"])["kl_k3"].first()  # as aggregate.step_values, every run at once
        return {int(seed): run.droplevel(0).rename("value").to_frame() for seed, run in values.groupby(level=0)}
    series = {}
    for seed, run in rows.groupby("seed"):
        run = run.sort_values("step").set_index("step")
        series[int(seed)] = pd.DataFrame(
            {"value": run.pass_at_1.astype(float), "se": run.stderr.astype(float),
             "per_question": question_scores(run)},
            index=run.index,
        )  # fmt: skip
    return series


class RunTables:
    """The aggregated tables, each split by configuration (study, model, kl, β) once and each run's series and status
    read once, so that a claims table of dozens of rows reads each table once."""

    def __init__(self, tables: dict):
        self.tables = tables
        self._split: dict = {}
        self._cache: dict = {}

    @staticmethod
    def _key(study, model, kl, beta) -> tuple:
        return study, model, kl, 0.0 if kl == "none" else round(float(beta), 9)

    def rows(self, name: str, study, model, kl, beta) -> pd.DataFrame:
        """Table ``name``'s rows of one configuration (no KL: its one β)."""
        table = self.tables[name]
        if name not in self._split:
            beta_key = [0.0 if kl == "none" else round(float(b), 9) for kl, b in zip(table.kl, table.beta, strict=True)]
            groups = table.groupby([table.study, table.model, table.kl, pd.Series(beta_key, index=table.index)])
            self._split[name] = {key: group for key, group in groups} if len(table) else {}
        return self._split[name].get(self._key(study, model, kl, beta), table.iloc[:0])

    def series(self, metric: str, study, model, kl, beta) -> dict:
        key = (metric, *self._key(study, model, kl, beta))
        if key not in self._cache:
            table = "training" if metric == "final_kl" else "heldout"
            self._cache[key] = training_series(metric, self.rows(table, study, model, kl, beta))
        return self._cache[key]

    def status(self, study, model, kl, beta) -> dict:
        key = ("status", *self._key(study, model, kl, beta))
        if key not in self._cache:
            self._cache[key] = run_status(self.rows("cells", study, model, kl, beta))
        return self._cache[key]


def usable_end(values: pd.Series) -> tuple[float, float]:
    """(the last step before the first non-finite value, that step; NaN where there is none)."""
    finite = np.isfinite(values.to_numpy(dtype=float))
    if finite.all():
        return (float(values.index.max()) if len(values) else math.nan), math.nan
    first_bad = float(values.index[~finite][0])
    before = values.index[values.index < first_bad]
    return (float(before.max()) if len(before) else math.nan), first_bad


def _problem(label: str, status: dict | None, bad_step: float, metric: str) -> str | None:
    """Why a run is not whole (for the note), or None: no status, not ok, fewer steps than planned, a non-finite
    value (at ``bad_step``, where known)."""
    if not math.isnan(bad_step):
        return f"{label} non-finite {metric} at step {bad_step:g}"
    if status is None:
        return f"{label} has no status in cells.csv"
    if status["status"] != "ok":
        done = status["steps_done"]
        return f"{label} {status['status']}" + (f" at step {done:g}" if np.isfinite(done) else "")
    if not status["whole"]:
        return f"{label} stopped at step {status['steps_done']:g} of {status['steps_planned']:g}"
    return None


def _at_step(metric: str, series: pd.DataFrame, step: float, config: dict, study: str) -> dict:
    """One run's value, error and per-question scores at ``step`` (final_kl: the window of final_steps ending there)."""
    if metric == "final_kl":
        value, se = window_mean(series.value[series.index <= step].tail(config["studies"][study].get("final_steps", 5)))
        return {"value": value, "se": se, "per_question": None}
    return series.loc[step].to_dict()


class Sides:
    """The runs of one row: per side (candidate, baseline; or one per β for a trend) and seed, measured at one common
    step (metrics during training) or at the end with the seeds not whole left out, and a note of why."""

    def __init__(self, metric: str, runs: RunTables, config: dict, claim: dict, model: str):
        self.metric, self.runs, self.config, self.claim, self.model = metric, runs, config, claim, model
        self.notes: list[str] = []
        self.step = math.nan

    def _label(self, study, kl, beta, seeds) -> str:
        return _label(study, kl, beta, seeds, study != self.claim["study"])

    def _problems(self, study, kl, beta, seeds, bad_steps: dict) -> dict:
        """Per seed of ``seeds`` whose run of (study, kl, beta) is not whole: why."""
        status = self.runs.status(study, self.model, kl, beta)
        problems = {}
        for seed in seeds:
            why = _problem(
                self._label(study, kl, beta, seed), status.get(seed), bad_steps.get(seed, math.nan), self.metric
            )
            if why:
                problems[seed] = why
        return problems

    def _seeds(self, sides: list[tuple], found: list) -> list:
        """The seeds with results on every side; names the grid's runs that have none."""
        grid = set.intersection(*(set(self.config["studies"][study]["seeds"]) for study, _, _ in sides))
        if self.metric in ("forward_kl", "entropy"):  # only the divergence section's seeds save snapshots
            grid &= set(self.config["divergence"]["seeds"])
        for (study, kl, beta), seeds in zip(sides, found, strict=True):
            absent = [s for s in sorted(grid) if s not in seeds]
            if absent:
                self.notes.append(f"no results: {self._label(study, kl, beta, absent)}")
        return sorted(set.intersection(*(set(seeds) for seeds in found)))

    def during_training(self, sides: list[tuple], base_at_zero: bool) -> list[pd.DataFrame]:
        """``sides``: (study, kl, beta); base_at_zero: one more side, the first side's own step 0 (the base model).
        Each side's values per seed at the common step: the last step every run reached with finite values (for
        held-out pass@1, the last evaluation after step 0 that every run made by then)."""
        series = [self.runs.series(self.metric, study, self.model, kl, beta) for study, kl, beta in sides]
        seeds = self._seeds(sides, [list(values) for values in series])
        ends, problems = [], []
        for (study, kl, beta), values in zip(sides, series, strict=True):
            usable = {seed: usable_end(values[seed].value) for seed in seeds}
            ends += [end for end, _ in usable.values()]
            bad = {seed: bad_step for seed, (_, bad_step) in usable.items()}
            problems += self._problems(study, kl, beta, seeds, bad).values()
        step = min(ends, default=math.nan)
        if self.metric == "heldout" and seeds:
            evaluated = set.intersection(*(set(values[seed].index) for values in series for seed in seeds))
            step = max((s for s in evaluated if 0 < s <= step), default=math.nan)
        self.step = step
        if math.isnan(step):
            return [pd.DataFrame(columns=["value", "se"]) for _ in range(len(sides) + base_at_zero)]
        if problems or any(end != step for end in ends):
            why = f" ({'; '.join(problems)})" if problems else ""
            self.notes.append(f"compared at step {step:g}, the last every run reached{why}")
        out = [
            pd.DataFrame({seed: _at_step(self.metric, values[seed], step, self.config, study) for seed in seeds}).T
            for (study, _, _), values in zip(sides, series, strict=True)
        ]
        if base_at_zero:
            at_zero = {seed: series[0][seed].loc[0].to_dict() for seed in seeds if 0 in series[0][seed].index}
            out.append(pd.DataFrame(at_zero).T if at_zero else pd.DataFrame(columns=["value", "se"]))
        return [frame.astype({"value": float, "se": float}) for frame in out]

    def final_policy(self, sides: list[tuple]) -> list[pd.DataFrame]:
        """``sides``: (study, kl, beta), the baseline's kl possibly BASE; each side's values per seed of the final
        policy (the last saved snapshot, or its evaluation), each seed with a run not whole, or a value not finite,
        left out. The base model: the candidate's runs' step 0 (Fig. 12), or one evaluation for every seed, index
        ["base"]."""
        values = [self._final_side(study, kl, beta) for study, kl, beta in sides]
        trained = [(side, v) for side, v in zip(sides, values, strict=True) if side[1] != BASE]
        shared = self.metric == "evaluation"
        per_seed = [v for side, v in zip(sides, values, strict=True) if not (shared and side[1] == BASE)]
        seeds = self._seeds([side for side, _ in trained], [list(v.index) for _, v in trained])
        seeds = sorted(set(seeds).intersection(*(set(v.index) for v in per_seed)))
        problems = {}
        for (study, kl, beta), _ in trained:
            for seed, why in self._problems(study, kl, beta, seeds, {}).items():
                problems.setdefault(seed, []).append(why)
        for side, side_values in zip(sides, values, strict=True):
            for seed in seeds if not (shared and side[1] == BASE) else []:
                if not np.isfinite(side_values.value.get(seed, math.nan)):
                    problems.setdefault(seed, []).append(f"{self._label(*side, seed)} non-finite {self.metric}")
        if problems:
            whys = "; ".join(why for seed in sorted(problems) for why in problems[seed])
            self.notes.append(f"left out seed {', '.join(map(str, sorted(problems)))}: {whys}")
        keep = [s for s in seeds if s not in problems]
        return [v if shared and side[1] == BASE else v.loc[keep] for side, v in zip(sides, values, strict=True)]

    def _final_side(self, study, kl, beta) -> pd.DataFrame:
        tasks = _tasks(self.claim, self.config, self.metric)
        if self.metric == "evaluation":
            evaluations = self.runs.tables["evaluations"]
            if kl == BASE:  # one evaluation of the base model (chat template on, as the trained cells)
                rows = evaluations[(evaluations.study == BASE) & (evaluations.model == self.model)]
                rows = rows[rows.chat_template.astype(str) == "on"]
                base = _mean_over_tasks(rows, tasks, "mean_at_k", "stderr")
                return base.set_axis([BASE][: len(base)])
            rows = self.runs.rows("evaluations", study, self.model, kl, beta)
            return _mean_over_tasks(rows, tasks, "mean_at_k", "stderr")
        at_zero = kl == BASE  # the base model: the candidate's own step 0
        runs = self.claim["candidate"] if at_zero else kl
        rows = self.runs.rows("divergence", study, self.model, runs, beta)
        if len(rows):
            last = rows.groupby("seed").step.transform("max")
            rows = rows[rows.step == 0] if at_zero else rows[rows.step == last]
            self.step = self.step if at_zero else float(rows.step.max())
        return _mean_over_tasks(rows, tasks, self.metric, f"{self.metric}_stderr")


# ----------------------------------------------------------------------------------------------------------------
# The claims.


def expected_pull(tests: pd.DataFrame, kl_config: str) -> str:
    """What Table 1's exact computation predicts configuration ``kl_config`` does to KL(π_θ‖π_ref) on-policy, from
    the projection of its expected gradient on the KL's (its row of toy.unbiasedness_tests' ``tests``); projections
    within 1e-9 of zero are zero."""
    rows = tests[tests.config == kl_config] if "config" in tests else tests.iloc[:0]
    test = rows.iloc[0].to_dict() if len(rows) else None
    if test is None or pd.isna(test.get("min_projection", float("nan"))):
        return "not analysed"
    if test.get("exact_unbiased") is True:
        return "pulls towards π_ref (the KL's own gradient)"
    low, high, zero = test["min_projection"], test["max_projection"], 1e-9
    if max(abs(low), abs(high)) < zero:
        return "no pull (zero expected gradient)"
    if low > zero:
        return "pulls towards π_ref (biased: not the KL's gradient)"
    if low >= -zero:
        return "pulls towards π_ref in some settings, in none away (biased: zero in others)"
    return "may push away (opposes the KL's gradient in some settings)"


def predicted_direction(claim: dict, tests: pd.DataFrame) -> tuple[str | None, str]:
    """(higher | lower | same | None, its basis). table1: from the projection of the configuration's exact expected
    gradient on the KL's (expected_pull): a pull (in every setting or in some, never away) predicts a lower KL than
    no KL, no pull the same KL."""
    if claim["predicted"] != "table1":
        return claim["predicted"], claim.get("paper", "the paper")
    pull = expected_pull(tests, claim["candidate"])
    direction = "lower" if pull.startswith("pulls") else "same" if pull.startswith("no pull") else None
    return direction, f"Table 1 exact: {pull}"


def heldout_questions(config: dict, study: str) -> str:
    """What identifies a study's held-out questions: its held-out set's name and definition (the data config entry,
    from which the questions are generated or read)."""
    name = config["studies"][study]["heldout_data"]
    return f"{name} {json.dumps(config['data'].get(name), sort_keys=True)}"


def _claim_columns(name: str, claim: dict, direction: str | None) -> dict:
    """The columns every row of a claim shares."""
    return dict(claim=name, text=claim["text"], paper=claim.get("paper", ""), metric=claim["metric"],
                study=claim["study"], candidate=claim["candidate"], predicted=direction or "none")  # fmt: skip


def _measured(sides: Sides, claim, baseline_study, model, beta, baseline_beta) -> list[pd.DataFrame]:
    candidate = (claim["study"], claim["candidate"], beta)
    if claim["metric"] in DURING_TRAINING:
        if claim["baseline"] == BASE:
            return sides.during_training([candidate], base_at_zero=True)
        return sides.during_training([candidate, (baseline_study, claim["baseline"], baseline_beta)], False)
    return sides.final_policy([candidate, (baseline_study, claim["baseline"], baseline_beta)])


def claim_rows(name: str, claim: dict, config: dict, runs: RunTables, tests: pd.DataFrame) -> list[dict]:
    """One row per model of the claim's study and per selected β (not yet judged: effect, se, df, why)."""
    study = config["studies"][claim["study"]]
    baseline_study = claim.get("baseline_study", claim["study"])
    metric, pair_by = claim["metric"], claim["pair_by"]
    direction, basis = predicted_direction(claim, tests)
    betas = study["betas"]
    if metric in ("forward_kl", "entropy"):  # only the divergence section's cells save snapshots
        betas = [beta for beta in betas if beta in config["divergence"]["betas"]]
    betas = [0.0] if claim["candidate"] == "none" else selected_betas(claim["beta"], betas)  # no KL: once, at β = 0
    models = claim_models(config, claim)
    if claim["beta"] == "trend":
        return [trend_row(name, claim, config, runs, direction, basis, model, betas) for model in models]
    same_questions = heldout_questions(config, claim["study"]) == heldout_questions(config, baseline_study)
    rows = []
    for model in models:
        for beta in betas:
            baseline_beta = baseline_beta_of(claim["baseline_beta"], beta, config["studies"][baseline_study]["betas"])
            if baseline_beta is None:  # "below" at the study's smallest β: nothing to compare with
                continue
            sides = Sides(metric, runs, config, claim, model)
            candidate, baseline = _measured(sides, claim, baseline_study, model, beta, baseline_beta)
            comparable = same_questions or metric != "heldout"
            test = paired_test(candidate, baseline, pair_by, comparable)
            ends = margin_ends(candidate, baseline, pair_by, _margin(claim, direction), comparable)
            paired = candidate.index if list(baseline.index) == [BASE] else candidate.index.intersection(baseline.index)
            baseline_mean = float(baseline.value.mean()) if list(baseline.index) == [BASE] else (
                float(baseline.loc[paired].value.mean()) if len(paired) else math.nan)  # fmt: skip
            rows.append(
                dict(
                    **_claim_columns(name, claim, direction), model=model,
                    baseline=claim["baseline"] if baseline_study == claim["study"] else
                    f"{claim['baseline']} ({baseline_study})",
                    beta=beta, baseline_beta=baseline_beta if claim["baseline"] not in ("none", BASE) else "",
                    basis=basis + (f"; margin {claim.get('margin')} of the baseline" if direction == "same" else ""),
                    candidate_mean=float(candidate.loc[paired].value.mean()) if len(paired) else math.nan,
                    baseline_mean=baseline_mean, pair_by=pair_by, margin=claim.get("margin"),
                    runs=len(paired) * (1 if claim["baseline"] == BASE else 2), step=sides.step,
                    **{k: test[k] for k in ("effect", "se", "df", "units", "seeds", "why")}, **ends,
                    note="; ".join(filter(None, [test["note"], *sides.notes])),
                )
            )  # fmt: skip
    return rows


def _margin(claim: dict, direction: str | None) -> float:
    """A same claim's margin (a fraction of the baseline); NaN for a directional claim, or none given."""
    margin = claim.get("margin") if direction == "same" else None
    return math.nan if margin is None else float(margin)


def trend_values(metric: str, runs: RunTables, config: dict, claim: dict, model, betas: list[float]):
    """(slopes, values, errors, sides): values, the metric per seed (a column per β, at a common step), errors their
    own errors; slopes, each seed's least-squares slope over log10 β (per decade of β) and its own error from each
    β's (se)."""
    sides = Sides(metric, runs, config, claim, model)
    side_list = [(claim["study"], claim["candidate"], beta) for beta in betas]
    measured = sides.during_training(side_list, False) if metric in DURING_TRAINING else sides.final_policy(side_list)
    values = pd.concat({beta: m.value for beta, m in zip(betas, measured, strict=True)}, axis=1).dropna()
    errors = pd.concat({beta: m.se for beta, m in zip(betas, measured, strict=True)}, axis=1).loc[values.index]
    x = np.log10(np.asarray(betas, dtype=float))
    weights = (x - x.mean()) / ((x - x.mean()) @ (x - x.mean()))
    slopes = values.to_numpy(dtype=float) @ weights
    slope_se = np.sqrt((errors.to_numpy(dtype=float) ** 2) @ weights**2)
    return pd.DataFrame({"value": slopes, "se": slope_se}, index=values.index), values, errors, sides


def trend_row(name, claim, config, runs: RunTables, direction, basis, model, betas) -> dict:
    """The one row of a ``beta: trend`` claim: the mean over seeds of the metric's slope over log10 β; beta and
    baseline_beta are the grid's largest and smallest β, candidate_mean and baseline_mean the metric there."""
    slopes, values, errors, sides = trend_values(claim["metric"], runs, config, claim, model, betas)
    zero = pd.DataFrame({"value": 0.0, "se": 0.0}, index=slopes.index)
    test = paired_test(slopes, zero, "seeds")
    smallest = pd.DataFrame({"value": values[min(betas)], "se": errors[min(betas)]}) if len(values) else zero
    ends = margin_ends(slopes, smallest, "seeds", _margin(claim, direction), offset=0.0)
    grid = ", ".join(f"{beta:g}" for beta in betas)
    return dict(
        **_claim_columns(name, claim, direction), model=model, baseline=claim["candidate"], beta=max(betas),
        baseline_beta=min(betas), basis=basis,
        candidate_mean=float(values[max(betas)].mean()) if len(values) else math.nan,
        baseline_mean=float(values[min(betas)].mean()) if len(values) else math.nan,
        pair_by="seeds", margin=claim.get("margin"), runs=len(slopes) * len(betas), step=sides.step,
        **{k: test[k] for k in ("effect", "se", "df", "units", "seeds", "why")}, **ends,
        note="; ".join(filter(None, [f"trend: slope per decade of β over β = {grid}", test["note"], *sides.notes])),
    )  # fmt: skip


def claims_table(config: dict, tables: dict, tests: pd.DataFrame) -> pd.DataFrame:
    """Every claim of config ``claims``, one row per model and β; empty (with the columns) when there are none."""
    runs = RunTables(tables)
    rows = [
        row for name, claim in config.get("claims", {}).items() for row in claim_rows(name, claim, config, runs, tests)
    ]
    work = pd.DataFrame(rows, columns=[*COLUMNS, "margin", "why", *(c for c in MARGIN_ENDS if c not in COLUMNS)])
    table = judged(work, config["claims_rule"]) if len(work) else work
    table = table[COLUMNS].copy()
    digests = base_model_digests(tables["cells"])  # a column, since the report shows the CSV, not the caption
    table["base_model"] = [", ".join(digests.get(model, [])) for model in table.model]
    numbers = ["candidate_mean", "baseline_mean", "effect", "se", "se_above", "se_below", "z", "critical", "p",
               "q_value"]  # fmt: skip
    table[numbers] = table[numbers].astype(float).round(4)
    return table


# ----------------------------------------------------------------------------------------------------------------
# The caption.


def base_model_digests(cells: pd.DataFrame) -> dict[str, list[str]]:
    """Per model, the base models its runs started from: SHA-256 of the weights, 12 hex digits (more than one when its
    runs started from different weights); models whose runs recorded none are left out."""
    if "base_model_sha256" not in cells:
        return {}
    recorded = cells.dropna(subset=["base_model_sha256"])
    return {
        model: sorted({digest[:12] for digest in group["base_model_sha256"]})
        for model, group in recorded.groupby("model", sort=True)
    }


def base_models_sentence(cells: pd.DataFrame) -> str:
    """Which base models the runs started from, so that two runs of one config on two machines can be told apart when
    their base models differ (the embedded warm start does, across CPUs)."""
    digests = base_model_digests(cells)
    if not digests:
        return ""
    named = "; ".join(f"{model} {', '.join(found)}" for model, found in digests.items())
    mixed = any(len(found) > 1 for found in digests.values())
    return (
        f" Base models (SHA-256 of the weights each run started from, also the column base_model): {named}."
        + (" One model's runs started from different weights: its comparisons mix experiments." if mixed else "")
        + " A run whose base model has another digest (another machine's build) is another experiment."
    )


def table_sentence(table: pd.DataFrame, rule: dict) -> str:
    """What the table as a whole promises: the judged higher/lower rows, the false shown rows to expect."""
    directional = table[table.predicted.isin(["higher", "lower"]) & table.q_value.notna()]
    shown = int((directional.verdict == SHOWN).sum())
    return (
        f" This table: {len(directional)} higher/lower rows judged, {shown} shown; at most "
        f"{rule['alpha']} × {len(directional)} = {rule['alpha'] * len(directional):.2g} false shown rows expected, "
        f"and of the {shown} shown at most a fraction {rule['q']} expected false."
    )


def caption(config: dict, cells: pd.DataFrame | None = None, table: pd.DataFrame | None = None) -> str:
    """The claims table's caption; with the cells table it names the base models the runs started from, with the
    claims table it counts the rows judged and the false shown rows to expect."""
    rule = config["claims_rule"]
    fdr = FDR_NAMES[rule["fdr"]]
    return (
        f"Claims ({config['scale']} scale): which of the paper's claims this run shows, by a rule that is the same for "
        "every run (claims_rule; src/klstudy/claims_rule.py). Each row compares a candidate with a baseline "
        "on one metric, "
        "paired by training seed (the same data order): effect = candidate − baseline, the mean over seeds. Runs: a "
        "run that did not finish ok, with every planned step and finite values, moves a metric measured during "
        "training to the last step every run of the row reached (column step), or leaves its seed out of a metric of "
        "the final policy; the note names it. se: the spread of the paired differences over seeds / √n, never below "
        "the measurements' own error; against the base model's one evaluation, plus that evaluation's error; pair_by "
        "questions: over seeds and held-out questions both. One seed: not testable (the spread between seeds, which "
        f"a claim is judged against, is unknown). z = effect / se towards the prediction; critical = "
        f"max({rule['min_z']}, Student's t at 1 − {rule['alpha']}, seeds − 1 degrees of freedom); p = P(t ≥ z). "
        f"higher/lower: shown when z ≥ critical and {fdr}'s step-up procedure over the table's judged higher/lower "
        f"rows, at false-discovery rate q = {rule['q']} with thresholds capped at {rule['alpha']}, takes the row in "
        "(q_value: the smallest q at which it would); contradicted likewise the other way; else not shown. same: "
        "shown if candidate − (1 ± margin)·baseline, paired by seed, lies below zero at +margin and above it at "
        "−margin, each by critical·se (two one-sided tests: the margin's own noise in their errors), contradicted if "
        "either end is crossed by critical·se the other way. Promised: a "
        f"row whose claim is false is shown with probability at most {rule['alpha']}, so at most {rule['alpha']} × "
        "the rows judged are expected false shown; of the rows shown, the expected fraction false is at most "
        f"{rule['q']} ({FDR_VALID_UNDER[rule['fdr']]})."
        + (table_sentence(table, rule) if table is not None else "")
        + " Metrics: "
        + "; ".join(f"{name}: {text}" for name, text in METRICS.items())
        + "."
        + (base_models_sentence(cells) if cells is not None else "")
    )
