"""The study's tables, from the aggregated tables and the toy model's tests: Table 1 (the bias of each estimator and
placement, and how its on-policy runs behaved), Table 2 (K1 in the reward in other libraries), §4.1's relative
improvements, the evaluation summary, the regularisation table and the claims table (claims.py). Each is written
as CSV and as Markdown with its caption."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from klstudy.aggregate import final_values, stderr_of_mean
from klstudy.claims import caption as claims_caption
from klstudy.claims import claims_table, expected_pull
from klstudy.config import STUDY_TABLES


def _cell(value) -> str:
    """A Markdown table cell: blank where a number is unknown (NaN: one seed has no spread)."""
    return "" if isinstance(value, float) and pd.isna(value) else str(value)


def write_table(table: pd.DataFrame, md: Path, csv: Path, caption: str) -> None:
    Path(md).parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(csv, index=False)
    header = "| " + " | ".join(table.columns) + " |"
    rule = "| " + " | ".join("---" for _ in table.columns) + " |"
    body = ["| " + " | ".join(_cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    Path(md).write_text("\n".join([caption, "", header, rule, *body, ""]))


# Table 1's "behaviour" column, from the on-policy runs of each configuration.
BEHAVIOUR_RULES = (
    "collapse: some run ended 'collapsed' (running-mean reward fell below the health rule's fraction of its best); "
    "instabilities: some run 'diverged', or its held-out pass@1 fell by more than {drop} (absolute) below its "
    "best earlier value; stable: every run finished with neither; not trained: no on-policy run of it."
)
DROP = 0.15


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
    for kl_config, group in cells[cells.study.isin(studies) & (cells.kl != "none")].groupby("kl"):
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
    behaviour of the on-policy training runs of that configuration."""
    rows = tests[tests.placement != "none"]
    behaviours = behaviours or {}

    def exact(column):
        return rows[column].map(lambda v: "" if pd.isna(v) else f"{v:.2g}") if column in rows else ""

    return pd.DataFrame(
        {
            "config": rows.config,
            "estimator": rows.estimator.str.upper(),
            "expression": rows.expression,
            "placement": rows.placement,
            "loss_gradient": rows.loss_gradient.where(rows.placement != "reward", ""),
            "framework": rows.framework.fillna(""),
            "unbiased_gradient": rows.unbiased.map({True: "yes", False: "no"}),
            "exact_unbiased": rows.exact_unbiased.map({True: "yes", False: "no"}).fillna(""),
            "max_abs_exact_bias": exact("max_abs_exact_bias"),
            "max_abs_exact_bias_T1": exact("max_abs_exact_bias_T1"),
            "max_abs_z": rows.max_abs_z.round(1),
            "z_critical": rows.z_critical.round(2),
            "worst_case": rows.worst_case,
            "behaviour": [behaviours.get(name, "not trained") for name in rows.config],
        }
    ).sort_values("estimator", kind="stable")  # placements keep the toy's order (config toy.placements)


# §4.1's relative improvements of K1 in the reward over K3 in the loss, as the paper quotes them (β = 0.05; the paper
# says "similar trends hold for β = 0.1" without numbers). No uncertainty is quoted.
PAPER_RELATIVE_IMPROVEMENTS = [
    ("Qwen2.5-7B", 0.05, "in-domain", 6.21),
    ("Qwen2.5-7B", 0.05, "out-of-domain", 19.06),
    ("Llama-3.1-8B-Instruct", 0.05, "in-domain", 15.94),
    ("Llama-3.1-8B-Instruct", 0.05, "out-of-domain", 3.65),
]
RELATIVE_IMPROVEMENT_COLUMNS = [
    "source", "study", "model", "beta", "domain", "relative_improvement_pct", "seed_std_pct", "seeds",
    "lm_eval_stderr_pct", "tasks",
]  # fmt: skip


def _improvement(candidate: pd.Series, baseline: pd.Series) -> pd.Series:
    return 100 * (candidate - baseline) / baseline.where(baseline > 0)


def relative_improvement(
    evaluations: pd.DataFrame, in_domain: list[str], candidate: str = "k1-reward", baseline: str = "k3-loss"
) -> pd.DataFrame:
    """§4.1's numbers: per study, model and β, the mean over tasks of (candidate − baseline) / baseline, in %,
    in-domain and out-of-domain, from seed-mean mean@k scores; then the paper's own figures, marked as such.

    Its uncertainty, two ways: seed_std_pct, the standard deviation over training seeds of the same improvement
    computed seed by seed (seed s of the candidate against seed s of the baseline: the same data order; blank with
    one seed); lm_eval_stderr_pct, lm-eval's standard errors over questions carried through the ratio to first
    order (tasks taken as independent), the uncertainty left with any number of seeds."""
    keys = ["study", "model", "beta", "task"]
    cells = evaluations[evaluations.kl.isin([candidate, baseline])].dropna(subset=["mean_at_k"])
    by_seed = cells.pivot_table(index=[*keys, "seed"], columns="kl", values="mean_at_k")
    if candidate not in by_seed or baseline not in by_seed:
        return pd.DataFrame(columns=RELATIVE_IMPROVEMENT_COLUMNS)
    scores = cells.groupby([*keys, "kl"]).agg(mean=("mean_at_k", "mean"), se=("stderr", stderr_of_mean))
    tasks = scores.unstack("kl").dropna(subset=[("mean", candidate), ("mean", baseline)])
    c, b = tasks["mean"][candidate], tasks["mean"][baseline]
    variance = (100 / b) ** 2 * (tasks["se"][candidate] ** 2 + (c / b) ** 2 * tasks["se"][baseline] ** 2)
    per_task = pd.DataFrame({"improvement": _improvement(c, b), "stderr": variance**0.5}).reset_index()
    paired = by_seed.dropna(subset=[candidate, baseline])
    per_seed = _improvement(paired[candidate], paired[baseline]).rename("improvement").reset_index()
    for frame in (per_task, per_seed):
        frame["domain"] = frame.task.map(lambda t: "in-domain" if t in in_domain else "out-of-domain")
    domains = ["study", "model", "beta", "domain"]
    seed_means = per_seed.groupby([*domains, "seed"]).improvement.mean().groupby(domains)
    table = per_task.groupby(domains).agg(
        relative_improvement_pct=("improvement", "mean"),
        lm_eval_stderr_pct=("stderr", stderr_of_mean),
        tasks=("task", " ".join),
    )
    table["seed_std_pct"], table["seeds"] = seed_means.std(), seed_means.size()
    table = table.reset_index().assign(source="this run")
    table["seeds"] = table.seeds.fillna(0).astype(int)
    paper = pd.DataFrame(
        [dict(source="paper §4.1", study="paper", model=m, beta=beta, domain=d, relative_improvement_pct=v, seeds=3,
              tasks="MATH500 MATH²" if d == "in-domain" else "MMLU college physics, chemistry, biology")
         for m, beta, d, v in PAPER_RELATIVE_IMPROVEMENTS]
    )  # fmt: skip
    return pd.concat([table, paper], ignore_index=True)[RELATIVE_IMPROVEMENT_COLUMNS].round(2)


def _yes_no(condition: bool | None) -> str:
    return "n/a" if condition is None else "yes" if condition else "no"


def regularisation(
    training: pd.DataFrame, cells: pd.DataFrame, config: dict, tests: pd.DataFrame, studies: list[str]
) -> pd.DataFrame:
    """The on-policy KL to the reference at the end of training (aggregate.final_values) per configuration and β:
    mean and standard deviation over seeds; its difference from the no-KL run of the same study, model and seed
    (the same data order: paired), mean and standard deviation over seeds; what the toy model predicts
    (expected_pull) and what the runs show (below the no-KL run at each β; falling as β grows). "n/a" where the
    study has no no-KL run, or one β."""
    keys = ["study", "model", "kl", "beta"]
    final = final_values(training[training.study.isin(studies)], config)
    status = cells.set_index([*keys, "seed"]).status
    final["status"] = [status.get(tuple(r), "missing") for r in final[[*keys, "seed"]].values]
    no_kl_same_seed = final[final.kl == "none"].set_index(["study", "model", "seed"]).kl_k3.rename("no_kl_same_seed")
    final = final.join(no_kl_same_seed, on=["study", "model", "seed"])
    final["minus_no_kl"] = final.kl_k3 - final.no_kl_same_seed
    summary = (
        final.groupby(keys, sort=False)
        .agg(final_kl=("kl_k3", "mean"), seed_std=("kl_k3", "std"), seeds=("seed", "nunique"),
             minus_no_kl=("minus_no_kl", "mean"), minus_no_kl_std=("minus_no_kl", "std"),
             not_ok=("status", lambda s: int((s != "ok").sum())))
        .reset_index()
    )  # fmt: skip
    baseline = summary[summary.kl == "none"].set_index(["study", "model"]).final_kl
    rows = []
    for (study, model, kl_config), group in summary[summary.kl != "none"].groupby(["study", "model", "kl"], sort=False):
        group = group.sort_values("beta")
        none = baseline.get((study, model), float("nan"))
        below = [None if pd.isna(d) else bool(d < 0) for d in group.minus_no_kl]
        falls = None if len(group) < 2 else bool((group.final_kl.diff().dropna() < 0).all())
        predicted = expected_pull(tests, kl_config)
        for row, is_below in zip(group.itertuples(), below, strict=True):
            rows.append(
                dict(
                    study=study, model=model, kl=kl_config, beta=row.beta, final_kl=row.final_kl,
                    seed_std=row.seed_std, seeds=row.seeds, runs_not_ok=row.not_ok, no_kl_final_kl=none,
                    minus_no_kl=row.minus_no_kl, minus_no_kl_std=row.minus_no_kl_std,
                    below_no_kl=_yes_no(is_below), falls_as_beta_grows=_yes_no(falls), predicted=predicted,
                )
            )  # fmt: skip
    columns = ["study", "model", "kl", "beta", "final_kl", "seed_std", "seeds", "runs_not_ok", "no_kl_final_kl",
               "minus_no_kl", "minus_no_kl_std", "below_no_kl", "falls_as_beta_grows", "predicted"]  # fmt: skip
    return pd.DataFrame(rows, columns=columns).round(4)


# Table 2 (§E): K1 in the reward in other libraries, as the paper lists it, next to this project's setting.
TABLE2 = [
    ("VeRL", 'algorithm.use_kl_in_reward=True, algorithm.kl_penalty="kl"'),
    ("OpenRLHF", 'do not set --use_kl_loss; --kl_estimator="k1"'),
    ("SkyRL", 'trainer.algorithm.kl_estimator_type="k1", trainer.algorithm.use_kl_in_reward=True'),
    ("klstudy (config)", "studies.<study>.kl: [k1-reward] with betas: [...]"),
    ("klstudy (Python)", 'KLTrainerConfig(kl_estimator="k1", kl_placement="reward", beta=...)'),
]


def evaluation_summary(evaluations: pd.DataFrame) -> pd.DataFrame:
    """Per evaluated configuration and task: mean over seeds, standard deviation over seeds, number of seeds,
    lm-eval's mean standard error over questions, and the fraction of completions from which no answer was read."""
    keys = ["study", "model", "kl", "beta", "chat_template", "task"]
    rows = evaluations.dropna(subset=["mean_at_k"])
    return (
        rows.groupby(keys)
        .agg(
            mean_at_k=("mean_at_k", "mean"),
            seed_std=("mean_at_k", "std"),
            seeds=("seed", "nunique"),
            lm_eval_stderr=("stderr", "mean"),
            unread=("unread", "mean"),
        )
        .round(4)
        .reset_index()
    )


def study_tables(config: dict, tables: dict, tests: pd.DataFrame) -> dict[str, tuple[pd.DataFrame, str]]:
    """name -> (table, caption) for each of config.STUDY_TABLES (the names the workflow's outputs use)."""
    studies = onpolicy_studies(config)
    table1_caption = (
        "Table 1. KL estimators and placements; whether their expected gradient equals the gradient of the "
        "sequence-level reverse KL on-policy, computed exactly by enumerating every sequence of the toy model up to "
        "T = 16 (exact_unbiased; the largest |exact bias| over settings, T and parameters, and at T = 1 alone) and "
        "tested by Monte Carlo (unbiased_gradient: biased when any "
        f"|bias / standard error| exceeds the Bonferroni critical value at family-wise level {tests.alpha.iloc[0]}); "
        "rows with a loss gradient other than pathwise are the per-token KL-loss corrections frameworks ship (kl.py); "
        f"and the behaviour of the on-policy training runs ({', '.join(studies)}; {config['scale']} scale): "
        + BEHAVIOUR_RULES.format(drop=DROP)
        + " r = π_ref / π_θ per token."
    )
    built = {
        "table1": (table1(tests, behaviour(tables["cells"], tables["heldout"], studies)), table1_caption),
        "table2": (
            pd.DataFrame(TABLE2, columns=["library", "arguments for K1 in the reward"]),
            "Table 2. K1 in the reward in other libraries (the paper's §E) and here.",
        ),
        "relative_improvement": (
            relative_improvement(tables["evaluations"], config["evaluation"]["in_domain"]),
            "Relative improvement (%) of K1 in the reward over K3 in the loss, mean over tasks of seed-mean "
            f"mean@k, per study, model and β ({config['scale']} scale). seed_std_pct: standard deviation over "
            "training seeds of the improvement computed seed by seed (blank with one seed); lm_eval_stderr_pct: "
            "lm-eval's standard errors over questions carried through the ratio. Rows marked 'paper §4.1' are the "
            "paper's own figures for its models (mean@32 over 3 seeds, no uncertainty quoted; 'similar trends' at "
            "β = 0.1, no numbers), not results of this run.",
        ),
        "regularisation": (
            regularisation(tables["training"], tables["cells"], config, tests, studies),
            "Regularisation: KL(π_θ‖π_ref) at the end of on-policy training (the K3 estimate logged each step, mean "
            "of the last final_steps steps of each run: "
            + ", ".join(f"{s} {config['studies'][s].get('final_steps', 5)}" for s in studies)
            + "), mean and standard deviation over seeds, against the no-KL run (β = 0) of the same study and model. "
            "predicted: what Table 1's exact computation says the configuration's expected gradient does (the "
            "projection of its expected gradient on the KL's, in the toy model); below_no_kl and "
            "falls_as_beta_grows: what the runs show (means over seeds; compare the differences with seed_std). "
            f"{config['scale']} scale.",
        ),
        "evaluations": (
            evaluation_summary(tables["evaluations"]),
            "Evaluation: mean@k per configuration and task, mean and standard deviation over training seeds, "
            "lm-eval's standard error over questions, and unread: the fraction of completions (mean over seeds) from "
            "which the task's answer rule reads no answer at all (no letter, no mathematical answer, no expression), "
            "so that a low score from unread answers can be told from one of wrong answers.",
        ),
        "claims": (claims_table(config, tables, tests), claims_caption(config, tables["cells"])),
    }
    return {name: built[name] for name in STUDY_TABLES}


def write_study_tables(config: dict, tables: dict, toy_tests: Path, out_dir: Path) -> None:
    """Every study table as out_dir/<name>.csv and out_dir/<name>.md."""
    for name, (table, caption) in study_tables(config, tables, pd.read_csv(toy_tests)).items():
        write_table(table, Path(out_dir) / f"{name}.md", Path(out_dir) / f"{name}.csv", caption)
