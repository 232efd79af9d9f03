"""The panels of the config's ``figures`` section, one function per panel kind, from the aggregated tables. Each
draws every series as its noise is (draw_series) and returns what it drew (Drawn): the artists whose values the
caption quotes, its seeds, why it is empty."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import matplotlib.colors as mcolors
import numpy as np
import pandas as pd

from klstudy.kl import NO_KL
from klstudy.report.aggregate import final_values, mean_and_se, question_scores, step_values, trailing_mean
from klstudy.report.figures import encoding
from klstudy.report.figures.encoding import beta_hatch, dodge, kl_label, marker_of, step_axis, style_of, tag, task_name

SEEDS_WITHOUT_BAND = 4  # up to this many seeds each is drawn and no ±1 se band is (a band of few seeds looks sure)
NOT_OK = {"collapsed": "x", "diverged": "X", "missing": "."}


@dataclass
class Drawn:
    """What a panel drew: its quantity, seeds per series, why it is empty, (label, artist) its caption quotes."""

    quantity: str
    seeds: set[int] = field(default_factory=set)
    empty: str | None = None
    quoted: list[tuple[str, object]] = field(default_factory=list)
    quote_style: str = ".2f"


def select(table: pd.DataFrame, panel: dict, config: dict) -> pd.DataFrame:
    """A panel's rows: its study and model, its configurations and β (β = 0 for no KL), and every configuration at
    the panel's β of the studies it draws beside (``with``)."""
    spec = config["studies"][panel["study"]]
    kls, betas = panel.get("kl", spec["kl"]), [float(b) for b in panel.get("betas", spec["betas"])]
    mine = (table.study == panel["study"]) & table.kl.isin(kls)
    rows = table[(mine | table.study.isin(panel.get("with", []))) & (table.model == panel["model"])]
    return rows[(rows.kl == NO_KL) | rows.beta.isin(betas)]


def status_suffix(group: pd.DataFrame) -> str:
    """' (1/2 collapsed)' for the runs of a series that did not finish ok."""
    bad = {s: n for s, n in group.status.value_counts().items() if s != "ok"}
    return " (" + ", ".join(f"{n}/{len(group)} {s}" for s, n in bad.items()) + ")" if bad else ""


def seed_ends(ax, x: float, values, kl_config: str, beta) -> None:
    """Each seed's last value as a dot at x: what a panel draws instead of seed lines past MAX_SEED_LINES."""
    tag(ax.scatter(np.full(len(values), x), values, s=9, color=encoding.config_colour(kl_config), edgecolors="white",
                   linewidths=0.4, zorder=4, label="_seed ends"), kl_config, beta, "band")  # fmt: skip


def draw_series(ax, runs: pd.DataFrame, kl_config: str, beta, label: str, offset: float = 0.0,
                each_seed: bool = True) -> tuple:  # fmt: skip
    """``runs``: columns seed, x, value, se. One seed: its line with ±1 se of its own error as a band. Two to
    SEEDS_WITHOUT_BAND seeds: each seed thin (not ``each_seed``: its last value a dot), the mean thick. More: the mean
    with a ±1 se band. A point at x = 0 is the base model's (drawn once, grey): lines leave from it undodged, with no
    marker there. Returns (mean line, seeds)."""
    style = style_of(kl_config, beta)
    seeds = runs.seed.nunique()
    stats = pd.DataFrame([(x, *mean_and_se(g.value, g.se)) for x, g in runs.groupby("x", sort=True)],
                         columns=["x", "mean", "se", "n"])  # fmt: skip
    x = stats.x.to_numpy(dtype=float) + np.where(stats.x > 0, offset, 0.0)
    if 1 < seeds <= SEEDS_WITHOUT_BAND and not each_seed:
        seed_ends(ax, float(x[-1]), runs[runs.x == runs.x.max()].value, kl_config, beta)
    elif 1 < seeds <= SEEDS_WITHOUT_BAND:
        for _, run in runs.groupby("seed"):
            run = run.sort_values("x")
            tag(ax.plot(run.x + np.where(run.x > 0, offset, 0.0), run.value, color=style["color"], linewidth=0.6,
                        linestyle=style["linestyle"], alpha=0.55, label="_seed")[0], kl_config, beta, "band")
    elif stats.se.notna().any():
        low, high = (stats["mean"] - stats.se).where(stats.x > 0), (stats["mean"] + stats.se).where(stats.x > 0)
        tag(ax.fill_between(x, low, high, facecolor=mcolors.to_rgba(style["color"], 0.12), linewidth=0.6,
                            edgecolor=mcolors.to_rgba(style["color"], 0.6), linestyle=style["linestyle"],
                            label="_band"), kl_config, beta, "band")  # fmt: skip
    line = ax.plot(x, stats["mean"], label=label, linewidth=1.6 if seeds > 1 else 1.2,
                   markevery=list(np.flatnonzero(stats.x > 0)), **style)[0]  # fmt: skip
    return tag(line, kl_config, None if kl_config == NO_KL else beta), seeds


def draw_base_point(ax, mean: float, se: float):
    """The base model's one measurement at step 0: a grey star with its ±1 se."""
    bars = ax.errorbar([0], [mean], yerr=[[se], [se]] if np.isfinite(se) else None, fmt="*", color=encoding.BASE_COLOUR,
                       markersize=7, capsize=0, zorder=5, label="base model (step 0)")  # fmt: skip
    bars.lines[0].set_gid("reference base")
    return bars.lines[0]


def base_heldout(heldout: pd.DataFrame, config: dict, model: str, data: str) -> tuple[float, float]:
    """The base model on a held-out set: its distinct step-0 evaluations pooled (mean, se). They evaluate one model on
    the same questions, so the questions' spread does not shrink with their number: the se is over the questions of
    the pooled per-question scores (without per_prompt: the evaluations' mean se), not √(Σ se²)/n."""
    studies = [s for s, spec in config["studies"].items() if spec["heldout_data"] == data and model in spec["models"]]
    rows = heldout[heldout.study.isin(studies) & (heldout.model == model) & (heldout.step == 0)]
    distinct = rows.drop_duplicates(["seed", "pass_at_1"])
    if distinct.empty:
        return math.nan, math.nan
    scores, ses = question_scores(distinct), distinct.get("stderr", pd.Series(math.nan, index=distinct.index))
    pooled = all(isinstance(v, list) for v in scores) and len({len(v) for v in scores}) == 1 and len(scores[0]) > 1
    se = np.std(np.mean(scores, 0), ddof=1) / math.sqrt(len(scores[0])) if pooled else ses.mean()
    return float(distinct.pass_at_1.mean()), float(se)


def curves_panel(ax, panel: dict, config: dict, tables: dict) -> Drawn:
    """Held-out pass@1 over training from the base model's evaluation at step 0; a run stopped early ends in ×."""
    study = config["studies"][panel["study"]]
    heldout, cells = select(tables["heldout"], panel, config), select(tables["cells"], panel, config)
    data = study["heldout_data"]
    drawn = Drawn("pass@1")
    base = base_heldout(tables["heldout"], config, panel["model"], data)
    series = list(cells.groupby(["study", "kl", "beta"], sort=False))
    every = study["train"].get("eval_every", 10)
    each_seed = heldout.groupby(["study", "kl", "beta"]).seed.nunique().sum() <= encoding.MAX_SEED_LINES
    values = []
    for i, ((name, kl_config, beta), group) in enumerate(series):
        label = kl_label(kl_config, None if kl_config == NO_KL else beta) + status_suffix(group)
        runs = heldout[(heldout.study == name) & (heldout.kl == kl_config) & (heldout.beta == beta)]
        runs = runs.assign(x=runs.step, value=runs.pass_at_1, se=runs.get("stderr", math.nan))
        if np.isfinite(base[0]):  # every run starts from the base model's one evaluation
            starts = runs[["seed"]].drop_duplicates().assign(x=0, step=0, value=base[0], se=base[1])
            runs = pd.concat([runs[runs.step > 0], starts])
        if runs.empty:
            continue
        line, seeds = draw_series(ax, runs, kl_config, beta, label, dodge(i, len(series), 0.3 * every), each_seed)
        drawn.seeds.add(seeds)
        drawn.quoted.append((label, line))
        values.extend(runs.value)
        for seed, run in runs.groupby("seed"):
            status = group[group.seed == seed].status
            if len(status) and status.iloc[0] in NOT_OK:
                last = run.sort_values("x").iloc[-1]
                ax.scatter(last.x, last.value, marker=NOT_OK[status.iloc[0]], s=40, zorder=4, color=line.get_color(),
                           label=f"{status.iloc[0]} (last evaluation)")  # fmt: skip
    if np.isfinite(base[0]) and values:
        drawn.quoted.insert(0, ("base model", draw_base_point(ax, *base)))
    step_axis(ax, heldout.step)
    ax.set_ylabel(f"held-out pass@1\n{task_name(config, data)}")
    ax.grid(alpha=0.3)
    if not values or max(values) == min(values):
        drawn.empty = "no held-out result yet" if not values else f"every run scores {max(values):g} throughout"
    return drawn


MULTIPLE_CHOICE_PREFIX, MULTIPLE_CHOICE_CHANCE = "mmlu", 0.25  # four letters A–D
NO_TEMPLATE_LABEL = "base model, no chat template"


def bars_panel(ax, panel: dict, config: dict, tables: dict) -> Drawn:
    """lm-eval mean@k per task of the final policy: the base model (its chat template on), then each configuration ×
    β (hatching = β); one seed: lm-eval's ±1 se; two to SEEDS_WITHOUT_BAND seeds: the mean, each seed a dot; chance
    on the multiple-choice tasks, a black line."""
    evaluations, tasks = tables["evaluations"], config["evaluation"]["tasks"]
    base = evaluations[(evaluations.study == "base") & (evaluations.model == panel["model"])]
    groups = [("base model", "base", 0.0, base[base.chat_template.astype(str) == "on"])]
    without = base[base.chat_template.astype(str) == "off"]
    if panel.get("base_without_template") and len(without):  # the paper's Baseline (No-CT), Figs. 5 and 10
        groups.append((NO_TEMPLATE_LABEL, "base", 0.0, without))
    cells = select(evaluations[evaluations.study != "base"], panel, config)
    for (kl_config, beta), rows in cells.groupby(["kl", "beta"], sort=False):
        groups.append((kl_label(kl_config, None if kl_config == NO_KL else beta), kl_config, beta, rows))
    drawn = Drawn("accuracy")
    width = 0.8 / len(groups)
    for g, (label, kl_config, beta, rows) in enumerate(groups):
        stats = [mean_and_se(r.mean_at_k, r.stderr) for r in (rows[rows.task == t] for t in tasks)]
        seeds = max(s[2] for s in stats)
        x = np.arange(len(tasks)) + dodge(g, len(groups), 0.8)
        errors = [s[1] if seeds == 1 or seeds > SEEDS_WITHOUT_BAND else np.nan for s in stats]
        part = "bar_no_template" if label == NO_TEMPLATE_LABEL else "bar"
        hatch = encoding.NO_TEMPLATE_HATCH if part == "bar_no_template" else (
            "" if kl_config == "base" else beta_hatch(0 if kl_config == NO_KL else beta))  # fmt: skip
        bars = ax.bar(x, [s[0] for s in stats], width, color=encoding.config_colour(kl_config), edgecolor="0.2",
                      linewidth=0.5, hatch=hatch, label=label)  # fmt: skip
        if any(np.isfinite(errors)):
            ax.errorbar(x, [s[0] for s in stats], yerr=errors, fmt="none", ecolor="0.15", capsize=0, linewidth=0.8)
        for bar in bars:
            tag(bar, kl_config, None if kl_config in (NO_KL, "base") else beta, part)
        if 1 < seeds <= SEEDS_WITHOUT_BAND:
            for xi, task in zip(x, tasks, strict=True):
                values = rows[rows.task == task].mean_at_k
                spread = np.linspace(-0.25, 0.25, len(values)) * width if len(values) > 1 else 0.0  # ties apart
                ax.scatter(xi + spread, values, s=6, color="black", zorder=4, linewidth=0,
                           label="one seed (a dot)")  # fmt: skip
        if kl_config != "base":
            drawn.seeds.add(seeds)
    for t, task in enumerate(tasks):
        if task.startswith(MULTIPLE_CHOICE_PREFIX):
            ax.hlines(MULTIPLE_CHOICE_CHANCE, t - 0.45, t + 0.45, color="0.15", linestyle="-", linewidth=0.8,
                      label="chance (four choices)", zorder=4, gid="reference chance")  # fmt: skip
    heights = [bar.get_height() for bar in ax.patches if np.isfinite(bar.get_height())]
    ax.set_ylim(0, max([0.05, *heights]) * 1.15)
    ax.set_xticks(range(len(tasks)), [task_name(config, t, short=True) for t in tasks])
    ax.set_ylabel(f"lm-eval mean@{config['evaluation']['k']} accuracy")
    ax.grid(alpha=0.3, axis="y")
    if not any(h > 0 for h in heights):
        drawn.empty = "no evaluation of this panel has results yet"
    return drawn


def divergence_panel(ax, panel: dict, config: dict, tables: dict) -> Drawn:
    """Forward KL(π_ref‖π_θ) or π_θ's token entropy on one task against training step, one series per configuration
    × β from the base model's one measurement at step 0."""
    rows = select(tables["divergence"], panel, config)
    rows, metric = rows[rows.task == panel["task"]], panel["metric"]
    drawn = Drawn(metric if metric == "forward_kl" else f"{metric} on {panel['task']}", quote_style=".3g")
    series = list(rows.groupby(["kl", "beta"], sort=False))
    steps = sorted(rows.step.unique())
    gap = min(np.diff(steps)) if len(steps) > 1 else 1
    zero = rows[rows.step == 0]
    single_base = len(zero) and np.ptp(zero[metric].to_numpy(dtype=float)) <= 1e-12  # step 0 is the reference
    for i, ((kl_config, beta), runs) in enumerate(series):
        runs = runs.assign(x=runs.step, value=runs[metric], se=runs[f"{metric}_stderr"])
        label = kl_label(kl_config, beta)
        line, seeds = draw_series(ax, runs, kl_config, beta, label, dodge(i, len(series), 0.3 * gap))
        drawn.seeds.add(seeds)
        drawn.quoted.append((label, line))
    if single_base and series:
        drawn.quoted.insert(0, ("base model", draw_base_point(ax, float(zero[metric].iloc[0]),
                                                               float(zero[f"{metric}_stderr"].iloc[0]))))  # fmt: skip
    step_axis(ax, steps)
    ax.set_ylabel("forward KL(π_ref‖π_θ), nats" if metric == "forward_kl" else "token entropy of π_θ, nats")
    ax.set_title(task_name(config, panel["task"], short=True).replace("\n", " "))
    ax.grid(alpha=0.3)
    if not series:
        drawn.empty = "no snapshot of this panel has been measured yet"
    return drawn


SEED_BESIDE = 0.075  # fig13: a seed's dot this far right of its mean's marker (β categories are 1 apart)


def kl_vs_beta_panel(ax, panel: dict, config: dict, tables: dict) -> Drawn:
    """The KL at the end of training against β as categories: the mean over seeds a marker, each seed a dot beside it;
    no KL a line across; a ring where a claim against no KL is shown or contradicted."""
    final = select(final_values(tables["training"], config), panel, config)
    drawn = Drawn("kl", quote_style=".2g")
    if final.empty:
        drawn.empty = "no run of this panel has logged a KL yet"
        return drawn
    betas = sorted(final[final.kl != NO_KL].beta.unique())
    position = {beta: i + 1 for i, beta in enumerate(betas)}
    configs = list(dict.fromkeys(final.kl))
    claims = tables.get("claims")
    for i, kl_config in enumerate(configs):
        rows = final[final.kl == kl_config]
        stats = pd.DataFrame([(beta, *mean_and_se(g.kl_k3, g.kl_k3_stderr)) for beta, g in rows.groupby("beta")],
                             columns=["beta", "mean", "se", "n"])  # fmt: skip
        shift = 0.0 if kl_config == NO_KL else dodge(i - (NO_KL in configs), len(configs) - (NO_KL in configs), 0.7)
        x = np.array([position.get(b, 0) for b in stats.beta]) + shift
        colour = encoding.config_colour(kl_config)
        tag(ax.plot(x, stats["mean"], color=colour, linestyle="", markersize=5, label=kl_label(kl_config),
                    **marker_of(kl_config))[0], kl_config, None, "marker")  # fmt: skip
        if kl_config == NO_KL:
            drawn.quoted.append((kl_label(NO_KL), tag(ax.axhline(stats["mean"].iloc[0], color="black", linewidth=0.9,
                                                                 label="_no KL"), NO_KL, None)))  # fmt: skip
        if (stats.n == 1).any():
            ax.errorbar(x[stats.n == 1], stats["mean"][stats.n == 1], yerr=stats.se[stats.n == 1], fmt="none",
                        color=colour, capsize=0, linewidth=0.8)  # fmt: skip
        if (stats.n > 1).any():
            at = [position.get(b, 0) + shift + SEED_BESIDE for b in rows.beta]
            tag(ax.scatter(at, rows.kl_k3, s=9, color=colour, zorder=4, edgecolors="white", linewidths=0.4,
                           label="_seeds"), kl_config, None, "band")  # fmt: skip
        if claims is not None and kl_config != NO_KL:
            against = claims[(claims.candidate == kl_config) & (claims.baseline == NO_KL)]
            for point in stats.assign(x=x).itertuples():
                verdicts = set(against[np.isclose(against.beta.astype(float), point.beta)].verdict)
                for verdict in verdicts & {"shown", "contradicted"}:
                    ax.plot(point.x, point.mean, marker="o", markersize=9, markerfacecolor="none", linestyle="",
                            markeredgewidth=1.4, color=encoding.VERDICT_COLOURS[verdict], zorder=4,
                            label=f"ring: {verdict} against no KL")  # fmt: skip
        drawn.seeds.update(stats.n)
    ax.set_xticks([0, *position.values()], ["no KL", *[f"{b:g}" for b in betas]])
    ax.set_xlim(-0.6, len(betas) + 0.6)
    ax.set_xlabel("β (categories)")
    last = config["studies"][panel["study"]].get("final_steps", 5)
    ax.set_ylabel(f"KL(π_sampling‖π_ref) at the end,\nK3, mean of the last {last} steps (nats)")
    ax.grid(alpha=0.3, axis="y")
    ax.set_ylim(min(0.0, ax.get_ylim()[0]), ax.get_ylim()[1])
    return drawn


def smoothed_series(ax, rows: pd.DataFrame, column: str, window: int, each_seed: bool = True) -> list:
    """Per configuration × β: each seed's steps as logged (thin; not ``each_seed``: its end a dot), and the trailing
    mean over ``window`` steps averaged over seeds (thick; its last point the runs' final value, trailing_mean),
    markers at steps staggered per series so that lines on top of each other show. Returns [(label, thick, seeds)]."""
    drawn = []
    groups = list(rows.groupby(["kl", "beta"], sort=False))
    for i, ((kl_config, beta), runs) in enumerate(groups):
        beta_or_none = None if kl_config == NO_KL else beta
        style = style_of(kl_config, beta_or_none)
        smoothed = []
        for seed, run in runs.groupby("seed"):
            if (raw := step_values(run, column).dropna()).empty:
                continue
            if each_seed:
                tag(ax.plot(raw.index, raw.to_numpy(), color=style["color"], linestyle=style["linestyle"],
                            linewidth=0.5, alpha=0.5, label="_raw", zorder=1)[0], kl_config, beta_or_none, "band")
            smoothed.append(trailing_mean(run, column, window).assign(seed=seed))
        if not smoothed:
            continue
        smoothed = pd.concat(smoothed)
        mean = smoothed.groupby("step").value.mean()
        if not each_seed:
            seed_ends(ax, mean.index[-1], smoothed[smoothed.step == mean.index[-1]].value, kl_config, beta_or_none)
        label = kl_label(kl_config, beta_or_none)
        every = max(1, len(mean) // 5)
        line = ax.plot(mean.index, mean.to_numpy(), linewidth=1.6, markevery=(i % every, every), label=label,
                       zorder=3, **style)[0]  # fmt: skip
        drawn.append((label, tag(line, kl_config, beta_or_none), runs.seed.nunique()))
    return drawn


def kl_curves_panel(ax, panel: dict, config: dict, tables: dict) -> Drawn:
    """KL(π_sampling‖π_ref) (the K3 estimate logged each step) against training step, thin as logged and thick as
    the trailing mean over the study's final_steps steps."""
    training = select(tables["training"], panel, config)
    window = config["studies"][panel["study"]].get("final_steps", 5)
    drawn = Drawn("kl", quote_style=".2g")
    for label, line, seeds in smoothed_series(ax, training, "kl_k3", window):
        drawn.quoted.append((label, line))
        drawn.seeds.add(seeds)
    step_axis(ax, training.step)
    ax.set_ylabel(f"KL(π_sampling‖π_ref), K3, nats\nthick: trailing {window}-step mean")
    ax.grid(alpha=0.3)
    if not drawn.seeds:
        drawn.empty = "no run of this panel has logged a KL yet"
    return drawn


PANELS = {"curves": curves_panel, "bars": bars_panel, "divergence": divergence_panel, "kl_vs_beta": kl_vs_beta_panel,
          "kl_curves": kl_curves_panel}  # fmt: skip


def share_y(axes, drawn: list[Drawn]) -> None:
    """Panels of one quantity share one y range, cut just under 0 (every quantity drawn is ≥ 0)."""
    for quantity in {d.quantity for d in drawn}:
        group = [ax for ax, d in zip(axes, drawn, strict=True) if d.quantity == quantity and d.empty is None]
        if group:
            high = max(ax.get_ylim()[1] for ax in group)
            low = max(min(ax.get_ylim()[0] for ax in group), -0.03 * high)
            for ax in group:
                ax.set_ylim(low, high)


def async_text(train: dict) -> str:
    """With a lag k step t trains on samples of step max(0, t − k) (trainer.py): the first k + 1 on the reference's."""
    k = train.get("async_level", 0)
    return (f"With a lag of {k} steps the first {k + 1} steps train on the reference's own samples, so "
            "KL(π_sampling‖π_ref) is 0 there." if k else "")  # fmt: skip
