"""The panels of the config's ``figures`` section, one function per panel kind, from the aggregated tables."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from klstudy.kl import NO_KL
from klstudy.report.aggregate import (
    final_values,
    mean_and_se,
    step_values,
    trailing_mean,
)
from klstudy.report.figures.encoding import (
    BASE_COLOUR,
    VERDICT_COLOURS,
    beta_hatch,
    config_colour,
    dodge,
    kl_label,
    say_in_panel,
    se_band,
    style_of,
    task_name,
)

# ---------------------------------------------------------------------------------------------------------
# §4: the figures of the config's ``figures`` section, from the aggregated tables (klstudy.report.aggregate).

NOT_OK = {"collapsed": "x", "diverged": "X", "missing": "."}


@dataclass
class Drawn:
    """What a panel drew: its quantity (panels of one quantity share a y axis), the seeds per series, why it is
    empty (None when it has data)."""

    quantity: str
    seeds: set[int] = field(default_factory=set)
    empty: str | None = None
    notes: list[str] = field(default_factory=list)
    n_text: str | None = None  # the title's n, where seeds alone do not say it
    unit: str = "point"  # what one n is of: a point (curves) or a bar


def select(table: pd.DataFrame, panel: dict, config: dict) -> pd.DataFrame:
    """The rows of a panel's cells: its study and model, its KL configurations and β (β = 0 for "none")."""
    spec = config["studies"][panel["study"]]
    kls, betas = panel.get("kl", spec["kl"]), [float(b) for b in panel.get("betas", spec["betas"])]
    rows = table[(table.study == panel["study"]) & (table.model == panel["model"]) & table.kl.isin(kls)]
    return rows[(rows.kl == NO_KL) | rows.beta.isin(betas)]


def _status_suffix(group: pd.DataFrame) -> str:
    """' (1/2 collapsed)' for the runs of a line that did not finish ok."""
    bad = {s: n for s, n in group.status.value_counts().items() if s != "ok"}
    return " (" + ", ".join(f"{n}/{len(group)} {s}" for s, n in bad.items()) + ")" if bad else ""


def _seed_stats(rows: pd.DataFrame, by: str, value: str, stderr: str | None) -> pd.DataFrame:
    """Per value of ``by`` (a step): mean, se and n over the seeds (aggregate.mean_and_se)."""
    stats = [
        (key, *mean_and_se(group[value], group[stderr] if stderr and stderr in group else None))
        for key, group in rows.groupby(by, sort=True)
    ]
    return pd.DataFrame(stats, columns=[by, "mean", "se", "n"])


def curves_panel(ax, panel: dict, config: dict, tables: dict) -> Drawn:
    """Held-out pass@1 against training step: the mean over seeds with a ± 1 se band (each run's error over
    questions combined with the seeds' spread); a run that stopped early (collapsed or diverged) ends in a cross at its
    last evaluation. Lines are dodged sideways a little so that equal values do not hide each other."""
    heldout, cells = select(tables["heldout"], panel, config), select(tables["cells"], panel, config)
    data = config["studies"][panel["study"]]["heldout_data"]
    drawn = Drawn("pass@1")
    lines = list(cells.groupby(["kl", "beta"], sort=False))
    every = config["studies"][panel["study"]]["train"].get("eval_every", 10)
    means = []
    for i, ((kl_config, beta), group) in enumerate(lines):
        label = kl_label(kl_config, None if kl_config == NO_KL else beta) + _status_suffix(group)
        runs = heldout[(heldout.kl == kl_config) & (heldout.beta == beta)]
        if runs.empty:
            drawn.notes.append(f"no results: {label}")
            continue
        style = style_of(kl_config, beta)
        stats = _seed_stats(runs, "step", "pass_at_1", "stderr")
        x = stats.step + dodge(i, len(lines), 0.3 * every)
        ax.plot(x, stats["mean"], markersize=4, label=label, **style)
        se_band(ax, stats, x, style["color"])
        drawn.seeds.update(stats.n)
        means.extend(stats["mean"])
        for seed, run in runs.groupby("seed"):
            status = group[group.seed == seed].status
            if len(status) and status.iloc[0] in NOT_OK:
                ax.scatter(run.step.iloc[-1], run.pass_at_1.iloc[-1], marker=NOT_OK[status.iloc[0]], s=60, zorder=4,
                           color=style["color"])  # fmt: skip
    ax.set_xlabel("training step")
    ax.set_ylabel(f"held-out pass@1 ({task_name(data)})")
    ax.grid(alpha=0.3)
    if not means:
        drawn.empty = "; ".join(["no run of this panel has held-out results yet", *drawn.notes])
    elif max(means) == 0:
        drawn.notes.append(f"every run scores 0 on {data} at every evaluation")
        say_in_panel(ax, "every run scores 0 at every evaluation")
    train = config["studies"][panel["study"]]["train"]
    if too_short_for_lag(train):
        drawn.notes.append(async_text(train))
    return drawn


# Multiple-choice tasks (MMLU and its procedural stand-ins, data/procedural.py): four letters A–D, so chance is 1/4.
MULTIPLE_CHOICE_PREFIX, MULTIPLE_CHOICE_CHANCE = "mmlu", 0.25


def bars_panel(ax, panel: dict, config: dict, tables: dict) -> Drawn:
    """lm-eval mean@k per task: the base model with its chat template (one evaluation, its error over questions), then
    each KL configuration × β (mean over seeds ± 1 se, combining the seeds' spread with lm-eval's error over
    questions); hatching = β; above each bar the fraction of its completions with no readable answer; chance on the
    multiple-choice tasks as a dashed line. The base model without its chat template (near 0, mostly unread) is
    listed in the caption, not drawn at the foot of every panel. "n/a": not evaluated."""
    evaluations = tables["evaluations"]
    tasks = config["evaluation"]["tasks"]
    base = evaluations[(evaluations.study == "base") & (evaluations.model == panel["model"])]
    groups = [("base model, one evaluation", base[base.chat_template.astype(str) == "on"],
               {"color": BASE_COLOUR, "edgecolor": "0.3", "hatch": ""})]  # fmt: skip
    drawn = Drawn("accuracy", unit="bar")
    drawn.notes += _without_template(base[base.chat_template.astype(str) == "off"], tasks)
    cells = select(evaluations[evaluations.study != "base"], panel, config)
    cell_status = select(tables["cells"], panel, config)
    for (kl_config, beta), rows in cells.groupby(["kl", "beta"], sort=False):
        status = cell_status[(cell_status.kl == kl_config) & (cell_status.beta == beta)]
        label = kl_label(kl_config, None if kl_config == NO_KL else beta) + _status_suffix(status)
        style = {"color": config_colour(kl_config), "edgecolor": "black", "hatch": beta_hatch(beta)}
        groups.append((label, rows, style))
    width = 0.8 / max(len(groups), 1)
    any_value, tops, unread_labels = False, {t: 0.0 for t in range(len(tasks))}, []
    for g, (label, rows, style) in enumerate(groups):
        by_task = [rows[rows.task == task] for task in tasks]
        stats = [mean_and_se(r.mean_at_k, r.stderr) for r in by_task]
        x = [t + dodge(g, len(groups), 0.8) for t in range(len(tasks))]
        ax.bar(x, [s[0] for s in stats], width, yerr=[s[1] for s in stats], linewidth=0.5, capsize=2, label=label,
               error_kw={"elinewidth": 1}, **style)  # fmt: skip
        if not label.startswith("base"):
            drawn.seeds.update(s[2] for s in stats if s[2])
        for t, (xi, (mean, se, _), r) in enumerate(zip(x, stats, by_task, strict=True)):
            if pd.isna(mean):
                ax.text(xi, 0.005, "n/a", rotation=90, ha="center", va="bottom", fontsize=7)
                continue
            any_value = True
            tops[t] = max(tops[t], mean + (se if np.isfinite(se) else 0.0))
            if "unread" in r and r.unread.notna().any():
                unread_labels.append((t, xi, f"{r.unread.mean():.0%}"))
    for t, xi, text in unread_labels:  # in a row above the task's tallest error bar: no bar's error bar crosses one
        ax.text(xi, tops[t] + 0.01, text, rotation=90, ha="center", va="bottom", fontsize=7, color="0.25")
    _chance_lines(ax, tasks)
    ax.set_ylim(0, max([0.05, *tops.values()]) / 0.8)  # room for the unread labels above the tallest bar
    ax.set_xticks(range(len(tasks)), [task_name(t).replace("MMLU ", "MMLU\n") for t in tasks], fontsize=8)
    ax.set_ylabel(f"mean@{config['evaluation']['k']} accuracy (above a bar: % unread)", fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    if not any_value:
        drawn.empty = "no evaluation of this panel has results yet"
    if not drawn.seeds:
        drawn.n_text = "n = 1 evaluation of the base model; no trained run evaluated yet"
    return drawn


def _chance_lines(ax, tasks: list[str]) -> None:
    """A dashed line at chance across each multiple-choice task's bars, labelled once."""
    label = f"chance ({MULTIPLE_CHOICE_CHANCE:g}: four choices)"
    for t, task in enumerate(tasks):
        if task.startswith(MULTIPLE_CHOICE_PREFIX):
            ax.hlines(MULTIPLE_CHOICE_CHANCE, t - 0.45, t + 0.45, color="0.15", linestyle=(0, (2, 2)), linewidth=1,
                      label=label, zorder=4)  # fmt: skip
            label = "_chance"


def _without_template(rows: pd.DataFrame, tasks: list[str]) -> list[str]:
    """The caption's table of the base model evaluated without its chat template: score and unread fraction per
    task (a separate experiment: its prompts are not the ones the runs were trained on)."""
    if rows.empty:
        return []
    cells = []
    for task in tasks:
        r = rows[rows.task == task]
        if len(r):
            unread = f", {r.unread.mean():.0%} unread" if "unread" in r and r.unread.notna().any() else ""
            cells.append(f"{task} {r.mean_at_k.mean():.2f}{unread}")
    return ["the base model without its chat template (one evaluation, not drawn): " + "; ".join(cells)]


def divergence_panel(ax, panel: dict, config: dict, tables: dict) -> Drawn:
    """Forward KL(π_ref‖π_θ) (on samples from π_ref) or π_θ's token entropy against training step: the mean over seeds
    ± 1 se (the error over prompts combined with the seeds' spread), one line per configuration × β, dodged."""
    rows = select(tables["divergence"], panel, config)
    rows = rows[rows.task == panel["task"]]
    metric = panel["metric"]
    # forward KL starts at 0 on every task: one scale; an entropy's level is the task's, so one scale per task
    drawn = Drawn(metric if metric == "forward_kl" else f"{metric} on {panel['task']}")
    if metric != "forward_kl":
        drawn.notes.append("its own y range (an entropy's level is its task's)")
    lines = list(rows.groupby(["kl", "beta"], sort=False))
    steps = sorted(rows.step.unique())
    gap = min(np.diff(steps)) if len(steps) > 1 else 1
    for i, ((kl_config, beta), runs) in enumerate(lines):
        style = style_of(kl_config, beta)
        stats = _seed_stats(runs, "step", metric, f"{metric}_stderr")
        x = stats.step + dodge(i, len(lines), 0.3 * gap)
        ax.plot(x, stats["mean"], markersize=4, label=kl_label(kl_config, beta), **style)
        se_band(ax, stats, x, style["color"])
        drawn.seeds.update(stats.n)
    ax.set_xlabel("training step")
    ax.set_ylabel("forward KL(π_ref‖π_θ) (nats)" if metric == "forward_kl" else "token entropy of π_θ (nats)")
    ax.set_title(task_name(panel["task"]), fontsize=9)
    ax.grid(alpha=0.3)
    if not lines:
        drawn.empty = f"no snapshot of this panel has been measured on {panel['task']} yet"
    return drawn


def kl_vs_beta_panel(ax, panel: dict, config: dict, tables: dict) -> Drawn:
    """KL(π_θ‖π_ref) at the end of training (aggregate.final_values: the mean of a run's last final_steps steps)
    against β: per configuration the mean over seeds ± 1 se (each run's error over its last steps combined with the
    seeds' spread), each seed as a small dot; the no-KL run (β = 0) as a black line with its ± 1 se band. β is a log
    axis over several β, a categorical one for a single β (one point must not read as three). Given the claims table,
    a ring in the verdict's colour marks each point a claim against no KL shows (or contradicts): whether a
    configuration keeps the policy closer is the claims table's to say, not the means'."""
    final = select(final_values(tables["training"], config), panel, config)
    drawn = Drawn("kl")
    none = final[final.kl == NO_KL]
    if len(none):
        mean, se, n = mean_and_se(none.kl_k3, none.kl_k3_stderr)
        ax.axhline(mean, color="black", linewidth=1.2, label=kl_label(NO_KL))
        if not math.isnan(se) and n >= 2:
            ax.axhspan(mean - se, mean + se, color="black", alpha=0.1, linewidth=0)
        drawn.seeds.add(n)
    configs = [k for k in dict.fromkeys(final.kl) if k != NO_KL]
    betas = sorted(final[final.kl != NO_KL].beta.unique())
    position = _beta_positions(betas)
    claims = tables.get("claims")
    for i, kl_config in enumerate(configs):
        rows = final[final.kl == kl_config]
        stats = _seed_stats(rows, "beta", "kl_k3", "kl_k3_stderr")
        shift = dodge(i, len(configs), 0.12 if len(betas) > 1 else 0.5)  # decades on a log axis, else categories
        x = position(stats.beta, shift)
        style = {**style_of(kl_config), "linestyle": "-"}
        ax.errorbar(x, stats["mean"], yerr=stats.se.where(stats.n >= 2), capsize=3, label=kl_label(kl_config),
                    **style)  # fmt: skip
        ax.scatter(position(rows.beta, shift), rows.kl_k3, s=8, alpha=0.5, color=style["color"], zorder=3)
        if claims is not None:
            _mark_verdicts(ax, stats.assign(x=x), claims, kl_config)
        drawn.seeds.update(stats.n)
    if claims is not None and configs:
        against_none = claims[(claims.baseline == NO_KL) & claims.candidate.isin(configs)]
        for verdict in [v for v in ("shown", "contradicted") if v in set(against_none.verdict)]:
            ax.plot([], [], "o", markersize=11, markerfacecolor="none", markeredgewidth=1.6, linestyle="",
                    color=VERDICT_COLOURS[verdict], label=f"ring: {verdict} against no KL")  # fmt: skip
        drawn.notes.append(
            "a ring in a verdict's colour marks a point where the claims table shows (or contradicts) that "
            "configuration's KL apart from no KL's at that β; no ring: not shown, not testable or no claim"
        )
    if final.empty:
        drawn.empty = "no run of this panel has logged a KL yet"
        return drawn
    if len(betas) > 1:
        ax.set_xscale("log")
        ax.minorticks_off()
    ax.set_xticks(position(pd.Series(betas), 0.0), [f"{b:g}" for b in betas])
    if len(betas) == 1:
        ax.set_xlim(-1, 1)
    ax.set_xlabel("β (no KL: the black line)")
    last = config["studies"][panel["study"]].get("final_steps", 5)
    ax.set_ylabel(f"KL(π_sampling‖π_ref), K3, mean of last {last} steps (nats)", fontsize=8)
    ax.grid(alpha=0.3)
    return drawn


def _beta_positions(betas: list[float]):
    """x of a β with a sideways shift: on a log axis β·10^shift over several β; with one β, the category 0 + shift."""
    if len(betas) > 1:
        return lambda beta, shift: np.asarray(beta, dtype=float) * 10**shift
    return lambda beta, shift: np.zeros(len(np.atleast_1d(beta))) + shift


# A panel of more lines than this draws no thin per-step lines, and lighter bands: five or more overlapping bands
# with their raw steps over them hide every line (a reviewer could not read the training reward row).
RAW_LINES_UP_TO = 3


def _mark_verdicts(ax, stats: pd.DataFrame, claims: pd.DataFrame, kl_config: str) -> None:
    """A ring in the verdict's colour around each β's point at which a claim of this configuration against no KL is
    shown or contradicted (configuration colours and verdict colours never coincide)."""
    against_none = claims[(claims.candidate == kl_config) & (claims.baseline == NO_KL)]
    for point in stats.itertuples():
        verdicts = set(against_none[np.isclose(against_none.beta.astype(float), point.beta)].verdict)
        for verdict in ("shown", "contradicted"):
            if verdict in verdicts:
                ax.plot(point.x, point.mean, linestyle="", marker="o", markersize=11, markerfacecolor="none",
                        markeredgewidth=1.6, color=VERDICT_COLOURS[verdict], zorder=4)  # fmt: skip


def step_curves(ax, rows: pd.DataFrame, column: str, window: int, dodge_width: float = 0.0):
    """Per configuration × β: a logged per-step column as each run's trailing mean over ``window`` steps
    (aggregate.trailing_mean), then the mean over seeds ± 1 se (thick, labelled, with a band), and, in a panel of at
    most RAW_LINES_UP_TO lines, each step as logged, the mean over seeds (thin); returns the seeds per line."""
    seeds = set()
    lines = list(rows.groupby(["kl", "beta"], sort=False))
    crowded = len(lines) > RAW_LINES_UP_TO
    for i, ((kl_config, beta), runs) in enumerate(lines):
        smoothed = pd.concat(
            [trailing_mean(run, column, window).assign(seed=seed) for seed, run in runs.groupby("seed")],
            ignore_index=True,
        )
        if smoothed.empty:
            continue
        stats = _seed_stats(smoothed, "step", "value", "se")
        style = {**style_of(kl_config, beta), "markevery": 3, "markersize": 4}  # marker: placement without colour
        offset = dodge(i, len(lines), dodge_width)
        x = stats.step + offset
        ax.plot(x, stats["mean"], label=kl_label(kl_config, None if kl_config == NO_KL else beta), **style)
        se_band(ax, stats, x, style["color"], alpha=0.08 if crowded else 0.18)
        seeds.update(stats.n)
        if crowded:
            continue
        # each step as logged (mean over seeds), thin: a spike the window spreads over several steps stays visible
        raw = pd.concat([step_values(run, column).rename("value").reset_index() for _, run in runs.groupby("seed")])
        raw = raw.dropna().groupby("step").value.mean()
        ax.plot(raw.index + offset, raw.to_numpy(), color=style["color"], linewidth=0.6, alpha=0.45)
    return seeds


def kl_curves_panel(ax, panel: dict, config: dict, tables: dict) -> Drawn:
    """KL(π_θ‖π_ref) (the K3 estimate logged each step) against training step: each run's trailing mean over the
    study's final_steps steps (so that the last point is the run's final KL), then the mean over seeds ± 1 se; one
    colour per configuration, one line style per β."""
    training = select(tables["training"], panel, config)
    window = config["studies"][panel["study"]].get("final_steps", 5)
    drawn = Drawn("kl", step_curves(ax, training, "kl_k3", window))
    ax.set_xlabel("training step")
    ax.set_ylabel(f"KL(π_sampling‖π_ref), K3, trailing {window}-step mean (nats)", fontsize=8)
    ax.grid(alpha=0.3)
    if not drawn.seeds:
        drawn.empty = "no run of this panel has logged a KL yet"
    return drawn


PANELS = {
    "curves": curves_panel,
    "bars": bars_panel,
    "divergence": divergence_panel,
    "kl_vs_beta": kl_vs_beta_panel,
    "kl_curves": kl_curves_panel,
}


def seeds_text(seeds: set[int], unit: str = "point") -> str:
    """'n = 2 seeds per point', 'n = 1–2 seeds per bar': the title line that gives a panel's n."""
    if not seeds:
        return ""
    low, high = min(seeds), max(seeds)
    return f"n = {low}{'' if low == high else f'–{high}'} seed{'s' if high > 1 else ''} per {unit}"


PROPORTIONS = ("pass@1", "accuracy", "task_reward")  # in [0, 1]: at least 0 to 0.05 shown


def share_y(axes, drawn: list[Drawn]) -> None:
    """Panels of one quantity share one y range. Every quantity drawn is ≥ 0 (scores, KL, entropy, norms): a band's
    lower edge below 0 is cut just under 0, where a line at 0 stays visible."""
    for quantity in {d.quantity for d in drawn}:
        group = [ax for ax, d in zip(axes, drawn, strict=True) if d.quantity == quantity and d.empty is None]
        if not group:
            continue
        low = min(ax.get_ylim()[0] for ax in group)
        high = max(max(ax.get_ylim()[1] for ax in group), 0.05 if quantity in PROPORTIONS else 0.0)
        low = 0.0 if quantity == "accuracy" else max(low, -0.03 * high)  # bars stand on 0
        for ax in group:
            ax.set_ylim(low, high)


def coinciding(ax) -> list[str]:
    """Groups of a panel's labelled lines with the same values at every point (drawn over one another but for the
    sideways dodge), as notes."""
    groups: dict[tuple, list[str]] = {}
    for line in ax.get_lines():
        if not line.get_label().startswith("_"):
            key = tuple(np.round(np.asarray(line.get_ydata(), dtype=float), 9))
            groups.setdefault(key, []).append(line.get_label())
    notes = []
    for key, labels in groups.items():
        if len(labels) > 1:
            notes.append(f"{', '.join(labels)} lie on one line{' (0 at every step)' if not np.any(key) else ''}")
    return notes


def too_short_for_lag(train: dict) -> bool:
    """Whether every batch of the run was sampled by the initial policy (steps ≤ async_level + 1)."""
    return bool(train.get("async_level", 0)) and train["steps"] <= train["async_level"] + 1


def async_text(train: dict) -> str:
    """Why an asynchronous run of at most async_level + 1 steps shows nothing: every batch it trained on was sampled
    by the initial policy (trainer.py: the batch trained at step t was generated at step max(0, t − k))."""
    level, steps = train.get("async_level", 0), train["steps"]
    if not level:
        return ""
    text = (f"Asynchronous RL at level {level}: the batch trained at step t was sampled at step max(0, t − {level}), "
            f"so the first {level + 1} steps train on batches of the initial policy, the reference: "
            "KL(π_sampling‖π_ref) is 0 there.")  # fmt: skip
    if too_short_for_lag(train):
        text += (f" This study has {steps} steps: its KL row is 0 at every step, and its reward is the reference's, "
                 "by construction, not a finding.")  # fmt: skip
    return text
