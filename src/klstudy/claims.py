"""The claims table: which of the paper's claims a run shows, by how much, and with what error.

Each claim (config ``claims``) compares a candidate KL configuration with a baseline (another configuration, the same
one at another β, or the base model) on one metric, and predicts the sign of the difference: from the paper, or from
Table 1's exact computation in the toy model (``predicted: table1``, for the KL to the reference against no KL).

The verdict rule (config ``claims_rule``), written down before any run was looked at:

    d_u       candidate − baseline for each paired unit u: a training seed (the same study, model and seed: the same
              data order), or, with ``pair_by: questions`` (held-out pass@1), a held-out question, its score averaged
              over the seeds
    effect    mean of d_u over the n units
    se        standard deviation of d_u / √n, df = n − 1, but never below the measurement's own standard error of the
              mean difference (over questions; over a run's last steps for final_kl), which two or three seeds can
              undercut by chance; with one seed, that measurement error alone (df = ∞)
    critical  max(min_z, Student's t quantile at 1 − alpha with df degrees of freedom): at least min_z standard
              errors, more where few units make the standard error itself uncertain
    z         effect / se, signed so that the predicted direction is positive
    trend     (beta: trend) d_u is seed u's least-squares slope of the metric over log10 β across the study's β grid
              (per decade of β), against zero: a claim that the metric falls (or rises) as β grows, tested once over
              the whole grid instead of at each step
    higher, lower   shown if z ≥ critical, contradicted if z ≤ −critical, else not shown
    same      with m = margin × |baseline mean|: shown if |effect| + critical·se ≤ m (the whole interval inside ±m),
              contradicted if |effect| − critical·se > m (the whole interval outside), else not shown

Under no true difference (normal d_u), a higher/lower claim is called shown with probability at most alpha: the rule's
error rate, stated in the table's caption.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
from scipy.stats import t as student_t

from klstudy.aggregate import final_values, stderr_of_mean
from klstudy.config import baseline_beta_of, selected_betas

METRICS = {
    "final_kl": "KL(π_θ‖π_ref) at the end of training (K3 estimate, mean of the last final_steps steps)",
    "heldout": "held-out pass@1 at the last evaluation during training",
    "evaluation": "lm-eval mean@k of the final policy, mean over the claim's tasks",
    "forward_kl": "forward KL(π_ref‖π_θ) at the last saved snapshot, mean over the claim's tasks (Fig. 12)",
    "entropy": "token entropy of π_θ at the last saved snapshot, mean over the claim's tasks (Fig. 12)",
}
BASE = "base"  # the baseline "base": the base model (a run's step 0, or its lm-eval evaluation)
COLUMNS = [
    "claim", "text", "paper", "metric", "study", "model", "base_model", "candidate", "baseline", "beta",
    "baseline_beta", "predicted", "basis", "candidate_mean", "baseline_mean", "effect", "se", "z", "critical",
    "pair_by", "units", "seeds", "runs", "verdict", "note",
]  # fmt: skip


def _cell_rows(table: pd.DataFrame, study: str, model: str, kl: str, beta: float) -> pd.DataFrame:
    rows = table[(table.study == study) & (table.model == model) & (table.kl == kl)]
    return rows if kl == "none" else rows[np.isclose(rows.beta.astype(float), beta)]


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
    task's is); a seed that lacks a task is left out."""
    rows = rows[rows.task.isin(tasks)].dropna(subset=[value])
    grouped = rows.groupby("seed")
    out = pd.DataFrame(
        {
            "value": grouped[value].mean(),
            "se": grouped[stderr].apply(stderr_of_mean),
            "tasks": grouped.task.nunique(),
        }
    )
    return out[out.tasks == len(tasks)].drop(columns="tasks")


def _last(rows: pd.DataFrame, step: str = "step") -> pd.DataFrame:
    """Each seed's rows at its last step."""
    last = rows.groupby("seed")[step].transform("max")
    return rows[rows[step] == last]


def metric_values(metric: str, tables: dict, config: dict, claim: dict, study, model, kl, beta) -> pd.DataFrame:
    """``tables``: the aggregated tables and final_kl (aggregate.final_values). Per seed (the index): value, se (the
    measurement's own standard error: over questions, or over a run's last steps for final_kl) and, for held-out
    pass@1, per_question (each question's score). kl "base": the base model, measured as the cell ``study, model,
    claim['candidate'], beta`` measures it."""
    empty = pd.DataFrame(columns=["value", "se"])
    if metric == "final_kl":
        rows = _cell_rows(tables["final_kl"], study, model, kl, beta)
        return pd.DataFrame({"value": rows.kl_k3.values, "se": rows.kl_k3_stderr.values}, index=rows.seed.values)
    if metric == "heldout":
        base = kl == BASE
        rows = _cell_rows(tables["heldout"], study, model, claim["candidate"] if base else kl, beta)
        if rows.empty:
            return empty
        rows = rows[rows.step == 0] if base else _last(rows)
        per_question = rows.per_prompt if "per_prompt" in rows else pd.Series(None, index=rows.index)
        return pd.DataFrame(
            {
                "value": rows.pass_at_1.values,
                "se": rows.stderr.values,
                "per_question": [json.loads(v) if isinstance(v, str) else None for v in per_question],
            },
            index=rows.seed.values,
        )
    tasks = _tasks(claim, config, metric)
    if metric == "evaluation":
        evaluations = tables["evaluations"]
        if kl == BASE:  # one evaluation of the base model (chat template on, as the trained cells), every seed's
            rows = evaluations[(evaluations.study == BASE) & (evaluations.model == model)]
            rows = rows[rows.chat_template.astype(str) == "on"]
            base = _mean_over_tasks(rows, tasks, "mean_at_k", "stderr")
            seeds = config["studies"][study]["seeds"]
            return (
                pd.DataFrame({"value": base.value.iloc[0], "se": base.se.iloc[0]}, index=seeds) if len(base) else empty
            )
        return _mean_over_tasks(_cell_rows(evaluations, study, model, kl, beta), tasks, "mean_at_k", "stderr")
    rows = _cell_rows(tables["divergence"], study, model, claim["candidate"] if kl == BASE else kl, beta)
    rows = rows[rows.step == 0] if kl == BASE else _last(rows)
    return _mean_over_tasks(rows, tasks, metric, f"{metric}_stderr")


def expected_pull(tests: pd.DataFrame, kl_config: str) -> str:
    """What Table 1's exact computation predicts configuration ``kl_config`` does to KL(π_θ‖π_ref) on-policy, from
    the projection of its expected gradient on the KL's (its row of toy.unbiasedness_tests' ``tests``)."""
    rows = tests[tests.config == kl_config] if "config" in tests else tests.iloc[:0]
    test = rows.iloc[0].to_dict() if len(rows) else None
    if test is None or pd.isna(test.get("min_projection", float("nan"))):
        return "not analysed"
    if test.get("exact_unbiased") is True:
        return "pulls towards π_ref (the KL's own gradient)"
    if max(abs(test["min_projection"]), abs(test["max_projection"])) < 1e-9:
        return "no pull (zero expected gradient)"
    if test["min_projection"] > 0:
        return "pulls towards π_ref (biased: not the KL's gradient)"
    return "may push away (opposes the KL's gradient in some settings)"


def predicted_direction(claim: dict, tests: pd.DataFrame) -> tuple[str | None, str]:
    """(higher | lower | same | None, its basis). table1: from the projection of the configuration's exact expected
    gradient on the KL's (expected_pull): a pull predicts a lower KL than no KL, no pull the same KL."""
    if claim["predicted"] != "table1":
        return claim["predicted"], claim.get("paper", "the paper")
    pull = expected_pull(tests, claim["candidate"])
    direction = "lower" if pull.startswith("pulls") else "same" if pull.startswith("no pull") else None
    return direction, f"Table 1 exact: {pull}"


def _paired(candidate: pd.DataFrame, baseline: pd.DataFrame, pair_by: str, over_steps: bool = False):
    """(differences d_u, their standard error or NaN, df, units, seeds, note). over_steps: the measurement's error
    is over a run's last steps (final_kl), which says nothing of another seed: a floor only, never the error of a
    single seed."""
    seeds = candidate.index.intersection(baseline.index)
    c, b = candidate.loc[seeds], baseline.loc[seeds]
    if len(seeds) == 0:
        return np.array([]), math.nan, 0, 0, 0, "no paired runs"
    if pair_by == "questions":
        have = all(isinstance(v, list) for v in [*c.per_question, *b.per_question])
        lengths = {len(v) for v in [*c.per_question, *b.per_question]} if have else set()
        if have and len(lengths) == 1:
            per_seed = np.array(list(c.per_question)) - np.array(list(b.per_question))
            d = per_seed.mean(axis=0)
            se = d.std(ddof=1) / math.sqrt(len(d)) if len(d) > 1 else math.nan
            return d, se, len(d) - 1, len(d), len(seeds), ""
        note = "no per-question scores: unpaired error over questions"
        d = (c.value - b.value).to_numpy()
        se = math.sqrt((c.se**2 + b.se**2).sum()) / len(seeds)
        return d, se, math.inf, len(seeds), len(seeds), note
    d = (c.value - b.value).to_numpy(dtype=float)
    # The measurement's own error of the mean difference (questions, or a run's last steps for final_kl): a floor
    # under the spread over seeds, which two or three seeds can put near zero by chance (equal differences).
    # NaN where some run's error is unknown (not a smaller floor): then the seeds' spread alone, or no error at all.
    measured = math.sqrt(float((c.se.astype(float) ** 2 + b.se.astype(float) ** 2).sum(skipna=False))) / len(d)
    if len(d) > 1:
        over_seeds = d.std(ddof=1) / math.sqrt(len(d))
        if measured > over_seeds:
            return d, measured, len(d) - 1, len(d), len(d), "the measurement's own error exceeds the seeds' spread"
        return d, over_seeds, len(d) - 1, len(d), len(d), ""
    if math.isnan(measured) or over_steps:
        return d, math.nan, 0, 1, 1, "one seed: no error over seeds, and none over questions for this metric"
    return d, measured, math.inf, 1, 1, "one seed: the measurement's own error only"


def verdict(effect: float, se: float, df: float, direction: str | None, baseline_mean: float, rule: dict, margin=None):
    """(z, critical, verdict) by the module's rule."""
    if direction is None:
        return math.nan, math.nan, "no prediction"
    if not (se > 0) or df < 1:  # NaN, zero or a single unit: no error estimate
        return math.nan, math.nan, "not shown"
    critical = max(rule["min_z"], float(student_t.ppf(1 - rule["alpha"], df)))
    if direction == "same":
        bound = margin * abs(baseline_mean)
        z = (bound - abs(effect)) / se  # how many standard errors the effect lies inside the margin
        word = "shown" if z >= critical else "contradicted" if abs(effect) - critical * se > bound else "not shown"
        return z, critical, word
    z = (effect if direction == "higher" else -effect) / se
    return z, critical, "shown" if z >= critical else "contradicted" if z <= -critical else "not shown"


def trend_values(metric: str, tables: dict, config: dict, claim: dict, model, betas: list[float]):
    """(slopes, values) for the seeds with a value at every β of ``betas``: values, the metric (a column per β);
    slopes, its least-squares slope over log10 β (per decade of β), se NaN (the slopes' spread over seeds is their
    error)."""
    kl, study = claim["candidate"], claim["study"]
    at = {beta: metric_values(metric, tables, config, claim, study, model, kl, beta).value for beta in betas}
    values = pd.concat(at, axis=1).dropna()
    x = np.log10(np.asarray(betas, dtype=float))
    x -= x.mean()
    slopes = values.to_numpy(dtype=float) @ x / (x @ x)
    return pd.DataFrame({"value": slopes, "se": math.nan}, index=values.index), values


def _claim_columns(name: str, claim: dict, direction: str | None) -> dict:
    """The columns every row of a claim shares."""
    return dict(claim=name, text=claim["text"], paper=claim.get("paper", ""), metric=claim["metric"],
                study=claim["study"], candidate=claim["candidate"], predicted=direction or "none")  # fmt: skip


def claim_rows(name: str, claim: dict, config: dict, tables: dict, tests: pd.DataFrame) -> list[dict]:
    """One row per model of the claim's study and per selected β."""
    study = config["studies"][claim["study"]]
    baseline_study = claim.get("baseline_study", claim["study"])
    metric, pair_by = claim["metric"], claim["pair_by"]
    direction, basis = predicted_direction(claim, tests)
    rows = []
    betas = study["betas"]
    if metric in ("forward_kl", "entropy"):  # only the divergence section's cells save snapshots
        betas = [beta for beta in betas if beta in config["divergence"]["betas"]]
    betas = [0.0] if claim["candidate"] == "none" else selected_betas(claim["beta"], betas)  # no KL: once, at β = 0
    if claim["beta"] == "trend":
        return [trend_row(name, claim, config, tables, direction, basis, model, betas) for model in study["models"]]
    for model in study["models"]:
        for beta in betas:
            baseline_beta = baseline_beta_of(claim["baseline_beta"], beta, config["studies"][baseline_study]["betas"])
            if baseline_beta is None:  # "below" at the study's smallest β: nothing to compare with
                continue
            candidate = metric_values(metric, tables, config, claim, claim["study"], model, claim["candidate"], beta)
            baseline = metric_values(
                metric, tables, config, claim, baseline_study, model, claim["baseline"], baseline_beta
            )
            d, se, df, units, seeds, note = _paired(candidate, baseline, pair_by, over_steps=metric == "final_kl")
            effect = float(d.mean()) if len(d) else math.nan
            paired = candidate.index.intersection(baseline.index)
            baseline_mean = float(baseline.loc[paired].value.mean()) if len(paired) else math.nan
            z, critical, word = verdict(effect, se, df, direction, baseline_mean, config["claims_rule"],
                                        claim.get("margin"))  # fmt: skip
            rows.append(
                dict(
                    **_claim_columns(name, claim, direction), model=model,
                    baseline=claim["baseline"] if baseline_study == claim["study"] else
                    f"{claim['baseline']} ({baseline_study})",
                    beta=beta, baseline_beta=baseline_beta if claim["baseline"] not in ("none", BASE) else "",
                    basis=basis + (f"; margin {claim['margin']} of the baseline" if direction == "same" else ""),
                    candidate_mean=float(candidate.loc[paired].value.mean()) if len(paired) else math.nan,
                    baseline_mean=baseline_mean, effect=effect, se=se, z=z, critical=critical, pair_by=pair_by,
                    units=units, seeds=seeds, runs=len(candidate) + (len(baseline) if claim["baseline"] != BASE else 0),
                    verdict=word, note=note,
                )
            )  # fmt: skip
    return rows


def trend_row(name, claim, config, tables, direction, basis, model, betas) -> dict:
    """The one row of a ``beta: trend`` claim: the mean over seeds of the metric's slope over log10 β; beta and
    baseline_beta are the grid's largest and smallest β, candidate_mean and baseline_mean the metric there."""
    slopes, values = trend_values(claim["metric"], tables, config, claim, model, betas)
    zero = pd.DataFrame({"value": 0.0, "se": math.nan}, index=slopes.index)
    d, se, df, units, seeds, note = _paired(slopes, zero, "seeds", over_steps=True)
    effect = float(d.mean()) if len(d) else math.nan
    z, critical, word = verdict(effect, se, df, direction, math.nan, config["claims_rule"])
    grid = ", ".join(f"{beta:g}" for beta in betas)
    return dict(
        **_claim_columns(name, claim, direction), model=model, baseline=claim["candidate"], beta=max(betas),
        baseline_beta=min(betas), basis=basis,
        candidate_mean=float(values[max(betas)].mean()) if len(values) else math.nan,
        baseline_mean=float(values[min(betas)].mean()) if len(values) else math.nan,
        effect=effect, se=se, z=z, critical=critical, pair_by="seeds", units=units, seeds=seeds,
        runs=len(slopes) * len(betas), verdict=word,
        note="; ".join(filter(None, [f"trend: slope per decade of β over β = {grid}", note])),
    )  # fmt: skip


def claims_table(config: dict, tables: dict, tests: pd.DataFrame) -> pd.DataFrame:
    """Every claim of config ``claims``, one row per model and β; empty (with the columns) when there are none."""
    tables = {**tables, "final_kl": final_values(tables["training"], config)}  # once, for every final_kl claim
    rows = [
        row
        for name, claim in config.get("claims", {}).items()
        for row in claim_rows(name, claim, config, tables, tests)
    ]
    table = pd.DataFrame(rows, columns=COLUMNS)
    digests = base_model_digests(tables["cells"])  # a column, since the report shows the CSV, not the caption
    table["base_model"] = [", ".join(digests.get(model, [])) for model in table.model]
    numbers = ["candidate_mean", "baseline_mean", "effect", "se", "z", "critical"]
    table[numbers] = table[numbers].astype(float).round(4)
    return table


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


def caption(config: dict, cells: pd.DataFrame | None = None) -> str:
    """The claims table's caption; with the cells table, it names the base models the runs started from."""
    rule = config["claims_rule"]
    return (
        f"Claims ({config['scale']} scale): which of the paper's claims this run shows. Each row compares a candidate "
        "with a baseline on one metric (effect = candidate − baseline, mean over paired units: training seeds, or "
        "held-out questions averaged over seeds with pair_by questions; se: the standard deviation of the paired "
        "differences over √units, never below the measurement's own error (over questions, or a run's last steps), "
        "and with one seed the error over questions alone). Verdict, by a rule fixed "
        f"before any run was looked at: z = effect / se signed towards the prediction; critical = max({rule['min_z']}, "
        f"Student's t at 1 − {rule['alpha']} with units − 1 degrees of freedom); higher/lower: shown if z ≥ critical, "
        "contradicted if z ≤ −critical, else not shown; same: shown if the interval effect ± critical·se lies inside "
        "± margin × |baseline mean|, contradicted if it lies outside. With no true difference a claim is called shown "
        f"with probability at most {rule['alpha']}. Metrics: "
        + "; ".join(f"{name}: {text}" for name, text in METRICS.items())
        + "."
        + (base_models_sentence(cells) if cells is not None else "")
    )
