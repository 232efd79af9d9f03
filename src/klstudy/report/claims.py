"""The claims table: which of the paper's claims a run shows, by how much, and with what error.

Each claim (config ``claims``) compares a candidate KL configuration with a baseline (another configuration, the same
one at another β, or the base model) on one metric, and predicts the sign of the difference: from the paper, or from
Table 1's exact computation in the toy model (``predicted: table1``, for the KL to the reference against no KL).

The verdict rule (config ``claims_rule``: alpha, min_z, q, fdr), the same for every run, chosen for what it promises
(below) and checked on simulated grids (tests/test_claims_calibration.py), not for the verdicts it gives.

Which runs enter a row. A run counts as whole when cells.csv says ``ok``, it trained every planned step and each of
its values is finite. Metrics measured during training (final_kl, heldout, and a trend over β) are compared at one
common step: the last one that every run of the row reached with finite values (the end of training when all are
whole); metrics of the final policy (evaluation, forward_kl, entropy) leave out each seed whose runs are not all
whole. The note names every run that moved the step or was left out, with its status and step, and every run of the
grid that has no results.

Paths. For seed s, candidate and baseline of the same study, model and seed share the data order: d_s = candidate −
baseline. n: the seeds left; every path needs n ≥ 2, since the spread between training seeds is what a claim about a
configuration must be judged against, and one run says nothing of it.

    seeds      effect = mean d_s; se² = max(var(d_s)/n, floor²), floor: the measurements' own error of the mean
               difference (over questions; over a run's last steps for final_kl, aggregate.window_mean), which two or
               three seeds can undercut by chance; df = n − 1
    base, once (evaluation against the base model: one lm-eval evaluation for every seed) d_s = candidate_s − base;
               se² = max(var(d_s)/n, floor²) + se_base²: the base model's own error enters once, since the seeds'
               spread cannot hold it; df = n − 1
    questions  (pair_by questions) d_sq = candidate − baseline of seed s on held-out question q, the same Q questions
               on both sides (the same held-out set, checked); effect = mean d_sq; se² = max(var(row means),
               MS_residual/Q)/n + var(column means)/Q: seeds and questions both random (two levels; it counts the
               residual twice, so it errs large); df = n − 1
    trend      (beta: trend) d_s: seed s's least-squares slope of the metric over log10 β across the grid (per decade
               of β) against zero, as seeds, the floor from each β's own error
    one seed   not testable: one seed (and no runs: not testable: no paired runs)

Per row: critical = max(min_z, Student's t quantile at 1 − alpha, df); z = effect / se, signed towards the prediction;
p = P(T_df ≥ z), one-sided.
    same       m = margin × |B|, B the baseline's mean; two one-sided tests, each paired like the effect itself:
               above_s = c_s − (1 + margin·sign B)·b_s and below_s = c_s − (1 − margin·sign B)·b_s per seed (a trend:
               its slope ∓ margin × the metric at the smallest β), so that the margin's own noise is in their errors;
               shown if mean(above) + critical·se(above) ≤ 0 and mean(below) − critical·se(below) ≥ 0 (with an
               exact margin: the whole interval effect ± critical·se inside ±m); z = the smaller of the two, in se;
               contradicted if either end is crossed by more than critical·se; else not shown
    higher, lower   judged together, over the table's m rows that could be judged: p' = p where z ≥ min_z, else 1;
               shown when the step-up procedure with thresholds min(q·k/m, alpha) on the k-th smallest p' (fdr: bh,
               Benjamini–Hochberg capped at alpha; fdr: by, Benjamini–Yekutieli, q·k/(m·H_m)) takes the row in;
               contradicted: the same over the opposite direction's p'; else not shown. q_value: the smallest q at
               which the row would be shown (contradicted where z < 0); 1 where no q would. A row given a bound m
               (the toy's tolerance) is judged on z = (effect − m)/se (higher) or −(effect + m)/se (lower): beyond m

Promises (normal d_s, independent seeds): a higher/lower row whose claim is false (no difference, or the other way)
is shown with probability at most alpha, on every path (a row shown has p ≤ alpha and z ≥ min_z, so z ≥ critical; the
floor, the two-level error and the base model's error only make se larger); hence at most alpha × m false shown rows
are expected in the table, whatever the rows' dependence. Of the rows shown, the expected fraction false is at most q
(bh: rows independent or positively dependent; by: any dependence). A same row whose true difference lies outside its
margin (margin × the baseline's true mean) is shown with probability at most alpha: each one-sided test holds alpha
with the margin's noise in its error. Losing a run never makes shown easier: the critical value does not
fall as seeds go, and one seed is not testable.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
from scipy.stats import t as student_t

from klstudy.aggregate import window_mean
from klstudy.config import baseline_beta_of, selected_betas

METRICS = {
    "final_kl": "KL(π_θ‖π_ref) at the end of training (K3 estimate, mean of the last final_steps steps)",
    "heldout": "held-out pass@1 at the last evaluation during training",
    "evaluation": "lm-eval mean@k of the final policy, mean over the claim's tasks",
    "forward_kl": "forward KL(π_ref‖π_θ) at the last saved snapshot, mean over the claim's tasks (Fig. 12)",
    "entropy": "token entropy of π_θ at the last saved snapshot, mean over the claim's tasks (Fig. 12)",
}
DURING_TRAINING = ("final_kl", "heldout")  # compared at a common step; the others measure the final policy
BASE = "base"  # the baseline "base": the base model (a run's step 0, or its lm-eval evaluation)

# Every verdict string the table writes.
SHOWN, NOT_SHOWN, CONTRADICTED, NO_PREDICTION = "shown", "not shown", "contradicted", "no prediction"
NOT_TESTABLE = {
    "one seed": "one run per side: the spread between training seeds, a claim's error, is unknown",
    "no paired runs": "no seed has results on both sides",
    "no error estimate": "the differences are all equal and the measurements' own errors unknown",
    "no common step": "the runs share no evaluation after step 0",
    "different questions": "the two sides were evaluated on different held-out questions",
    "no margin": "Table 1 predicts no difference, and the claim gives no margin to judge it by",
    "no fixed point": "the exact expected update has no stable fixed point: the runs have no end point to compare",
}
FDR_NAMES = {"bh": "Benjamini–Hochberg", "by": "Benjamini–Yekutieli"}
FDR_VALID_UNDER = {"bh": "rows independent or positively dependent", "by": "any dependence between rows"}
VERDICTS = (SHOWN, NOT_SHOWN, CONTRADICTED, NO_PREDICTION, *(f"not testable: {why}" for why in NOT_TESTABLE))

COLUMNS = [
    "claim", "text", "paper", "metric", "study", "model", "base_model", "candidate", "baseline", "beta",
    "baseline_beta", "predicted", "basis", "candidate_mean", "baseline_mean", "effect", "se", "z", "critical", "df",
    "p", "q_value", "pair_by", "units", "seeds", "runs", "step", "verdict", "note",
]  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------
# The statistics: vectorised over rows, so that the calibration tests run the very code the table uses.


def seed_level(d, floor=0.0, shared_var=0.0):
    """(effect, se, df) per row of ``d`` (rows × seeds, NaN where a seed is absent): the mean difference, its error
    from the seeds' spread, never below ``floor`` (the measurements' own error of the mean; NaN: none), plus a
    variance measured once for every seed (``shared_var``, the base model's); df = n − 1. se NaN where n < 2."""
    d = np.atleast_2d(np.asarray(d, dtype=float))
    present = np.isfinite(d)
    n = present.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        effect = np.where(present, d, 0.0).sum(axis=1) / n
        spread = np.where(present, d - effect[:, None], 0.0) ** 2
        spread = spread.sum(axis=1) / (n - 1) / n
    floor2 = np.nan_to_num(np.asarray(floor, dtype=float) ** 2, nan=0.0)
    se = np.sqrt(np.maximum(spread, floor2) + np.asarray(shared_var, dtype=float))
    enough = n >= 2
    return effect, np.where(enough, se, np.nan), np.where(enough, n - 1, 0)


def question_level(d):
    """(effect, se, df) per row of ``d`` (rows × seeds × questions): the two-level error of the module's docstring,
    seeds and questions both random; df = seeds − 1; se NaN with one seed."""
    d = np.asarray(d, dtype=float)
    if d.ndim == 2:
        d = d[None]
    _, seeds, questions = d.shape
    effect = d.mean(axis=(1, 2))
    if seeds < 2 or questions < 2:
        return effect, np.full_like(effect, np.nan), np.zeros(len(effect), dtype=int)
    row_means, column_means = d.mean(axis=2), d.mean(axis=1)
    residual = d - row_means[:, :, None] - column_means[:, None, :] + effect[:, None, None]
    ms_residual = (residual**2).sum(axis=(1, 2)) / ((seeds - 1) * (questions - 1))
    between_seeds = np.maximum(row_means.var(axis=1, ddof=1), ms_residual / questions) / seeds
    between_questions = column_means.var(axis=1, ddof=1) / questions
    return effect, np.sqrt(between_seeds + between_questions), np.full(len(effect), seeds - 1)


def critical_value(df, rule: dict):
    """max(min_z, Student's t quantile at 1 − alpha with df degrees of freedom); NaN where df < 1."""
    df = np.asarray(df, dtype=float)
    with np.errstate(invalid="ignore"):
        t = student_t.ppf(1 - rule["alpha"], np.where(df >= 1, df, np.nan))
    return np.maximum(rule["min_z"], t)


def one_sided_p(z, df, rule: dict):
    """p' of the module's docstring: P(T_df ≥ z) where z ≥ min_z, else 1 (never smaller than the plain p: valid)."""
    z, df = np.asarray(z, dtype=float), np.asarray(df, dtype=float)
    with np.errstate(invalid="ignore"):
        p = student_t.sf(z, np.where(df >= 1, df, np.nan))
        return np.where(np.isnan(z), np.nan, np.where(z >= rule["min_z"], p, 1.0))


def q_values(p, rule: dict):
    """Per p' (NaN: not in the family): the smallest q at which the capped step-up procedure (module docstring) takes
    the row in, 1 where none would; with m judged rows, the k-th smallest p' needs p' ≤ min(q·k/(m·c), alpha),
    c = 1 (bh) or Σ 1/i up to m (by)."""
    p = np.asarray(p, dtype=float)
    out = np.full(p.shape, np.nan)
    judged = np.flatnonzero(np.isfinite(p))
    m = len(judged)
    if m == 0:
        return out
    c = float(np.sum(1.0 / np.arange(1, m + 1))) if rule["fdr"] == "by" else 1.0
    order = judged[np.argsort(p[judged], kind="stable")]
    ordered = p[order]
    level = np.where(ordered <= rule["alpha"], ordered * m * c / np.arange(1, m + 1), np.inf)
    smallest_from_here = np.minimum.accumulate(level[::-1])[::-1]  # a row is taken in with any later one
    out[order] = np.minimum(smallest_from_here, 1.0)
    return out


def judge(effect, se, df, direction, margin_bound, rule: dict, at_margin=None) -> dict:
    """Per row (arrays; direction higher, lower or same, anything else none; margin_bound: the row's m, NaN or 0 for
    none): z, critical, p, q_value and the verdict by the module's rule. A row without a finite, positive se and
    df ≥ 1 gets NaN and "not shown": the caller names why it could not be judged.

    Each row is judged on its distance to each end of its margin: above = effect − m (beyond +m when positive) and
    below = effect + m (beyond −m when negative), with their standard errors. ``at_margin``: (above, se_above, below,
    se_below) measured seed by seed, for a margin taken from an estimated baseline (c_s − (1 ± m)·b_s: its noise is
    then in the error); NaN entries, or None, fall back to effect ∓ m with se (a margin known exactly)."""
    effect, se, df = (np.asarray(x, dtype=float) for x in (effect, se, df))
    bound = np.nan_to_num(np.broadcast_to(np.asarray(margin_bound, dtype=float), effect.shape))
    above, se_above, below, se_below = effect - bound, se, effect + bound, se
    if at_margin is not None:
        measured = [np.asarray(x, dtype=float) for x in at_margin]
        known = np.isfinite(measured[0]) & np.isfinite(measured[2])
        above, se_above, below, se_below = (np.where(known, m, x) for m, x in
                                            zip(measured, (above, se_above, below, se_below), strict=True))  # fmt: skip
    direction = np.array([x if x in ("higher", "lower", "same") else "" for x in direction], dtype=object)
    testable = np.isfinite(se) & (se > 0) & np.isfinite(se_above) & np.isfinite(se_below) & (df >= 1)
    testable &= direction != ""
    directional = testable & (direction != "same")
    same = testable & (direction == "same")
    critical = np.where(testable, critical_value(df, rule), np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        beyond_above, beyond_below = above / se_above, -below / se_below  # in se: beyond +m, beyond −m
        z = np.where(direction == "higher", beyond_above, beyond_below)
        z = np.where(same, np.minimum(-beyond_above, -beyond_below), z)  # two one-sided tests: inside both ends
        z = np.where(testable, z, np.nan)
        p = np.where(testable, student_t.sf(z, np.where(testable, df, 1.0)), np.nan)
        outside = np.maximum(beyond_above, beyond_below) > critical
    q_shown = q_values(np.where(directional, one_sided_p(z, df, rule), np.nan), rule)
    q_contradicted = q_values(np.where(directional, one_sided_p(-z, df, rule), np.nan), rule)
    verdict = np.full(len(effect), NOT_SHOWN, dtype=object)
    verdict[directional & (q_shown <= rule["q"])] = SHOWN
    verdict[directional & (q_contradicted <= rule["q"])] = CONTRADICTED
    verdict[same & (z >= critical)] = SHOWN
    verdict[same & outside] = CONTRADICTED
    return dict(z=z, critical=critical, p=p, q_value=np.where(z < 0, q_contradicted, q_shown), verdict=verdict)


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
        per_question = run.per_prompt if "per_prompt" in run else pd.Series(None, index=run.index)
        series[int(seed)] = pd.DataFrame(
            {"value": run.pass_at_1.astype(float), "se": run.stderr.astype(float),
             "per_question": [json.loads(v) if isinstance(v, str) else None for v in per_question]},
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


def _per_question(frame: pd.DataFrame, seeds) -> np.ndarray | None:
    scores = [frame.per_question.get(seed) for seed in seeds] if "per_question" in frame else [None]
    if not all(isinstance(s, list) for s in scores) or len({len(s) for s in scores}) != 1:
        return None
    return np.array(scores, dtype=float)


def heldout_questions(config: dict, study: str) -> str:
    """What identifies a study's held-out questions: its held-out set's name and definition (the data config entry,
    from which the questions are generated or read)."""
    name = config["studies"][study]["heldout_data"]
    return f"{name} {json.dumps(config['data'].get(name), sort_keys=True)}"


def paired_test(
    candidate: pd.DataFrame, baseline: pd.DataFrame, pair_by: str, same_questions: bool = True, scale: float = 1.0
) -> dict:
    """effect, se, df, units, seeds, note and why (not testable: the key of NOT_TESTABLE, or None) of the paired
    comparison (module docstring) of candidate − scale × baseline. A baseline indexed ["base"] is one measurement
    shared by every seed."""
    shared = list(baseline.index) == [BASE]
    seeds = list(candidate.index) if shared else list(candidate.index.intersection(baseline.index))
    out = dict(effect=math.nan, se=math.nan, df=0, units=len(seeds), seeds=len(seeds), note="", why=None)
    if not seeds or (shared and baseline.empty):
        return {**out, "why": "no paired runs"}
    c = candidate.loc[seeds]
    b = baseline if shared else baseline.loc[seeds]
    d = (c.value.to_numpy(float) - scale * (b.value.iloc[0] if shared else b.value.to_numpy(float)))[None]
    if pair_by == "questions":
        if not same_questions:
            return {**out, "effect": float(d.mean()), "why": "different questions"}
        scores = (_per_question(c, seeds), _per_question(b, seeds))
        if scores[0] is not None and scores[1] is not None:
            if scores[0].shape != scores[1].shape:  # as many scores a seed on each side, but not the same questions
                return {**out, "effect": float(d.mean()), "why": "different questions"}
            effect, se, df = (x[0] for x in question_level(scores[0] - scale * scores[1]))
            units = scores[0].shape[1]
            return {**out, "effect": effect, "se": se, "df": df, "units": units, "why": why_untestable(len(seeds), se)}
        out["note"] = "no per-question scores on both sides: paired by seed"
    own = c.se.astype(float) ** 2
    if not shared:
        own = own + scale**2 * b.se.astype(float).to_numpy() ** 2
    floor = math.sqrt(own.sum(skipna=False)) / len(seeds)  # NaN where some run's error is unknown: no floor
    shared_var = scale**2 * float(b.se.iloc[0]) ** 2 if shared else 0.0
    effect, se, df = (x[0] for x in seed_level(d, floor, shared_var))
    if shared and math.isnan(shared_var):
        se = math.nan
    if len(seeds) > 1 and not math.isnan(floor) and floor**2 > np.var(d, ddof=1) / len(seeds):
        out["note"] = "; ".join(filter(None, [out["note"], "the measurements' own error exceeds the seeds' spread"]))
    return {**out, "effect": effect, "se": se, "df": df, "why": why_untestable(len(seeds), se)}


def margin_ends(candidate, reference, pair_by, margin, same_questions=True, offset=1.0) -> dict:
    """above, se_above, below, se_below of a same claim whose margin m·|B| is taken from the reference's mean B over
    the paired seeds: candidate − (offset ± m·sign B) × reference, paired seed by seed as the effect itself (offset
    1: the effect is candidate − reference; 0: the effect is the candidate itself, a trend's slope). The margin's own
    noise is then in each end's error, so a true difference on the margin is shown at most at rate alpha; a margin
    from the mean alone, its noise left out, is shown more often (tests/test_claims_calibration.py)."""
    shared = list(reference.index) == [BASE]
    paired = reference.index if shared else candidate.index.intersection(reference.index)
    sign = float(np.sign(reference.loc[paired].value.mean())) if len(paired) else math.nan
    if not np.isfinite(margin) or not np.isfinite(sign):
        return dict(above=math.nan, se_above=math.nan, below=math.nan, se_below=math.nan)
    ends = [paired_test(candidate, reference, pair_by, same_questions, offset + s * margin * sign) for s in (1, -1)]
    return dict(above=ends[0]["effect"], se_above=ends[0]["se"], below=ends[1]["effect"], se_below=ends[1]["se"])


def why_untestable(seeds: int, se: float) -> str | None:
    """Why paired differences of ``seeds`` seeds with standard error ``se`` cannot be judged (a key of NOT_TESTABLE),
    or None."""
    if seeds == 0:
        return "no paired runs"
    if seeds == 1:
        return "one seed"
    return None if se > 0 else "no error estimate"


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
    if claim["beta"] == "trend":
        return [trend_row(name, claim, config, runs, direction, basis, model, betas) for model in study["models"]]
    same_questions = heldout_questions(config, claim["study"]) == heldout_questions(config, baseline_study)
    rows = []
    for model in study["models"]:
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


MARGIN_ENDS = ["above", "se_above", "below", "se_below"]  # margin_ends' columns: a same row's two one-sided tests


def judged(rows: pd.DataFrame, rule: dict) -> pd.DataFrame:
    """The rows with z, critical, p, q_value and verdict (module docstring): one table-wide judgement, the one every
    table of claims goes through (the toy's too). ``rows``: predicted, effect, se, df, why (a key of NOT_TESTABLE, or
    NaN), and a same row's margin: ``bound`` (m in the metric's units) or ``margin`` × |baseline_mean|, with
    MARGIN_ENDS where the margin comes from an estimated baseline (margin_ends)."""
    direction = rows.predicted.where(rows.predicted != "none", None)
    if "bound" in rows:  # given for every row (the toy's tolerance: a directional row must go beyond it)
        bound = pd.to_numeric(rows.bound, errors="coerce")
    else:  # the claims table: a same claim's margin, a fraction of the baseline
        bound = (pd.to_numeric(rows.margin, errors="coerce") * rows.baseline_mean.abs()).where(direction == "same")
    no_margin = (direction == "same") & bound.isna() & rows.why.isna()
    why = rows.why.where(~no_margin, "no margin")
    testable = why.isna()
    se = rows.se.where(testable, np.nan)
    ends = [rows[c] for c in MARGIN_ENDS] if set(MARGIN_ENDS) <= set(rows) else None
    out = judge(rows.effect, se, rows.df, direction.where(testable, None), bound, rule, ends)
    verdict = pd.Series(out.pop("verdict"), index=rows.index)
    verdict[~testable] = "not testable: " + why[~testable]
    verdict[direction.isna()] = NO_PREDICTION
    return rows.assign(**out, verdict=verdict)


def claims_table(config: dict, tables: dict, tests: pd.DataFrame) -> pd.DataFrame:
    """Every claim of config ``claims``, one row per model and β; empty (with the columns) when there are none."""
    runs = RunTables(tables)
    rows = [
        row for name, claim in config.get("claims", {}).items() for row in claim_rows(name, claim, config, runs, tests)
    ]
    work = pd.DataFrame(rows, columns=[*COLUMNS, "margin", "why", *MARGIN_ENDS])
    table = judged(work, config["claims_rule"]) if len(work) else work
    table = table[COLUMNS].copy()
    digests = base_model_digests(tables["cells"])  # a column, since the report shows the CSV, not the caption
    table["base_model"] = [", ".join(digests.get(model, [])) for model in table.model]
    numbers = ["candidate_mean", "baseline_mean", "effect", "se", "z", "critical", "p", "q_value"]
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
        "every run (claims_rule; src/klstudy/claims.py). Each row compares a candidate with a baseline on one metric, "
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
