"""The panels of the config's ``figures`` section, one function per panel kind, from the aggregated tables; each
draws the noise as it is (draw_series) and returns what it drew (Drawn), with the numbers its caption
quotes read from its artists."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from matplotlib import patheffects

from klstudy.figure_plan import lag_only
from klstudy.kl import NO_KL
from klstudy.report.aggregate import final_values, mean_and_se, step_values, trailing_mean
from klstudy.report.figures.encoding import (
    BASE_COLOUR,
    NO_TEMPLATE_HATCH,
    VERDICT_COLOURS,
    beta_hatch,
    config_colour,
    dodge,
    kl_label,
    marker_of,
    short_task_name,
    step_axis,
    study_name,
    style_of,
    tag,
    task_name,
)
from klstudy.report.figures.series import (
    RAW_SEED_LINES_UP_TO,
    SEEDS_WITHOUT_BAND,
    base_divergence,
    base_heldout,
    draw_base_point,
    draw_seed_ends,
    draw_series,
    error_drawing,
    from_base,
)

NOT_OK = {"collapsed": "x", "diverged": "X", "missing": "."}


@dataclass
class Drawn:
    """What a panel drew: its quantity (panels of one quantity share a y axis), the seeds per series, why it is
    empty (None when it has data), its notes for the caption, and the artists whose values the caption quotes."""

    quantity: str
    seeds: set[int] = field(default_factory=set)
    empty: str | None = None
    notes: list[str] = field(default_factory=list)
    unit: str = "point"  # what one n is of: a point (curves) or a bar
    quoted: list[tuple[str, object]] = field(default_factory=list)  # (what, artist): the caption reads its last value
    quote_style: str = ".2f"
    reference: bool = False  # a reference drawn (no KL, the base model, chance): something to read the rest against
    has_band: bool = False
    has_error_bars: bool = False  # one-seed errors drawn as bars at the points (many curves), not as bands
    has_seeds: bool = False
    own_scale: bool = False  # a y range of its own, not its quantity's shared one (share_y)
    seed_key: str = "thin line: each seed"  # the legend's words for how a seed is drawn
    last_x: set = field(default_factory=set)  # where the quoted series end (their step, before any sideways dodge)

    def add_series(self, label: str, line, seeds: int, error: str | None, last_x: int) -> None:
        """One series drawn by draw_series: its seeds, its error's drawing ('band', 'bars' or None) and line (quoted
        by the caption), where it ends."""
        self.seeds.add(seeds)
        self.has_band |= error == "band"
        self.has_error_bars |= error == "bars"
        self.has_seeds |= seeds > 1
        self.quoted.append((label, line))
        self.last_x.add(last_x)


def select(table: pd.DataFrame, panel: dict, config: dict) -> pd.DataFrame:
    """The rows of a panel's cells: its study and model, its KL configurations and β (β = 0 for "none"), and those of
    the studies it draws beside (``with``: every configuration at the panel's β)."""
    spec = config["studies"][panel["study"]]
    kls, betas = panel.get("kl", spec["kl"]), [float(b) for b in panel.get("betas", spec["betas"])]
    mine = (table.study == panel["study"]) & table.kl.isin(kls)
    beside = table.study.isin(panel.get("with", []))
    rows = table[(mine | beside) & (table.model == panel["model"])]
    return rows[(rows.kl == NO_KL) | rows.beta.isin(betas)]


def status_suffix(group: pd.DataFrame) -> str:
    """' (1/2 collapsed)' for the runs of a line that did not finish ok."""
    bad = {s: n for s, n in group.status.value_counts().items() if s != "ok"}
    return " (" + ", ".join(f"{n}/{len(group)} {s}" for s, n in bad.items()) + ")" if bad else ""


# ---------------------------------------------------------------------------------------------------------
# The panel kinds.


SEED_END_KEY = "dot right of the end: each seed's last evaluation"  # a crowded panel's seeds (draw_series seed_ends)


def curves_panel(ax, panel: dict, config: dict, tables: dict) -> Drawn:
    """Held-out pass@1 against training step, every curve starting at the base model's one evaluation (step 0); each
    configuration × β drawn as draw_series draws its seeds; a run that stopped early (collapsed or diverged) ends in
    a cross at its last evaluation. Series are dodged sideways by up to 0.15 of the evaluation interval."""
    study = config["studies"][panel["study"]]
    heldout, cells = select(tables["heldout"], panel, config), select(tables["cells"], panel, config)
    data = study["heldout_data"]
    drawn = Drawn("pass@1")
    base = base_heldout(tables["heldout"], config, panel["model"], data)
    lines = list(cells.groupby(["study", "kl", "beta"], sort=False))
    every = study["train"].get("eval_every", 10)
    # too many seed lines to read: each seed's last evaluation a dot right of the end, the series side by side
    crowded = sum(n for _, g in lines if 1 < (n := g.seed.nunique()) <= SEEDS_WITHOUT_BAND) > RAW_SEED_LINES_UP_TO
    last_step = heldout.step.max() if len(heldout) else 0
    shared = cells.groupby(["kl", "beta"]).study.nunique().max() > 1 if len(cells) else False
    values = []
    for i, ((name, kl_config, beta), group) in enumerate(lines):
        label = kl_label(kl_config, None if kl_config == NO_KL else beta) + status_suffix(group)
        label += f" ({study_name(config, name)})" if shared else ""  # one configuration in two studies
        runs = heldout[(heldout.study == name) & (heldout.kl == kl_config) & (heldout.beta == beta)]
        runs = runs.assign(x=runs.step, value=runs.pass_at_1, se=runs.get("stderr", math.nan))
        if np.isfinite(base[0]):  # every run starts from the base model: its one evaluation, not each run's own
            runs = from_base(runs, base[0], base[1])
        if runs.empty:
            drawn.notes.append(f"no results: {label}")
            continue
        bars_after = 0 if np.isfinite(base[0]) else -math.inf  # the base point carries its own error
        ends = last_step + 0.45 * every + dodge(i, len(lines), 0.5 * every) if crowded else None
        line, seeds, error = draw_series(ax, runs, kl_config, beta, label, dodge(i, len(lines), 0.3 * every),
                                         error=error_drawing(lines), bars_after=bars_after, seed_ends=ends)  # fmt: skip
        drawn.add_series(label, line, seeds, error, int(runs.x.max()))
        values.extend(runs.value)
        for seed, run in runs.groupby("seed"):
            status = group[group.seed == seed].status
            if len(status) and status.iloc[0] in NOT_OK:
                last = run.sort_values("x").iloc[-1]
                ax.scatter(last.x, last.value, marker=NOT_OK[status.iloc[0]], s=40, zorder=4, color=line.get_color(),
                           label=f"{status.iloc[0]} (last evaluation)")  # fmt: skip
    if crowded and drawn.has_seeds:
        drawn.seed_key = SEED_END_KEY
        drawn.notes.append("the columns of dots right of the end, left to right: " + "; ".join(
            label for label, _ in drawn.quoted))  # the series in drawing order, as dodged
    if np.isfinite(base[0]) and values:
        drawn.quoted.insert(0, ("base model (step 0)", draw_base_point(ax, *base)))
        drawn.reference = True
        pooled = f", the mean of the {base[2]} step-0 evaluations its runs made" if base[2] > 1 else ""
        drawn.notes.append(f"step 0 is the base model's one evaluation on {task_name(config, data)}{pooled}")
    if data in config.get("evaluation", {}).get("tasks", []):
        k = config["evaluation"]["k"]
        drawn.notes.append(
            f"these are the trainer's held-out evaluations of {task_name(config, data)} during training; an evaluation "
            f"figure's bars of the same task are lm-eval's mean@{k} of the final policy, another measurement of the "
            "same questions, each with its own error"
        )
    step_axis(ax, heldout.step)
    samples = study["train"].get("heldout_samples", 1)
    ax.set_ylabel(f"held-out pass@1, {task_name(config, data)}\n({_questions(config, data)} questions × {samples} "
                  f"sample{'s' if samples > 1 else ''})")  # fmt: skip
    ax.grid(alpha=0.3)
    if not values:
        drawn.empty = "; ".join(["no run of this panel has held-out results yet", *drawn.notes])
    elif max(values) == min(values):
        drawn.empty = f"every run scores {max(values):g} on {task_name(config, data)} at every evaluation"
    return drawn


def _questions(config: dict, data: str) -> str:
    size = (config.get("data", {}).get(data) or {}).get("size")
    return f"{size}" if size else "the"


# Multiple-choice tasks (MMLU and its procedural stand-ins, data/procedural.py): four letters A–D, so chance is 1/4.
MULTIPLE_CHOICE_PREFIX, MULTIPLE_CHOICE_CHANCE = "mmlu", 0.25


NO_TEMPLATE_LABEL = "base model, no chat template"


def bars_panel(ax, panel: dict, config: dict, tables: dict) -> Drawn:
    """lm-eval mean@k per task: the base model with its chat template (one evaluation, ±1 se over questions), then
    each KL configuration × β: one seed with lm-eval's ±1 se; two to SEEDS_WITHOUT_BAND seeds, the mean with each
    seed as a dot; more, the mean ± 1 se; hatching = β; above each bar the fraction of its completions with no
    readable answer; chance on the multiple-choice tasks as a dashed line. "n/a": not evaluated."""
    evaluations = tables["evaluations"]
    tasks = config["evaluation"]["tasks"]
    base = evaluations[(evaluations.study == "base") & (evaluations.model == panel["model"])]
    groups = [("base model", "base", 0.0, base[base.chat_template.astype(str) == "on"])]
    drawn = Drawn("accuracy", unit="bar")
    without = base[base.chat_template.astype(str) == "off"]
    if panel.get("base_without_template") and len(without):  # the paper's Baseline (No-CT), Figs. 5 and 10
        groups.append((NO_TEMPLATE_LABEL, "base", 0.0, without))
    else:
        drawn.notes += _without_template(without, tasks, config)
    cells = select(evaluations[evaluations.study != "base"], panel, config)
    cell_status = select(tables["cells"], panel, config)
    for (kl_config, beta), rows in cells.groupby(["kl", "beta"], sort=False):
        status = cell_status[(cell_status.kl == kl_config) & (cell_status.beta == beta)]
        groups.append((kl_label(kl_config, None if kl_config == NO_KL else beta) + status_suffix(status), kl_config,
                       beta, rows))  # fmt: skip
    width = 0.8 / max(len(groups), 1)
    any_value, tops, unread_labels = False, {t: 0.0 for t in range(len(tasks))}, []
    for g, (label, kl_config, beta, rows) in enumerate(groups):
        by_task = [rows[rows.task == task].dropna(subset=["mean_at_k"]) for task in tasks]
        stats = [mean_and_se(r.mean_at_k, r.stderr) for r in by_task]
        seeds = max([s[2] for s in stats] or [0])
        x = np.arange(len(tasks)) + dodge(g, len(groups), 0.8)
        errors = [s[1] if (seeds == 1 or seeds > SEEDS_WITHOUT_BAND) and np.isfinite(s[1]) else 0.0 for s in stats]
        colour = BASE_COLOUR if kl_config == "base" else config_colour(kl_config)
        part = "bar_no_template" if label == NO_TEMPLATE_LABEL else "bar"
        hatch = NO_TEMPLATE_HATCH if part == "bar_no_template" else (
            "" if kl_config == "base" else beta_hatch(0 if kl_config == NO_KL else beta))  # fmt: skip
        bars = ax.bar(x, [s[0] for s in stats], width, yerr=errors, color=colour, edgecolor="0.2", linewidth=0.5,
                      hatch=hatch, capsize=1.5, label=label, error_kw={"elinewidth": 0.8})  # fmt: skip
        for bar in bars:
            tag(bar, kl_config, None if kl_config in (NO_KL, "base") else beta, part)
        if bars.errorbar is not None:  # a white rim: a black error bar shows on a black (no KL) or dark bar too
            _, caps, stems = bars.errorbar.lines
            rim = [patheffects.withStroke(linewidth=2.0, foreground="white"), patheffects.Normal()]
            for artist in [*caps, *stems]:
                artist.set_path_effects(rim)
        if 1 < seeds <= SEEDS_WITHOUT_BAND:  # each seed a dot on its bar
            for xi, r in zip(x, by_task, strict=True):
                ax.scatter(np.full(len(r), xi), r.mean_at_k, s=6, color="black", zorder=4, linewidth=0,
                           label="one seed (a dot)")  # fmt: skip
            drawn.has_seeds = True
        if kl_config != "base":
            drawn.seeds.update(s[2] for s in stats if s[2])
        else:
            drawn.reference = len(rows) > 0
        for t, (xi, (mean, _, _), r) in enumerate(zip(x, stats, by_task, strict=True)):
            if pd.isna(mean):
                ax.text(xi, 0.005, "n/a", rotation=90, ha="center", va="bottom", fontsize=7)
                continue
            if mean == 0:  # a bar of height 0 would read as a missing one
                ax.text(xi, 0.005, "0", ha="center", va="bottom", fontsize=7)
            any_value = True
            tops[t] = max(tops[t], mean + errors[t], float(r.mean_at_k.max()))
            if "unread" in r and r.unread.notna().any():
                unread_labels.append((t, xi, f"{r.unread.mean():.0%}"))
    for t, xi, text in unread_labels:  # in a row above the task's tallest error bar: no bar's error bar crosses one
        ax.text(xi, tops[t] + 0.01, text, rotation=90, ha="center", va="bottom", fontsize=7, color="0.25")
    if _chance_lines(ax, tasks):
        drawn.reference = True
    ax.set_ylim(0, max([0.05, *tops.values()]) / 0.78)  # room for the unread labels above the tallest bar
    ax.set_xticks(range(len(tasks)), [short_task_name(config, t) for t in tasks])
    ax.set_ylabel(f"lm-eval mean@{config['evaluation']['k']} accuracy\n(above a bar: % of answers unread)")
    ax.grid(alpha=0.3, axis="y")
    if not any_value:
        drawn.empty = "no evaluation of this panel has results yet"
    return drawn


def _chance_lines(ax, tasks: list[str]) -> bool:
    """A dashed line at chance across each multiple-choice task's bars, labelled once; whether any was drawn."""
    label = f"chance ({MULTIPLE_CHOICE_CHANCE:g}: four choices)"
    drawn = False
    for t, task in enumerate(tasks):
        if task.startswith(MULTIPLE_CHOICE_PREFIX):
            ax.hlines(MULTIPLE_CHOICE_CHANCE, t - 0.45, t + 0.45, color="0.15", linestyle=(0, (2, 2)), linewidth=0.8,
                      label=label, zorder=4, gid="reference chance")  # fmt: skip
            label, drawn = "_chance", True
    return drawn


def _without_template(rows: pd.DataFrame, tasks: list[str], config: dict) -> list[str]:
    """The caption's list of the base model evaluated without its chat template (a separate experiment: its prompts
    are not the ones the runs were trained on), not drawn."""
    if rows.empty:
        return []
    return [
        "the base model without its chat template, a separate experiment, is not drawn (figures' table of evaluations)"
    ]


def divergence_panel(ax, panel: dict, config: dict, tables: dict) -> Drawn:
    """Forward KL(π_ref‖π_θ) (on samples from π_ref) or π_θ's token entropy against training step, one series per
    configuration × β, drawn as draw_series draws its seeds (one seed: ± its error over prompts). An entropy's axis
    spans at least ±4 of its standard errors around its level, so that its noise shows as noise."""
    rows = select(tables["divergence"], panel, config)
    rows = rows[rows.task == panel["task"]]
    metric = panel["metric"]
    # forward KL starts at 0 on every task: one scale; an entropy's level is the task's, so one scale per task
    drawn = Drawn(metric if metric == "forward_kl" else f"{metric} on {panel['task']}", quote_style=".3g")
    lines = list(rows.groupby(["kl", "beta"], sort=False))
    steps = sorted(rows.step.unique())
    gap = min(np.diff(steps)) if len(steps) > 1 else 1
    errors = []
    base = base_divergence(rows, metric)
    for i, ((kl_config, beta), runs) in enumerate(lines):
        runs = runs.assign(x=runs.step, value=runs[metric], se=runs[f"{metric}_stderr"])
        if base is not None:  # every run's step 0 is the base model's one measurement: drawn once, grey
            runs = from_base(runs, *base)
        label = kl_label(kl_config, beta)
        bars_after = 0 if base is not None else -math.inf  # the base point carries its own error
        line, seeds, error = draw_series(ax, runs, kl_config, beta, label, dodge(i, len(lines), 0.3 * gap),
                                         error=error_drawing(lines), bars_after=bars_after)  # fmt: skip
        drawn.add_series(label, line, seeds, error, int(runs.x.max()))
        errors.extend(runs.se.dropna())
    if base is not None and lines:
        drawn.quoted.insert(0, ("base model (step 0)", draw_base_point(ax, base[0], base[1], 1)))
        drawn.reference = True
    step_axis(ax, steps)
    ax.set_ylabel("forward KL(π_ref‖π_θ), nats" if metric == "forward_kl" else "token entropy of π_θ, nats")
    ax.set_title(task_name(config, panel["task"]))
    ax.grid(alpha=0.3)
    if not lines:
        drawn.empty = f"no snapshot of this panel has been measured on {task_name(config, panel['task'])} yet"
    elif metric != "forward_kl" and errors:
        keep_noise_span(ax, 4 * float(np.median(errors)))
    return drawn


def keep_noise_span(ax, half: float) -> None:
    """Widen the y axis to at least ±half around its middle: a small quantity's axis shows its noise as noise."""
    low, high = ax.get_ylim()
    middle = (low + high) / 2
    if high - low < 2 * half:
        ax.set_ylim(max(0.0, middle - half), middle + half)


def kl_vs_beta_panel(ax, panel: dict, config: dict, tables: dict) -> Drawn:
    """KL(π_sampling‖π_ref) at the end of training (aggregate.final_values: the mean of a run's last final_steps
    steps) against β, β as categories (equally spaced, labelled with their values: a dodge on a log axis would invent
    β values): per configuration the mean over seeds (a marker, joined over β), each seed a small dot (one seed: ±
    its error over its last steps); no KL as its own category left, its mean a black reference line across. Given
    the claims table, a ring in the verdict's colour marks each point a claim against no KL shows or contradicts."""
    final = select(final_values(tables["training"], config), panel, config)
    drawn = Drawn("kl", quote_style=".2g", seed_key="small dot: each seed")
    if final.empty:
        drawn.empty = "no run of this panel has logged a KL yet"
        return drawn
    betas = sorted(final[final.kl != NO_KL].beta.unique())
    position = {beta: i + 1 for i, beta in enumerate(betas)}
    none = final[final.kl == NO_KL]
    if len(none):
        mean, se, n = mean_and_se(none.kl_k3, none.kl_k3_stderr)
        reference = tag(ax.axhline(mean, color="black", linewidth=0.9, label=kl_label(NO_KL)), NO_KL, None)
        tag(ax.plot([0], [mean], color="black", markersize=5, linestyle="", label="_mean", **marker_of(NO_KL))[0],
            NO_KL, None, "marker")  # fmt: skip
        if n > 1:
            tag(ax.scatter(np.full(len(none), SEED_BESIDE), none.kl_k3, s=9, color="black", zorder=4,
                           edgecolors="white", linewidths=0.4, label="_seeds"), NO_KL, None, "band")  # fmt: skip
        if n == 1 and np.isfinite(se):
            ax.errorbar([0], [mean], yerr=[se], color="black", capsize=2, linewidth=0.8)
            drawn.has_error_bars = True
        drawn.quoted.append((kl_label(NO_KL), reference))
        drawn.reference = True
        drawn.seeds.add(n)
    configs = [k for k in dict.fromkeys(final.kl) if k != NO_KL]
    claims = tables.get("claims")
    for i, kl_config in enumerate(configs):
        rows = final[final.kl == kl_config]
        stats = pd.DataFrame([(beta, *mean_and_se(g.kl_k3, g.kl_k3_stderr)) for beta, g in rows.groupby("beta")],
                             columns=["beta", "mean", "se", "n"])  # fmt: skip
        shift = dodge(i, len(configs), 0.7)
        x = np.array([position[b] for b in stats.beta]) + shift
        marker = marker_of(kl_config)
        # markers only: β is a category here, and a line across β in one style would read as a β's (solid: no KL)
        line = ax.plot(x, stats["mean"], color=config_colour(kl_config), linestyle="", markersize=5,
                       label=kl_label(kl_config), **marker)[0]  # fmt: skip
        tag(line, kl_config, None, "marker")
        one_seed = stats.n == 1
        if one_seed.any():
            ax.errorbar(x[one_seed], stats["mean"][one_seed], yerr=stats.se[one_seed], fmt="none",
                        color=config_colour(kl_config), capsize=2, linewidth=0.8)  # fmt: skip
            drawn.has_error_bars = True
        if (stats.n > 1).any():
            # beside the mean's marker (right of it): over it, they hid its fill, which says the estimator
            at = [position[b] + shift + SEED_BESIDE for b in rows.beta]
            seeds = ax.scatter(at, rows.kl_k3, s=9, color=config_colour(kl_config), zorder=4, edgecolors="white",
                               linewidths=0.4, label="_seeds")  # fmt: skip
            tag(seeds, kl_config, None, "band")
            drawn.has_seeds = True
        if claims is not None:
            _mark_verdicts(ax, stats.assign(x=x), claims, kl_config)
        drawn.seeds.update(stats.n)
    if claims is not None and configs:
        against_none = claims[(claims.baseline == NO_KL) & claims.candidate.isin(configs)]
        for verdict in [v for v in ("shown", "contradicted") if v in set(against_none.verdict)]:
            ax.plot([], [], "o", markersize=9, markerfacecolor="none", markeredgewidth=1.4, linestyle="",
                    color=VERDICT_COLOURS[verdict], label=f"ring: {verdict} against no KL")  # fmt: skip
    ax.set_xticks([0, *position.values()], ["no KL", *[f"{b:g}" for b in betas]])
    ax.set_xlim(-0.6, len(betas) + 0.6)
    ax.set_xlabel("β (categories)")
    last = config["studies"][panel["study"]].get("final_steps", 5)
    ax.set_ylabel(f"KL(π_sampling‖π_ref) at the end,\nK3, mean of the last {last} steps (nats)")
    ax.grid(alpha=0.3, axis="y")
    low, high = ax.get_ylim()
    ax.set_ylim(min(0.0, low), high)
    return drawn


SEED_BESIDE = 0.075  # fig13: a seed's dot this far right of its mean's marker (β categories are 1 apart)


def _mark_verdicts(ax, stats: pd.DataFrame, claims: pd.DataFrame, kl_config: str) -> None:
    """A ring in the verdict's colour around each β's point at which a claim of this configuration against no KL is
    shown or contradicted (configuration colours and verdict colours never coincide)."""
    against_none = claims[(claims.candidate == kl_config) & (claims.baseline == NO_KL)]
    for point in stats.itertuples():
        verdicts = set(against_none[np.isclose(against_none.beta.astype(float), point.beta)].verdict)
        for verdict in ("shown", "contradicted"):
            if verdict in verdicts:
                ax.plot(point.x, point.mean, linestyle="", marker="o", markersize=9, markerfacecolor="none",
                        markeredgewidth=1.4, color=VERDICT_COLOURS[verdict], zorder=4, label="_ring")  # fmt: skip


END_DOTS_OFFSET, END_DOTS_WIDTH = 0.9, 1.2  # in steps: where each seed's final value stands, right of the last step


def smoothed_series(
    ax, rows: pd.DataFrame, column: str, window: int, mean_raw: bool = False, reference: str = NO_KL
) -> list:
    """Per configuration × β: each step as logged, thin (each seed's own line; ``mean_raw``: the mean over seeds, one
    line a series, for a crowded panel, with each seed's final value a dot right of the last step), and its trailing
    mean over ``window`` steps (aggregate.trailing_mean: the last point is the run's final value) averaged over seeds,
    thick. The reference (no KL, or the configuration a study's
    claims compare with) is drawn wider and beneath the others, so that a configuration that trains as it does stays
    visible on it. Returns [(label, thick line, seeds)]."""
    drawn = []
    series = list(rows.groupby(["kl", "beta"], sort=False))
    # widths falling in drawing order (the reference widest, beneath): lines that nearly coincide each show an edge
    falling = np.linspace(2.2, 1.0, len(series)) if len(series) > 1 else [1.6] * len(series)
    widths = dict(zip([key for key, _ in series], falling, strict=True))
    for (kl_config, beta), runs in series:
        beta_or_none = None if kl_config == NO_KL else beta
        style = style_of(kl_config, beta_or_none)
        under = kl_config == reference
        raws, smoothed = [], []
        for seed, run in runs.groupby("seed"):
            raw = step_values(run, column).dropna()
            if raw.empty:
                continue
            raws.append(raw.rename(seed))
            smoothed.append(trailing_mean(run, column, window).assign(seed=seed))
        if not smoothed:
            continue
        thin = [pd.concat(raws, axis=1).mean(axis=1)] if mean_raw else raws
        for raw in thin:
            thin = ax.plot(raw.index, raw.to_numpy(), color=style["color"], linestyle=style["linestyle"],
                           linewidth=0.5, alpha=0.5, label="_raw", zorder=1)[0]  # fmt: skip
            tag(thin, kl_config, beta_or_none, "seed")
        mean = pd.concat(smoothed).groupby("step").value.mean()
        if mean_raw and len(smoothed) > 1:  # no seed's own line: each seed's final value, a dot right of the end
            ends = [s.sort_values("step").value.iloc[-1] for s in smoothed]
            at = mean.index.max() + END_DOTS_OFFSET + dodge(len(drawn), len(series), END_DOTS_WIDTH)
            near = 0.02 * (ax.dataLim.height or 1.0)  # about a dot's height on the panel drawn so far
            draw_seed_ends(ax, ends, at, 0.12, kl_config, beta_or_none, ties=[round(e / near) for e in ends])
        label = kl_label(kl_config, beta_or_none)
        line = ax.plot(mean.index, mean.to_numpy(), linewidth=3.0 if under else widths[(kl_config, beta)], markersize=4,
                       markevery=max(1, len(mean) // 5), label=label, zorder=2 if under else 3, **style)[0]  # fmt: skip
        drawn.append((label, tag(line, kl_config, beta_or_none), runs.seed.nunique()))
    return drawn


def kl_curves_panel(ax, panel: dict, config: dict, tables: dict) -> Drawn:
    """KL(π_sampling‖π_ref) (the K3 estimate logged each step) against training step: each step as logged, thin, and
    each run's trailing mean over the study's final_steps steps, thick (named on the axis); the last thick point is
    the run's final KL."""
    training = select(tables["training"], panel, config)
    window = config["studies"][panel["study"]].get("final_steps", 5)
    drawn = Drawn("kl", quote_style=".2g", seed_key="thin line: each step as logged, each seed")
    for label, line, seeds in smoothed_series(ax, training, "kl_k3", window):
        drawn.quoted.append((label, line))
        drawn.last_x.add(int(round(line.get_xdata()[-1])))
        drawn.seeds.add(seeds)
        drawn.reference |= label.startswith("no KL")
    drawn.has_seeds = True
    step_axis(ax, training.step)
    ax.set_ylabel(f"KL(π_sampling‖π_ref), K3, nats\nthick: trailing {window}-step mean; thin: each step")
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
    """'2 seeds per point', '1–2 seeds per bar': the title line that gives a panel's n."""
    seeds = {s for s in seeds if s}
    if not seeds:
        return ""
    low, high = min(seeds), max(seeds)
    return f"{low}{'' if low == high else f'–{high}'} seed{'s' if high > 1 else ''} per {unit}"


PROPORTIONS = ("pass@1", "accuracy", "task_reward")  # in [0, 1]: at least 0 to 0.05 shown


OWN_SCALE = 3  # a panel whose own top is under 1/OWN_SCALE of its quantity's shared top keeps a y range of its own


def share_y(axes, drawn: list[Drawn]) -> None:
    """Panels of one quantity share one y range, but a panel whose values would fill less than a third of it keeps
    its own (``own_scale``, which its caption says): a small quantity's curves and their noise squeezed into the
    bottom of another panel's range could not be read. Every quantity drawn is ≥ 0 (scores, KL, entropy, norms): a
    band's lower edge below 0 is cut just under 0, where a line at 0 stays visible."""
    for quantity in {d.quantity for d in drawn}:
        group = [(ax, d) for ax, d in zip(axes, drawn, strict=True) if d.quantity == quantity and d.empty is None]
        if not group:
            continue
        top = max(ax.get_ylim()[1] for ax, _ in group)
        # bars of one quantity compare heights across panels: always one range
        own = [(ax, d) for ax, d in group if quantity != "accuracy" and ax.get_ylim()[1] < top / OWN_SCALE]
        for ax, d in own:
            ax.set_ylim(max(ax.get_ylim()[0], -0.03 * ax.get_ylim()[1]), ax.get_ylim()[1])
            d.own_scale = True
        group = [ax for ax, d in group if not d.own_scale]
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
        if not line.get_label().startswith("_") and len(line.get_ydata()) > 1:
            key = tuple(np.round(np.asarray(line.get_ydata(), dtype=float), 9))
            groups.setdefault(key, []).append(line.get_label())
    notes = []
    for key, labels in groups.items():
        if len(labels) > 1:
            notes.append(f"{', '.join(labels)} lie on one line{' (0 at every step)' if not np.any(key) else ''}")
    return notes


NEAR_SPAN = 0.015  # lines closer than this fraction of their axis' span at every point read as one line


def near(ax) -> list[str]:
    """Groups of a panel's labelled lines that differ, but by less than NEAR_SPAN of the axis' span at every point
    (on a log axis, of its span in decades): one reads as the other; as notes."""
    lines = [line for line in ax.get_lines() if not line.get_label().startswith("_") and len(line.get_ydata()) > 1]
    log = ax.get_yscale() == "log"
    low, high = (np.log10(v) if log else v for v in ax.get_ylim())

    def values(line):
        y = np.asarray(line.get_ydata(), dtype=float)
        return np.log10(np.where(y > 0, y, np.nan)) if log else y

    groups: list[list] = []
    for i, a in enumerate(lines):
        for b in lines[i + 1 :]:
            ya, yb = values(a), values(b)
            close = len(ya) == len(yb) and np.nanmax(np.abs(ya - yb)) < NEAR_SPAN * (high - low)
            if close and not np.allclose(ya, yb, atol=1e-9, equal_nan=True):
                home = next((g for g in groups if a in g or b in g), None)
                if home is None:
                    groups.append([a, b])
                else:
                    home += [x for x in (a, b) if x not in home]
    return [f"{', '.join(line.get_label() for line in group)} lie within a line's width of one another at every point "
            "(drawn in falling widths, so that each shows)" for group in groups]  # fmt: skip


too_short_for_lag = lag_only  # every batch sampled by the initial policy (config.lag_only)


def async_text(train: dict) -> str:
    """Why an asynchronous run of at most async_level + 1 steps shows nothing: every batch it trained on was sampled
    by the initial policy (trainer.py: the batch trained at step t was generated at step max(0, t − k))."""
    level, steps = train.get("async_level", 0), train["steps"]
    if not level:
        return ""
    text = (f"Asynchronous RL with a lag of {level} steps: the batch trained at step t was sampled at step "
            f"max(0, t − {level}), so the first {level + 1} steps train on batches of the initial policy, the "
            "reference, and KL(π_sampling‖π_ref) is 0 there.")  # fmt: skip
    if too_short_for_lag(train):
        text += (f" A study of {steps} steps trains on nothing else: its KL is 0 at every step and its reward is the "
                 "reference's, by construction.")  # fmt: skip
    return text
