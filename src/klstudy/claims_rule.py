"""The rule every claim is judged by: paired tests, false-discovery control and verdicts.

The verdict rule (config ``claims_rule``: alpha, min_z, q, fdr) is the same for every run and for every table of
claims: the runs' (report/claims.py), the toy's and the atlas's (analysis/). It was chosen for what it promises
(below) and checked on simulated grids (tests/test_claims_calibration.py), not for the verdicts it gives.

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

import math

import numpy as np
import pandas as pd
from scipy.stats import t as student_t

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
# Paired tests: one row's effect, error and degrees of freedom.


def _per_question(frame: pd.DataFrame, seeds) -> np.ndarray | None:
    scores = [frame.per_question.get(seed) for seed in seeds] if "per_question" in frame else [None]
    if not all(isinstance(s, list) for s in scores) or len({len(s) for s in scores}) != 1:
        return None
    return np.array(scores, dtype=float)


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
