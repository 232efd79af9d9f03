"""The study's tables, from the aggregated tables and the toy model's tests: Table 1 (the bias of each estimator and
placement, and how its on-policy runs behaved), Table 2 (K1 in the reward in other libraries), the evaluation
differences, the evaluation summary, the regularisation table and the claims table (claims.py; its Markdown a short
version for reading). Each is written as CSV (every column, full precision) and as Markdown with its caption
(compact: the paper's rows first, two or three significant figures, mean ± se).

Uncertainty follows aggregate.UNCERTAINTY, as in the figures; intervals that decide a claim are the claims table's
(effect ± critical·se), and a yes/no about a claim is that table's verdict, never a comparison of means made here.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import t as student_t

from klstudy.config import STUDY_TABLES
from klstudy.kl import NO_KL
from klstudy.report.aggregate import UNCERTAINTY, final_values, mean_and_se, stderr_of_mean
from klstudy.report.claims import caption as claims_caption
from klstudy.report.claims import claims_table, expected_pull


def sig(value, digits: int = 3) -> str:
    """A number to ``digits`` significant figures, in plain notation from 0.001 to 99,999 (8772.1 -> '8770',
    0.04567 -> '0.0457', 3.6e-15 -> '3.6e-15'); blank for NaN; text as it is."""
    if isinstance(value, str) or value is None:
        return "" if value is None else value
    if pd.isna(value):
        return ""
    value = float(value)
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    if not 1e-3 <= abs(value) < 1e5:
        return f"{value:.{digits}g}".replace("e-0", "e-").replace("e+0", "e")
    places = digits - 1 - math.floor(math.log10(abs(value)))  # negative: round to tens, hundreds, …
    return f"{round(value, places):.{max(places, 0)}f}"


def plus_minus(mean, se, digits: int = 2) -> str:
    """'0.31 ± 0.012': the mean to the se's second significant digit; '0.02 (no se)' where the se is unknown."""
    if pd.isna(mean):
        return ""
    if pd.isna(se) or se == 0:
        return f"{sig(mean, digits)} (no se)" if pd.isna(se) else sig(mean, digits + 1)
    decimals = max(1 - math.floor(math.log10(abs(se))), 0)  # two significant figures of the se
    return f"{mean:.{decimals}f} ± {se:.{decimals}f}"


def _cell(value) -> str:
    """A Markdown table cell: numbers to three significant figures, blank where unknown."""
    if isinstance(value, (float, np.floating)):
        return sig(value)
    return "" if value is None else str(value).replace("|", "\\|")


def _markdown(table: pd.DataFrame) -> list[str]:
    header = "| " + " | ".join(map(str, table.columns)) + " |"
    rule = "| " + " | ".join("---" for _ in table.columns) + " |"
    return [header, rule, *("| " + " | ".join(_cell(v) for v in row) + " |" for row in table.itertuples(index=False))]


def write_table(table: pd.DataFrame, md: Path, csv: Path, caption: str, sections=None) -> None:
    """The table as CSV (all of it) and as Markdown: the caption, then each (heading, compact table) of ``sections``
    (default: the table itself)."""
    Path(md).parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(csv, index=False)
    lines = [caption, ""]
    for heading, part in sections or [("", table)]:
        lines += ([f"**{heading}**", ""] if heading else []) + _markdown(part) + [""]
    Path(md).write_text("\n".join(lines))


# ---------------------------------------------------------------------------------------------------------
# Table 1.

# Table 1's "behaviour" column, from the on-policy runs of each configuration.
BEHAVIOUR_RULES = (
    "collapse: some run ended 'collapsed' (running-mean reward fell below the health rule's fraction of its best); "
    "instabilities: some run 'diverged', or its held-out pass@1 fell by more than {drop} (absolute) below its "
    "best earlier value; stable: every run finished with neither; not trained: no on-policy run of it."
)
DROP = 0.15
PAPER_TABLE1 = ("k1-reward", "k1-loss", "k3-reward", "k3-loss")  # the paper's four rows, in its order


def onpolicy_studies(config: dict) -> list[str]:
    """Studies trained on-policy: one update per generation batch, no asynchrony."""
    return [
        name
        for name, spec in config["studies"].items()
        if spec["train"]["batch_prompts"] == spec["train"]["minibatch_prompts"] and not spec["train"].get("async_level")
    ]


def behaviour(cells: pd.DataFrame, heldout: pd.DataFrame, studies: list[str], drop: float = DROP) -> dict[str, str]:
    """kl config -> stable | instabilities | collapse (with counts of runs), over the given studies' cells."""
    verdicts = {}
    for kl_config, group in cells[cells.study.isin(studies) & (cells.kl != NO_KL)].groupby("kl"):
        done = group[group.status != "missing"]
        if done.empty:
            verdicts[kl_config] = "not trained"
            continue
        collapsed = (done.status == "collapsed").sum()
        unstable = 0
        for cell in done.itertuples():
            run = heldout[
                (heldout.study == cell.study)
                & (heldout.model == cell.model)
                & (heldout.kl == cell.kl)
                & (heldout.beta == cell.beta)
                & (heldout.seed == cell.seed)
            ].sort_values("step")
            fell = (run.pass_at_1.cummax() - run.pass_at_1).max() > drop if len(run) else False
            unstable += cell.status == "diverged" or (cell.status == "ok" and fell)
        word = "collapse" if collapsed else "instabilities" if unstable else "stable"
        verdicts[kl_config] = f"{word} ({collapsed} collapsed, {unstable} unstable of {len(done)} runs)"
    return verdicts


def table1(tests: pd.DataFrame, behaviours: dict[str, str] | None = None) -> pd.DataFrame:
    """Table 1: estimator, expression, placement, how the loss term is differentiated and which framework does so,
    the verdict on the gradient's bias (toy model: exact where enumerated, and the Monte Carlo test), and the
    behaviour of the on-policy training runs of that configuration. Rows: the paper's four first (PAPER_TABLE1), then
    the other pathwise configurations, then the frameworks' per-token loss gradients; each group by estimator."""
    rows = tests[tests.placement != "none"]
    behaviours = behaviours or {}
    table = pd.DataFrame(
        {
            "config": rows.config,
            "estimator": rows.estimator.str.upper(),
            "expression": rows.expression,
            "placement": rows.placement,
            "loss_gradient": rows.loss_gradient.where(rows.placement != "reward", ""),
            "framework": rows.framework.astype(object).fillna(""),
            "unbiased_gradient": rows.unbiased.map({True: "yes", False: "no"}),
            "exact_unbiased": rows.exact_unbiased.map({True: "yes", False: "no"}).fillna(""),
            "max_abs_exact_bias": rows.get("max_abs_exact_bias", np.nan),
            "max_abs_exact_bias_T1": rows.get("max_abs_exact_bias_T1", np.nan),
            "max_abs_z": rows.max_abs_z,
            "z_critical": rows.z_critical,
            "worst_case": rows.worst_case,
            "behaviour": [behaviours.get(name, "not trained") for name in rows.config],
        }
    )
    group = np.where(table.config.isin(PAPER_TABLE1), 0, np.where(rows.loss_gradient.isin(["pathwise", ""]), 1, 2))
    order = table.config.map({name: i for i, name in enumerate(PAPER_TABLE1)}).fillna(len(PAPER_TABLE1))
    table = table.assign(_group=group, _order=order)
    # within a group: by estimator, placements in the toy's order (config toy.placements)
    table = table.sort_values(["_group", "_order", "estimator"], kind="stable")
    return table.drop(columns=["_group", "_order"]).reset_index(drop=True)


def table1_sections(table: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """Table 1 for reading: the paper's configurations (its four rows first), then the frameworks' variants."""

    def compact(rows: pd.DataFrame, framework: bool) -> pd.DataFrame:
        out = pd.DataFrame(
            {
                "config": rows.config,
                "K": rows.expression,
                "placement": rows.placement,
                "unbiased (exact)": rows.exact_unbiased,
                "max abs exact bias": rows.max_abs_exact_bias.map(lambda v: sig(v, 2)),
                "Monte Carlo max abs z (critical)": [
                    f"{sig(z, 2)} ({sig(c, 3)})" for z, c in zip(rows.max_abs_z, rows.z_critical, strict=True)
                ],
                "on-policy runs": rows.behaviour,
            }
        )
        if framework:
            out.insert(3, "loss gradient: framework", rows.loss_gradient + ": " + rows.framework)
        return out

    variants = table.loss_gradient.isin(["pathwise", ""])
    paper = table[variants & table.config.isin(PAPER_TABLE1)]
    others = table[variants & ~table.config.isin(PAPER_TABLE1)]
    return [
        ("The paper's four configurations", compact(paper, False)),
        ("The other estimators and placements", compact(others, False)),
        ("The per-token KL-loss gradients frameworks ship", compact(table[~variants], True)),
    ]


# ---------------------------------------------------------------------------------------------------------
# Evaluation: differences in points, and every score.

# §4.1's relative improvements of K1 in the reward over K3 in the loss, as the paper quotes them (β = 0.05; the paper
# says "similar trends hold for β = 0.1" without numbers). No uncertainty is quoted.
PAPER_RELATIVE_IMPROVEMENTS = [
    ("Qwen2.5-7B", 0.05, "in-domain", 6.21),
    ("Llama-3.1-8B-Instruct", 0.05, "in-domain", 15.94),
    ("Qwen2.5-7B", 0.05, "out-of-domain", 19.06),
    ("Llama-3.1-8B-Instruct", 0.05, "out-of-domain", 3.65),
]
DIFFERENCE_COLUMNS = [
    "study", "model", "beta", "domain", "candidate", "baseline", "candidate_mean", "baseline_mean", "difference_pts",
    "se_pts", "seeds", "critical", "low_pts", "high_pts", "relative_pct", "tasks",
]  # fmt: skip


def critical_value(rule: dict, seeds: int) -> float:
    """The claims rule's critical value for a mean over ``seeds`` paired seeds: max(min_z, Student's t at 1 − alpha
    with seeds − 1 degrees of freedom); NaN with one seed, where the seeds' spread is unknown."""
    if seeds < 2:
        return math.nan
    return max(rule["min_z"], float(student_t.ppf(1 - rule["alpha"], seeds - 1)))


def _domain_scores(evaluations: pd.DataFrame, tasks: list[str]) -> pd.DataFrame:
    """Per (study, model, kl, beta, seed): the mean of mean@k over ``tasks`` and its error over questions (every task
    needed)."""
    rows = evaluations[evaluations.task.isin(tasks)].dropna(subset=["mean_at_k"])
    keys = ["study", "model", "kl", "beta", "seed"]
    scores = rows.groupby(keys).agg(value=("mean_at_k", "mean"), se=("stderr", stderr_of_mean), n=("task", "nunique"))
    return scores[scores.n == len(tasks)].drop(columns="n").reset_index()


def _difference(candidate: pd.DataFrame, baseline: pd.DataFrame, shared_baseline: bool) -> tuple:
    """(candidate mean, baseline mean, difference, se, seeds). Paired by seed; a shared baseline (the base model's one
    evaluation) is subtracted from every seed, and its own error added once, since no seed averages it away."""
    if shared_baseline:
        if candidate.empty or baseline.empty:
            return (math.nan,) * 4 + (0,)
        c_mean, c_se, n = mean_and_se(candidate.value, candidate.se)
        b, b_se = float(baseline.value.iloc[0]), float(baseline.se.iloc[0])
        return c_mean, b, c_mean - b, math.hypot(c_se, b_se), n
    paired = candidate.merge(baseline, on="seed", suffixes=("_c", "_b"))
    if paired.empty:
        return (math.nan,) * 4 + (0,)
    own = np.hypot(paired.se_c, paired.se_b)
    difference, se, n = mean_and_se(paired.value_c - paired.value_b, own)
    return float(paired.value_c.mean()), float(paired.value_b.mean()), difference, se, n


def relative_improvement(candidate: pd.DataFrame, baseline: pd.DataFrame, tasks: list[str], shared: bool) -> float:
    """§4.1's "average relative improvement", in %, as the paper computes it from its figures' bars: per task, the
    candidate's mean@k over seeds against the baseline's, (c − b) / b, averaged over the domain's tasks (a ratio of
    each task's means, not of the domain's). Seeds as the points' difference pairs them: those both sides have, or
    (``shared``: the base model's one evaluation) every candidate seed. NaN where a task lacks a side or b is 0."""
    if not shared:
        seeds = set(candidate.seed) & set(baseline.seed)
        candidate, baseline = candidate[candidate.seed.isin(seeds)], baseline[baseline.seed.isin(seeds)]
    c = candidate.dropna(subset=["mean_at_k"]).groupby("task").mean_at_k.mean().reindex(tasks)
    b = baseline.dropna(subset=["mean_at_k"]).groupby("task").mean_at_k.mean().reindex(tasks)
    if c.isna().any() or b.isna().any() or (b == 0).any():
        return math.nan
    return float(100 * ((c - b) / b).mean())


def evaluation_differences(evaluations: pd.DataFrame, config: dict) -> pd.DataFrame:
    """Differences in mean@k, in points (100 × accuracy), per study, model, β and domain (the mean over its tasks):
    K1 in the reward − K3 in the loss (the paper's §4.1 comparison), each evaluated configuration − no KL where the
    study evaluates no KL, and each − the base model (chat template on; without it is another experiment, not a
    baseline). Paired by training seed; se by aggregate.UNCERTAINTY on the paired differences; the interval
    ± critical·se with the claims rule's critical value (critical_value: none with one seed); beside it §4.1's relative
    improvement (relative_improvement), which the paper quotes without an error."""
    if "chat_template" in evaluations:
        evaluations = evaluations[evaluations.chat_template.astype(str) != "off"]
    tasks, in_domain = config["evaluation"]["tasks"], config["evaluation"]["in_domain"]
    domains = {
        "in-domain": [t for t in tasks if t in in_domain],
        "out-of-domain": [t for t in tasks if t not in in_domain],
    }
    rows = []
    for domain, domain_tasks in domains.items():
        if not domain_tasks:
            continue
        scores = _domain_scores(evaluations, domain_tasks)
        base = scores[(scores.study == "base")]
        for (study, model, beta), cells in scores[scores.study != "base"].groupby(["study", "model", "beta"]):
            kls = list(dict.fromkeys(cells.kl))
            none = scores[(scores.study == study) & (scores.model == model) & (scores.kl == NO_KL)]
            pairs = [("k1-reward", "k3-loss")] if {"k1-reward", "k3-loss"} <= set(kls) else []
            pairs += [(kl, NO_KL) for kl in kls if kl != NO_KL and len(none)] + [(kl, "base") for kl in kls]
            raw = evaluations[(evaluations.model == model) & evaluations.task.isin(domain_tasks)]
            for candidate, baseline in pairs:
                against = base[base.model == model] if baseline == "base" else (
                    none if baseline == NO_KL else cells[cells.kl == baseline])  # fmt: skip
                c_mean, b_mean, difference, se, n = _difference(
                    cells[cells.kl == candidate], against, baseline == "base"
                )
                raw_baseline = raw[raw.study == "base"] if baseline == "base" else raw[(raw.study == study) & (
                    raw.kl == baseline) & ((raw.beta == beta) | (baseline == NO_KL))]  # fmt: skip
                raw_candidate = raw[(raw.study == study) & (raw.kl == candidate) & (raw.beta == beta)]
                relative = relative_improvement(raw_candidate, raw_baseline, domain_tasks, baseline == "base")
                critical = critical_value(config["claims_rule"], n)
                half = critical * se
                rows.append(dict(study=study, model=model, beta=beta, domain=domain, candidate=candidate,
                                 baseline=baseline, candidate_mean=c_mean, baseline_mean=b_mean,
                                 difference_pts=100 * difference, se_pts=100 * se, seeds=n, critical=critical,
                                 low_pts=100 * (difference - half), high_pts=100 * (difference + half),
                                 relative_pct=relative, tasks=" ".join(domain_tasks)))  # fmt: skip
    return pd.DataFrame(rows, columns=DIFFERENCE_COLUMNS)


def differences_sections(table: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    compact = pd.DataFrame(
        {
            "study": table.study,
            "β": table.beta.map(lambda b: f"{b:g}"),
            "domain": table.domain,
            "candidate − baseline": table.candidate + " − " + table.baseline,
            "difference (points)": [plus_minus(d, s) for d, s in zip(table.difference_pts, table.se_pts, strict=True)],
            "n": table.seeds,
            "± critical·se": [
                "n/a (one seed)" if pd.isna(c) else f"[{lo:.1f}, {hi:.1f}] ({c:.3g} se)"
                for c, lo, hi in zip(table.critical, table.low_pts, table.high_pts, strict=True)
            ],
            "relative (§4.1)": ["n/a" if pd.isna(r) else f"{r:+.2f} %" for r in table.relative_pct],
        }
    )
    return [("", compact)]


def evaluation_summary(evaluations: pd.DataFrame) -> pd.DataFrame:
    """Per evaluated configuration and task: mean over seeds ± se (aggregate.UNCERTAINTY), the standard deviation over
    seeds, the number of seeds, lm-eval's mean standard error over questions, and the fraction of completions from
    which no answer was read."""
    keys = ["study", "model", "kl", "beta", "chat_template", "task"]
    rows = []
    for key, group in evaluations.dropna(subset=["mean_at_k"]).groupby(keys):
        mean, se, n = mean_and_se(group.mean_at_k, group.stderr)
        rows.append(dict(zip(keys, key, strict=True), mean_at_k=mean, se=se, seed_std=group.mean_at_k.std(), seeds=n,
                         lm_eval_stderr=group.stderr.mean(), unread=group.unread.mean()))  # fmt: skip
    columns = [*keys, "mean_at_k", "se", "seed_std", "seeds", "lm_eval_stderr", "unread"]
    return pd.DataFrame(rows, columns=columns)


def evaluation_sections(summary: pd.DataFrame, tasks: list[str]) -> list[tuple[str, pd.DataFrame]]:
    """Two pivots for reading: mean@k ± se per configuration (rows) and task (columns), and the unread fraction."""
    rows = summary.assign(
        configuration=[
            f"base model, chat template {t}" if s == "base" else f"{s}: {k}" + ("" if k == NO_KL else f", β = {b:g}")
            for s, k, b, t in zip(summary.study, summary.kl, summary.beta, summary.chat_template, strict=True)
        ],
        score=[plus_minus(m, e) for m, e in zip(summary.mean_at_k, summary.se, strict=True)],
    )
    order = [t for t in tasks if t in set(rows.task)]
    index = ["configuration", "model"]
    scores = rows.pivot_table(index=index, columns="task", values="score", aggfunc="first", sort=False)[order]
    scores.insert(0, "n", rows.groupby(index, sort=False).seeds.max())
    unread = rows.pivot_table(index=index, columns="task", values="unread", aggfunc="first", sort=False)[order]
    return [
        ("mean@k ± se (n: training seeds)", scores.reset_index()),
        ("unread: fraction of completions with no answer read", unread.map(lambda v: sig(v, 2)).reset_index()),
    ]


# ---------------------------------------------------------------------------------------------------------
# Regularisation, and the claims behind its yes/no.


def claim_verdict(claims: pd.DataFrame | None, **where) -> str:
    """The claims table's verdict on the row matching ``where`` (column -> value; β compared as numbers), as
    'verdict (claim)'; 'no claim' where none tests it."""
    if claims is None or claims.empty:
        return "no claim"
    rows = claims
    for column, value in where.items():
        if column not in rows:
            return "no claim"
        if isinstance(value, float):
            rows = rows[np.isclose(pd.to_numeric(rows[column], errors="coerce"), value)]
        else:
            rows = rows[rows[column].astype(str) == str(value)]
    return "; ".join(f"{r.verdict} ({r.claim})" for r in rows.itertuples()) or "no claim"


def _falls_verdict(claims: pd.DataFrame | None, study: str, model: str, kl_config: str, beta: float) -> str:
    """The claims table's verdict that a larger β keeps this configuration closer to the reference: the claim
    against the next smaller β at this β, or a trend over the grid."""
    if claims is None or claims.empty:
        return "no claim"
    rows = claims[(claims.study == study) & (claims.model == model) & (claims.metric == "final_kl")]
    rows = rows[(rows.candidate == kl_config) & (rows.baseline == kl_config)]
    trend = rows.get("note", pd.Series("", index=rows.index)).fillna("").astype(str).str.startswith("trend")
    at_beta = rows[~trend & np.isclose(pd.to_numeric(rows.beta, errors="coerce"), beta)]
    picked = pd.concat([at_beta, rows[trend]])
    return "; ".join(f"{r.verdict} ({r.claim})" for r in picked.itertuples()) or "no claim"


def regularisation(
    training: pd.DataFrame,
    cells: pd.DataFrame,
    config: dict,
    tests: pd.DataFrame,
    studies: list[str],
    claims: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The on-policy KL to the reference at the end of training (aggregate.final_values) per configuration and β:
    mean ± se over seeds (aggregate.UNCERTAINTY); its difference from the no-KL run of the same study, model and seed
    (the same data order: paired), mean ± se; what the toy model predicts (expected_pull); and what the claims table
    says of it (against no KL, below or above as the claim says; lower at a larger β): its verdicts, never a
    comparison of means made here."""
    keys = ["study", "model", "kl", "beta"]
    final = final_values(training[training.study.isin(studies)], config)
    status = cells.set_index([*keys, "seed"]).status
    final["status"] = [status.get(tuple(r), "missing") for r in final[[*keys, "seed"]].values]
    none = final[final.kl == NO_KL].set_index(["study", "model", "seed"])[["kl_k3", "kl_k3_stderr"]]
    final = final.join(none.add_prefix("no_kl_"), on=["study", "model", "seed"])
    rows = []
    for (study, model, kl_config, beta), group in final[final.kl != NO_KL].groupby(keys, sort=False):
        mean, se, n = mean_and_se(group.kl_k3, group.kl_k3_stderr)
        paired = group.dropna(subset=["no_kl_kl_k3"])
        own = np.hypot(paired.kl_k3_stderr, paired.no_kl_kl_k3_stderr)
        difference, difference_se, paired_n = mean_and_se(paired.kl_k3 - paired.no_kl_kl_k3, own)
        no_kl = final[(final.study == study) & (final.model == model) & (final.kl == NO_KL)]
        rows.append(
            dict(
                study=study, model=model, kl=kl_config, beta=beta, final_kl=mean, final_kl_se=se, seeds=n,
                runs_not_ok=int((group.status != "ok").sum()),
                no_kl_final_kl=no_kl.kl_k3.mean() if len(no_kl) else math.nan,
                minus_no_kl=difference, minus_no_kl_se=difference_se, paired_seeds=paired_n,
                predicted=expected_pull(tests, kl_config),
                claim_below_no_kl=claim_verdict(claims, study=study, model=model, metric="final_kl",
                                                candidate=kl_config, baseline=NO_KL, beta=float(beta)),
                claim_lower_at_larger_beta=_falls_verdict(claims, study, model, kl_config, float(beta)),
            )
        )  # fmt: skip
    columns = ["study", "model", "kl", "beta", "final_kl", "final_kl_se", "seeds", "runs_not_ok", "no_kl_final_kl",
               "minus_no_kl", "minus_no_kl_se", "paired_seeds", "predicted", "claim_below_no_kl",
               "claim_lower_at_larger_beta"]  # fmt: skip
    return pd.DataFrame(rows, columns=columns)


def regularisation_sections(table: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    compact = pd.DataFrame(
        {
            "study": table.study,
            "kl": table.kl,
            "β": table.beta.map(lambda b: f"{b:g}"),
            "final KL (nats)": [plus_minus(m, s) for m, s in zip(table.final_kl, table.final_kl_se, strict=True)],
            "n": table.seeds,
            "− no KL, paired": [plus_minus(m, s) for m, s in zip(table.minus_no_kl, table.minus_no_kl_se, strict=True)],
            "Table 1 predicts": table.predicted,
            "claims table: against no KL": table.claim_below_no_kl,
            "claims table: lower at larger β": table.claim_lower_at_larger_beta,
        }
    )
    return [("", compact)]


# ---------------------------------------------------------------------------------------------------------
# The claims table for reading.


def _interval(centre, half) -> str:
    return "" if pd.isna(half) or pd.isna(centre) else f"[{sig(centre - half, 2)}, {sig(centre + half, 2)}]"


def claim_betas(row) -> tuple:
    """A claim row's β as the claims table has it: ("trend", None) for a slope over β; (None, None) without a β (no
    KL); else (β, the baseline's β where candidate and baseline are one configuration at two β, or None)."""
    if str(row.get("note", "")).startswith("trend"):
        return "trend", None
    beta, below = pd.to_numeric(pd.Series([row.get("beta"), row.get("baseline_beta")]), errors="coerce")
    if pd.isna(beta) or beta == 0:
        return None, None
    same_config = str(row.get("baseline")) == str(row.get("candidate"))
    return float(beta), (float(below) if same_config and pd.notna(below) else None)


def claims_summary(claims: pd.DataFrame) -> pd.DataFrame:
    """The claims table in a few columns: claim, β, predicted, effect ± se, the interval effect ± critical·se the rule
    reads, z against critical, paired units, verdict. Every number from the claims table; none decided here."""

    def beta_text(row) -> str:
        beta, below = claim_betas(row)
        if beta == "trend" or beta is None:
            return beta or ""
        return f"{beta:g} vs {below:g}" if below is not None else f"{beta:g}"

    rows = claims.to_dict("records")
    return pd.DataFrame(
        {
            "claim": claims.claim,
            "β": [beta_text(r) for r in rows],
            "predicted": claims.predicted,
            "effect ± se": [plus_minus(r["effect"], r["se"]) for r in rows],
            "effect ± critical·se": [_interval(r["effect"], r["critical"] * r["se"]) for r in rows],
            "z / critical": ["" if pd.isna(r["z"]) else f"{sig(r['z'], 2)} / {sig(r['critical'], 3)}" for r in rows],
            "n": claims.get("units", pd.Series("", index=claims.index)),
            "verdict": claims.verdict,
        }
    )


SHORT_CLAIMS = (
    "This Markdown shows each claim's effect ± se, the interval effect ± critical·se that the verdict rule reads (a "
    "same claim's reads its two one-sided tests against the margin's ends, paired by seed; z is the smaller), z "
    "against its critical value, n the paired units (seeds or questions) and the verdict; β 'a vs b': the "
    "configuration at β = a against itself at b, 'trend': the slope over the β grid. claims.csv has every column."
)


# ---------------------------------------------------------------------------------------------------------
# Table 2 (§E): K1 in the reward in other libraries, as the paper lists it, next to this project's setting.
TABLE2 = [
    ("VeRL", 'algorithm.use_kl_in_reward=True, algorithm.kl_penalty="kl"'),
    ("OpenRLHF", 'do not set --use_kl_loss; --kl_estimator="k1"'),
    ("SkyRL", 'trainer.algorithm.kl_estimator_type="k1", trainer.algorithm.use_kl_in_reward=True'),
    ("klstudy (config)", "studies.<study>.kl: [k1-reward] with betas: [...]"),
    ("klstudy (Python)", 'KLTrainerConfig(kl_estimator="k1", kl_placement="reward", beta=...)'),
]


def study_tables(config: dict, tables: dict, tests: pd.DataFrame) -> dict[str, tuple[pd.DataFrame, str, list | None]]:
    """name -> (table, caption, Markdown sections or None) for each of config.STUDY_TABLES (the names the workflow's
    outputs use). The claims table is built once; the regularisation table reads its verdicts."""
    studies = onpolicy_studies(config)
    scale = f"{config['scale']} scale"
    claims = claims_table(config, tables, tests)
    table1_caption = (
        "Table 1. KL estimators and placements (the paper's four rows first); whether their expected gradient equals "
        "the gradient of the sequence-level reverse KL on-policy, computed exactly by enumerating every sequence of "
        "the toy model up to T = 16 (unbiased (exact); max abs exact bias over settings, T and parameters) and tested "
        "by Monte Carlo (biased when any |bias / standard error| exceeds the Bonferroni critical value at family-wise "
        f"level {tests.alpha.iloc[0]}; the CSV has the test's verdict, the worst case and the bias at T = 1); the "
        "frameworks' per-token KL-loss gradients apart (kl.py); and the behaviour of the on-policy training runs "
        f"({', '.join(studies)}; {scale}): " + BEHAVIOUR_RULES.format(drop=DROP) + " K: the estimator's expression, "
        "r = π_ref / π_θ per token."
    )
    table1_full = table1(tests, behaviour(tables["cells"], tables["heldout"], studies))
    differences = evaluation_differences(tables["evaluations"], config)
    paper = "; ".join(f"{m} {d} +{v} %" for m, _, d, v in PAPER_RELATIVE_IMPROVEMENTS)
    summary = evaluation_summary(tables["evaluations"])
    regularised = regularisation(tables["training"], tables["cells"], config, tests, studies, claims)
    built = {
        "table1": (table1_full, table1_caption, table1_sections(table1_full)),
        "table2": (
            pd.DataFrame(TABLE2, columns=["library", "arguments for K1 in the reward"]),
            "Table 2. K1 in the reward in other libraries (the paper's §E) and here.",
            None,
        ),
        "evaluation_differences": (
            differences,
            f"Evaluation differences ({scale}): mean@{config['evaluation']['k']} of a candidate minus a baseline in "
            "points (100 × accuracy), the mean over the domain's tasks, per study, model and β; paired by training "
            f"seed (the base model: its one evaluation, its error added once); difference ± se, the {UNCERTAINTY}, "
            "applied to the paired differences; the interval ± critical·se with the claims rule's critical value "
            "(max(min_z, Student's t at 1 − alpha, n − 1 degrees of freedom); none from one seed). A difference whose "
            "interval holds 0 is not a finding; the claims table says which are claims. relative (§4.1): the "
            "relative improvement as §4.1 computes it, per task (candidate − baseline) / baseline of the means over "
            "seeds, averaged over the domain's tasks, with no error, as the paper quotes it. The paper's own "
            f"figures are relative improvements of K1 in the reward over K3 in the loss at β = 0.05 ({paper}; mean@32, "
            "3 seeds, no uncertainty quoted), for its models, not results of this run.",
            differences_sections(differences),
        ),
        "regularisation": (
            regularised,
            "Regularisation: KL(π_θ‖π_ref) at the end of on-policy training (the K3 estimate logged each step, mean "
            "of the last final_steps steps of each run: "
            + ", ".join(f"{s} {config['studies'][s].get('final_steps', 5)}" for s in studies)
            + f"), the {UNCERTAINTY}; − no KL: the run's minus the no-KL run's of the same study, model and seed, "
            "mean ± se of the paired differences. Table 1 predicts: what Table 1's exact computation says the "
            "configuration's expected gradient does (its projection on the KL's, in the toy model). The last two "
            "columns are the claims table's verdicts (figures/claims.csv), not a comparison of means; 'no claim': "
            f"no claim tests it. {scale}.",
            regularisation_sections(regularised),
        ),
        "evaluations": (
            summary,
            f"Evaluation ({scale}): mean@{config['evaluation']['k']} per configuration and task, the {UNCERTAINTY} "
            "(lm-eval's error over questions); the base model is one evaluation. unread: the fraction of completions "
            "(mean over seeds) from which the task's answer rule reads no answer at all (no letter, no mathematical "
            "answer, no expression), so that a low score from unread answers can be told from one of wrong answers. "
            "The CSV has one row per configuration and task, with the standard deviation over seeds.",
            evaluation_sections(summary, config["evaluation"]["tasks"]),
        ),
        "claims": (
            claims,
            claims_caption(config, tables["cells"], claims) + " " + SHORT_CLAIMS,
            [("", claims_summary(claims))],
        ),
    }
    return {name: built[name] for name in STUDY_TABLES}


def write_study_tables(config: dict, tables: dict, toy_tests: Path, out_dir: Path) -> None:
    """Every study table as out_dir/<name>.csv and out_dir/<name>.md."""
    for name, (table, caption, sections) in study_tables(config, tables, pd.read_csv(toy_tests)).items():
        write_table(table, Path(out_dir) / f"{name}.md", Path(out_dir) / f"{name}.csv", caption, sections)
