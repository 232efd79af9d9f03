"""The study's figures, drawn from tidy result tables (never from typed-in numbers); its tables are tables.py's.

Every figure uses one encoding, defined here for every module that draws (``style_of``, ``beta_linestyle``):
colour = KL configuration, line style (bars: hatching) = β, marker = placement; and one uncertainty convention
(aggregate.UNCERTAINTY): a point, line or bar is the mean over n training seeds, its error bar or band ± one
standard error that combines the seeds' spread with each measurement's own error. A figure never decides whether
a difference is a finding: where one of the claims table's claims tests what a panel shows, the figure prints that
claim's verdict, z and critical value from the table (figures/claims.csv), and the claims figure (claims_forest)
draws every claim's effect ± critical·se.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.colors as mcolors  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib import ticker  # noqa: E402

from klstudy.aggregate import UNCERTAINTY, final_values, mean_and_se, step_values, trailing_mean  # noqa: E402
from klstudy.kl import NO_KL, PATHWISE, KLSpec  # noqa: E402

# ---------------------------------------------------------------------------------------------------------
# The shared encoding.

CONFIG_COLOURS = {
    NO_KL: "black",
    "k1-reward": "tab:blue",
    "k1-loss": "tab:orange",
    "k3-reward": "tab:red",
    "k3-loss": "tab:green",
    "k1-both": "tab:purple",
    "k3-both": "tab:brown",
    "k2-reward": "tab:pink",
    "k2-loss": "tab:olive",
    "k2-both": "tab:cyan",
}
BASE_COLOUR = "0.6"  # the base model (no RL)
# A framework's per-token loss gradient: its pathwise configuration's colour, darkened by this much (0: the same).
LOSS_GRADIENT_SHADES = {PATHWISE: 0.0, "ratio": 0.35, "score": 0.55, "st": -0.35, "isst": -0.55}
BETA_LINESTYLES = ("-", "--", ":", "-.")
BETA_HATCHES = ("", "//", "..", "xx")
PLACEMENT_MARKERS = {"reward": "o", "loss": "s", "both": "^", "none": "D"}
VERDICT_COLOURS = {"shown": "tab:green", "contradicted": "tab:red", "not shown": "0.35"}
UNTESTED_COLOUR = "0.7"  # "not testable: …", "no prediction": no interval to read


def config_colour(kl_config: str) -> str | tuple:
    """The colour of a KL configuration in every figure ("base": the base model)."""
    if kl_config == "base":
        return BASE_COLOUR
    if kl_config in CONFIG_COLOURS:
        return CONFIG_COLOURS[kl_config]
    spec = KLSpec.from_name(kl_config)
    colour = np.array(mcolors.to_rgb(CONFIG_COLOURS.get(f"{spec.estimator}-{spec.placement}", "grey")))
    shade = LOSS_GRADIENT_SHADES.get(spec.loss_gradient, 0.0)
    towards = np.ones(3) if shade > 0 else np.zeros(3)  # lighter towards white, darker towards black
    return tuple(colour + abs(shade) * (towards - colour))


def beta_grid(config: dict) -> list[float]:
    """Every β > 0 of the config's studies, sorted: the order that line styles and hatches follow."""
    return sorted({float(b) for spec in config["studies"].values() for b in spec["betas"] if float(b) > 0})


def _beta_index(beta: float | None, grid: list[float] | None) -> int:
    if not beta or not grid:
        return 0
    matches = [i for i, b in enumerate(grid) if math.isclose(b, float(beta))]
    return matches[0] if matches else 0


def beta_linestyle(beta: float | None, grid: list[float] | None = None):
    """The line style of β (its rank in ``grid``, beta_grid(config)); solid for β = 0 or without a grid."""
    return BETA_LINESTYLES[_beta_index(beta, grid) % len(BETA_LINESTYLES)]


def beta_hatch(beta: float | None, grid: list[float] | None = None) -> str:
    """A bar's hatching for β, in the order of beta_linestyle."""
    return BETA_HATCHES[_beta_index(beta, grid) % len(BETA_HATCHES)]


def style_of(kl_config: str, beta: float | None = None, grid: list[float] | None = None) -> dict:
    """Keyword arguments for ax.plot: the configuration's colour, β's line style, the placement's marker."""
    placement = "none" if kl_config in (NO_KL, "base") else KLSpec.from_name(kl_config).placement
    return {
        "color": config_colour(kl_config),
        "linestyle": beta_linestyle(beta, grid),
        "marker": PLACEMENT_MARKERS[placement],
    }


def kl_label(kl_config: str, beta: float | None = None) -> str:
    """'K1 in reward, β = 0.1'; 'no KL (β = 0)'; 'base model'. Without β: the configuration alone."""
    if kl_config == "base":
        return "base model"
    spec = KLSpec.from_name(kl_config)
    if spec.placement == "none":
        return "no KL (β = 0)"
    label = f"{spec.estimator.upper()} in {'reward and loss' if spec.placement == 'both' else spec.placement}"
    label = label if spec.loss_gradient == PATHWISE else f"{label} ({spec.loss_gradient})"
    return label if beta is None else f"{label}, β = {float(beta):g}"


def verdict_colour(verdict: str):
    return VERDICT_COLOURS.get(str(verdict), UNTESTED_COLOUR)


def save(fig, png: Path) -> None:
    """Write the figure as PNG and as a PDF beside it."""
    png = Path(png)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=150, bbox_inches="tight")
    fig.savefig(png.with_suffix(".pdf"), bbox_inches="tight")
    plt.close(fig)


def model_names(config: dict, models) -> str:
    """The models as a reader knows them: the hub id, the GGUF file, or '<alias> (built locally)'."""
    names = []
    for model in dict.fromkeys(models):
        spec = config["models"].get(model, {})
        names.append(spec.get("hub_id") or spec.get("gguf") or f"{model} (built locally)")
    return ", ".join(names)


def figure_title(title: str, config: dict, models, width_inches: float = 12) -> str:
    """A figure's title with the run's model(s) and scale, from the config, wrapped to the figure's width."""
    return (
        textwrap.fill(title, max(40, int(width_inches * 9)))
        + f"\n{model_names(config, models)}, {config['scale']} scale"
    )


def footnote(fig, lines: list[str], width_inches: float) -> None:
    """Text under the figure (the uncertainty convention, the claims' verdicts), wrapped to the figure's width; the
    figure grows by the text's height, so that the panels keep theirs."""
    chars = max(60, int(width_inches * 15))
    text = "\n".join(textwrap.fill(line, chars, subsequent_indent="    ") for line in lines if line)
    fig.supxlabel(text, x=0.0, ha="left", fontsize=7, linespacing=1.3)
    fig.set_figheight(fig.get_figheight() + 0.135 * (text.count("\n") + 1))


def figure_legend(fig, axes) -> None:
    """One legend for the whole figure, right of the panels (outside the data); each label once."""
    seen = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if not label.startswith("_"):
                seen.setdefault(label, handle)
    if seen:
        fig.legend(list(seen.values()), list(seen), loc="outside right center", fontsize=8, frameon=False)


def say_why_empty(ax, reason: str) -> None:
    """A panel without data says so, in the panel, instead of showing empty axes."""
    ax.text(0.5, 0.5, textwrap.fill(reason, 40), transform=ax.transAxes, ha="center", va="center", fontsize=9,
            color="0.3")  # fmt: skip
    ax.set_xticks([])
    ax.set_yticks([])


DODGED = "Series at the same x are dodged sideways a little, so that none hides another (x: their shared step or β)."


def _dodge(index: int, count: int, width: float) -> float:
    """The x offset of the index-th of count series, so that points at the same x do not hide each other."""
    return (index - (count - 1) / 2) * width / max(count, 1)


def _band(ax, x, mean, se, colour, alpha: float = 0.18) -> None:
    mean, se = np.asarray(mean, dtype=float), np.asarray(se, dtype=float)
    ax.fill_between(x, mean - se, mean + se, color=colour, alpha=alpha, linewidth=0)


# ---------------------------------------------------------------------------------------------------------
# The claims table, as the figures read it.

CLAIM_COLUMNS = ("claim", "effect", "se", "z", "critical", "verdict")


def read_claims(path: Path) -> pd.DataFrame:
    """figures/claims.csv, checked for the columns a figure reads."""
    claims = pd.read_csv(path)
    missing = [c for c in CLAIM_COLUMNS if c not in claims]
    if missing:
        raise ValueError(f"{path}: the claims table has no column {', '.join(missing)}")
    return claims


def _number(value, digits: int = 2) -> str:
    return "n/a" if pd.isna(value) else f"{float(value):.{digits}g}"


def claim_line(row) -> str:
    """One claim's verdict as the claims table states it: name, β, verdict, effect ± se, z against its critical."""
    beta = row.get("beta")
    where = "" if pd.isna(beta) or float(beta) == 0 else f", β = {float(beta):g}"
    if str(row.get("note", "")).startswith("trend"):
        where = ", trend over β"
    numbers = [] if pd.isna(row["effect"]) else [f"effect {_number(row['effect'], 3)}"]
    if pd.notna(row["se"]):
        numbers[-1:] = [f"{numbers[-1]} ± {_number(row['se'])}"] if numbers else []
    if pd.notna(row["z"]):
        numbers.append(f"z = {_number(row['z'])}, needs {_number(row['critical'], 3)}")
    return f"{row['claim']}{where}: {row['verdict']}" + (f" ({', '.join(numbers)})" if numbers else "")


# A panel kind's metric in the claims table (divergence panels: the panel's own metric).
PANEL_METRICS = {"curves": "heldout", "bars": "evaluation", "kl_vs_beta": "final_kl", "kl_curves": "final_kl"}


def panel_claims(claims: pd.DataFrame | None, panel: dict, config: dict) -> pd.DataFrame:
    """The claims table's rows about what a panel draws: its study, model and metric, a candidate it draws."""
    if claims is None or claims.empty:
        return pd.DataFrame(columns=CLAIM_COLUMNS)
    metric = panel.get("metric") if panel["kind"] == "divergence" else PANEL_METRICS.get(panel["kind"])
    spec = config["studies"][panel["study"]]
    kls, betas = panel.get("kl", spec["kl"]), [float(b) for b in panel.get("betas", spec["betas"])]
    rows = claims[(claims.study == panel["study"]) & (claims.metric == metric) & claims.candidate.isin(kls)]
    beta = pd.to_numeric(rows.beta, errors="coerce")
    rows = rows[beta.isna() | (beta == 0) | beta.isin(betas)]  # a panel of one β: that β's claims (and trends)
    return rows[rows.model == panel["model"]] if "model" in rows else rows


def verdicts_text(rows: pd.DataFrame) -> str:
    """A panel's title line from the claims table's verdicts on it, 'claims: 0 of 4 shown (closest not shown: z 4.9
    of 31.8)', so that a difference the eye sees between bars or points is read beside what the rule says of it."""
    if rows.empty:
        return ""
    judged = rows[rows.verdict.isin(VERDICT_COLOURS)]  # shown, not shown, contradicted: the rows with a test
    if judged.empty:
        return f"claims: none of {len(rows)} testable here"
    contradicted = (judged.verdict == "contradicted").sum()
    counts = f"{(judged.verdict == 'shown').sum()} of {len(judged)} shown"
    counts += f", {contradicted} contradicted" if contradicted else ""
    unshown = judged[(judged.verdict == "not shown") & judged.z.notna() & (judged.critical > 0)]
    closest = ""
    if len(unshown):
        row = unshown.loc[(unshown.z / unshown.critical).idxmax()]
        closest = f" (closest not shown: z {_number(row.z)} of {_number(row.critical, 3)})"
    return f"claims: {counts}{closest}"


# ---------------------------------------------------------------------------------------------------------
# Figure 1 (§3.3).


def fig01_toy_bias_variance(results: pd.DataFrame, tests: pd.DataFrame, png: Path) -> None:
    """Figure 1: squared bias and variance of each configuration's gradient estimate against T.

    One row per setting; columns ∂/∂a and ∂/∂b for squared bias, then for variance; log scale, one y range per
    quantity; one line per estimator × placement ("none" has no spread and is left out), coloured as everywhere
    (style_of), its marker the placement's. Bands: ± one Monte Carlo standard error, (|bias| ± se)² for the squared
    bias (none where |bias| < se: that band reaches 0, off the log axis) and variance·(1 ± √(2/(trials − 1))) for the
    variance. A filled bias marker is a bias significantly different from zero at its pointwise Bonferroni level (the
    one Table 1 uses); a hollow one is consistent with zero. Exact zeros (∂/∂b at T = 1, where b does not enter) have
    no place on a log axis and are left out, as the panel says. The frameworks' per-token loss corrections
    (kl.LOSS_GRADIENTS) are in Table 1, not here: this is the paper's figure.
    """
    results = results[(results.placement != "none") & (results.get("loss_gradient", PATHWISE) == PATHWISE)]
    critical = tests.set_index("config")["z_critical"]
    settings = list(dict.fromkeys(results.setting))
    trials = int(results.trials.iloc[0]) if "trials" in results and len(results) else 0
    panels = [("squared_bias", "a"), ("squared_bias", "b"), ("variance", "a"), ("variance", "b")]
    fig, axes = plt.subplots(len(settings), 4, figsize=(15, 3.1 * len(settings)), squeeze=False, layout="constrained")
    for row, setting in enumerate(settings):
        for col, (metric, param) in enumerate(panels):
            _toy_panel(axes[row, col], results[(results.setting == setting) & (results.param == param)], metric,
                       critical)  # fmt: skip
            what = "squared bias" if metric == "squared_bias" else "variance"
            axes[row, col].set_title(f"{setting}: {what} of ∂/∂{param}\nn = {trials} trials per point", fontsize=9)
            if col in (0, 2):
                axes[row, col].set_ylabel(what)
    for first in (0, 2):  # one y range per quantity: squared bias panels together, variance panels together
        _share_log_limits([ax for r in axes for ax in r[first : first + 2]])
    figure_legend(fig, axes.ravel())
    fig.suptitle("Bias and variance of KL-gradient estimates in the parametric autoregressive model (§3.3)")
    footnote(
        fig,
        [f"Each point: n = {trials} Monte Carlo trials; bands ± 1 standard error over trials (a squared bias within "
         "one se of zero has none: its band reaches 0). Filled marker: bias significantly different from zero "
         "(Table 1's Bonferroni level); hollow: consistent with zero (its height is Monte Carlo noise). Colour = "
         "configuration, marker = placement."],
        15,
    )  # fmt: skip
    save(fig, png)


def _toy_panel(ax, rows: pd.DataFrame, metric: str, critical: pd.Series) -> None:
    dropped = False
    for config, line in rows.groupby("config", sort=False):
        line = line.sort_values("T")
        positive = line[metric] > 0
        dropped |= not positive.all()
        line = line[positive]
        style = style_of(config)
        colour = style["color"]
        if metric == "squared_bias":
            low = np.clip(line.bias.abs() - line.std_error, 0, None) ** 2
            high = (line.bias.abs() + line.std_error) ** 2
        else:
            relative = np.sqrt(2 / (line.trials - 1))
            low, high = line.variance * (1 - relative), line.variance * (1 + relative)
        # where the bias is within one se of zero its band reaches 0, off the log axis: the hollow marker says so
        ax.fill_between(line["T"], low.where(low > 0, high), high, where=low > 0, color=colour, alpha=0.15,
                        linewidth=0)  # fmt: skip
        ax.plot(line["T"], line[metric], color=colour, linestyle="-", label=kl_label(config))
        significant = line["z"].abs() > critical.get(config, np.inf)
        for mask, face in ((significant, colour), (~significant, "white")):
            ax.scatter(line["T"][mask], line[metric][mask], marker=style["marker"], color=colour, zorder=3, s=20,
                       facecolors=colour if metric == "variance" else face)  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length T")
    ax.grid(alpha=0.3, which="major")
    if dropped:
        ax.text(0.02, 0.97, "exact zeros (T = 1) not drawn", transform=ax.transAxes, va="top", fontsize=7,
                color="0.3")  # fmt: skip


def _share_log_limits(axes) -> None:
    """One y range for these log axes: from the smallest plotted value to the largest band, bands clipped below."""
    values = [y for ax in axes for line in ax.get_lines() for y in np.asarray(line.get_ydata(), dtype=float)]
    values = [y for y in values if y > 0 and np.isfinite(y)]
    tops = [y for ax in axes for c in ax.collections for y in c.get_datalim(ax.transData).intervaly if y > 0]
    if values:
        top = max([*values, *[t for t in tops if np.isfinite(t)]])
        for ax in axes:
            ax.set_ylim(min(values) / 5, top * 5)


# ---------------------------------------------------------------------------------------------------------
# §4: the figures of the config's ``figures`` section, from the aggregated tables (klstudy.aggregate).

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
    grid = beta_grid(config)
    lines = list(cells.groupby(["kl", "beta"], sort=False))
    every = config["studies"][panel["study"]]["train"].get("eval_every", 10)
    means = []
    for i, ((kl_config, beta), group) in enumerate(lines):
        label = kl_label(kl_config, None if kl_config == NO_KL else beta) + _status_suffix(group)
        runs = heldout[(heldout.kl == kl_config) & (heldout.beta == beta)]
        if runs.empty:
            drawn.notes.append(f"no results: {label}")
            continue
        style = style_of(kl_config, beta, grid)
        stats = _seed_stats(runs, "step", "pass_at_1", "stderr")
        x = stats.step + _dodge(i, len(lines), 0.3 * every)
        ax.plot(x, stats["mean"], markersize=4, label=label, **style)
        _band(ax, x, stats["mean"], stats.se, style["color"])
        drawn.seeds.update(stats.n)
        means.extend(stats["mean"])
        for seed, run in runs.groupby("seed"):
            status = group[group.seed == seed].status
            if len(status) and status.iloc[0] in NOT_OK:
                ax.scatter(run.step.iloc[-1], run.pass_at_1.iloc[-1], marker=NOT_OK[status.iloc[0]], s=60, zorder=4,
                           color=style["color"])  # fmt: skip
    ax.set_xlabel("training step")
    ax.set_ylabel(f"held-out pass@1 ({data})")
    ax.grid(alpha=0.3)
    if not means:
        drawn.empty = "; ".join(["no run of this panel has held-out results yet", *drawn.notes])
    elif max(means) == 0:
        drawn.notes.append(f"every run scores 0 on {data} at every evaluation")
    return drawn


def bars_panel(ax, panel: dict, config: dict, tables: dict) -> Drawn:
    """lm-eval mean@k per task: the base model with (CT) and without (No-CT) its chat template (one evaluation, its
    error over questions), then each KL configuration × β (mean over seeds ± 1 se, combining the seeds' spread with
    lm-eval's error over questions); hatching = β. "n/a": not evaluated."""
    evaluations = tables["evaluations"]
    tasks = config["evaluation"]["tasks"]
    grid = beta_grid(config)
    base = evaluations[(evaluations.study == "base") & (evaluations.model == panel["model"])]
    groups = [
        (f"base model ({'CT' if t == 'on' else 'No-CT'}), one evaluation", base[base.chat_template == t],
         {"color": BASE_COLOUR if t == "on" else "white", "edgecolor": "0.3", "hatch": ""})
        for t in sorted(set(base.chat_template.astype(str)), reverse=True)
    ]  # fmt: skip
    cells = select(evaluations[evaluations.study != "base"], panel, config)
    cell_status = select(tables["cells"], panel, config)
    for (kl_config, beta), rows in cells.groupby(["kl", "beta"], sort=False):
        status = cell_status[(cell_status.kl == kl_config) & (cell_status.beta == beta)]
        label = kl_label(kl_config, None if kl_config == NO_KL else beta) + _status_suffix(status)
        style = {"color": config_colour(kl_config), "edgecolor": "black", "hatch": beta_hatch(beta, grid)}
        groups.append((label, rows, style))
    drawn = Drawn("accuracy", unit="bar")
    width = 0.8 / max(len(groups), 1)
    any_value, drawn_bars = False, []
    for g, (label, rows, style) in enumerate(groups):
        stats = [mean_and_se(r.mean_at_k, r.stderr) for r in (rows[rows.task == task] for task in tasks)]
        x = [t + _dodge(g, len(groups), 0.8) for t in range(len(tasks))]
        heights = [s[0] for s in stats]
        ax.bar(x, heights, width, yerr=[s[1] for s in stats], linewidth=0.5, capsize=2, label=label,
               error_kw={"elinewidth": 1}, **style)  # fmt: skip
        drawn_bars += [(xi, mean, se) for xi, (mean, se, _) in zip(x, stats, strict=True)]
        if not label.startswith("base"):
            drawn.seeds.update(s[2] for s in stats if s[2])
        for xi, (mean, _, _) in zip(x, stats, strict=True):
            if pd.isna(mean):
                ax.text(xi, 0.005, "n/a", rotation=90, ha="center", va="bottom", fontsize=6)
            else:
                any_value = True
    _label_short_bars(ax, drawn_bars)
    ax.set_xticks(range(len(tasks)), [t.replace("mmlu_college_", "MMLU ") for t in tasks], rotation=20, fontsize=8)
    ax.set_ylabel(f"mean@{config['evaluation']['k']} accuracy")
    ax.grid(alpha=0.3, axis="y")
    if not any_value:
        drawn.empty = "no evaluation of this panel has results yet"
    if not drawn.seeds:
        drawn.n_text = "n = 1 evaluation of the base model; no trained run evaluated yet"
    return drawn


SHORT_BAR = 0.04  # of the panel's tallest bar: a bar this short carries its value, or the eye misses it


def _label_short_bars(ax, bars: list[tuple[float, float, float]]) -> None:
    """Write the value above each bar (x, height, se) shorter than SHORT_BAR of the tallest, over its error bar (a base
    model without its chat template scores near 0: its bar is a line on the axis)."""
    top = max([h for _, h, _ in bars if np.isfinite(h)] or [0.0])
    for x, height, se in bars:
        if top > 0 and np.isfinite(height) and height < SHORT_BAR * top:
            y = height + (se if np.isfinite(se) else 0.0) + 0.01 * top
            ax.text(x, y, f"{height:.2g}", rotation=90, ha="center", va="bottom", fontsize=6)


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
    grid = beta_grid(config)
    lines = list(rows.groupby(["kl", "beta"], sort=False))
    steps = sorted(rows.step.unique())
    gap = min(np.diff(steps)) if len(steps) > 1 else 1
    for i, ((kl_config, beta), runs) in enumerate(lines):
        style = style_of(kl_config, beta, grid)
        stats = _seed_stats(runs, "step", metric, f"{metric}_stderr")
        x = stats.step + _dodge(i, len(lines), 0.3 * gap)
        ax.plot(x, stats["mean"], markersize=4, label=kl_label(kl_config, beta), **style)
        _band(ax, x, stats["mean"], stats.se, style["color"])
        drawn.seeds.update(stats.n)
    ax.set_xlabel("training step")
    ax.set_ylabel("forward KL(π_ref‖π_θ) (nats)" if metric == "forward_kl" else "token entropy of π_θ (nats)")
    ax.set_title(panel["task"], fontsize=9)
    ax.grid(alpha=0.3)
    if not lines:
        drawn.empty = f"no snapshot of this panel has been measured on {panel['task']} yet"
    return drawn


def kl_vs_beta_panel(ax, panel: dict, config: dict, tables: dict) -> Drawn:
    """KL(π_θ‖π_ref) at the end of training (aggregate.final_values: the mean of a run's last final_steps steps)
    against β: per configuration the mean over seeds ± 1 se (each run's error over its last steps combined with the
    seeds' spread), each seed as a small dot; the no-KL run (β = 0) as a black line with its ± 1 se band. Whether a
    configuration keeps the policy closer, or closer at larger β, is the claims table's to say (printed under the
    figure)."""
    final = select(final_values(tables["training"], config), panel, config)
    drawn = Drawn("kl")
    none = final[final.kl == NO_KL]
    if len(none):
        mean, se, n = mean_and_se(none.kl_k3, none.kl_k3_stderr)
        ax.axhline(mean, color="black", linewidth=1.2, label=kl_label(NO_KL))
        if not math.isnan(se):
            ax.axhspan(mean - se, mean + se, color="black", alpha=0.1, linewidth=0)
        drawn.seeds.add(n)
    configs = [k for k in dict.fromkeys(final.kl) if k != NO_KL]
    claims = tables.get("claims")
    for i, kl_config in enumerate(configs):
        rows = final[final.kl == kl_config]
        stats = _seed_stats(rows, "beta", "kl_k3", "kl_k3_stderr")
        factor = 10 ** _dodge(i, len(configs), 0.12)  # dodged sideways on the log axis
        style = {**style_of(kl_config), "linestyle": "-"}
        if claims is not None:  # hollow unless the claims table shows this point apart from no KL
            style["markerfacecolor"] = "white"
        ax.errorbar(stats.beta * factor, stats["mean"], yerr=stats.se, capsize=3, label=kl_label(kl_config), **style)
        ax.scatter(rows.beta * factor, rows.kl_k3, s=8, alpha=0.5, color=style["color"], zorder=3)
        if claims is not None:
            _mark_verdicts(ax, stats.assign(x=stats.beta * factor), claims, kl_config, style)
        drawn.seeds.update(stats.n)
    if claims is not None and configs:
        for fill, what in (("0.4", "filled: shown below or above no KL"), ("white", "hollow: not shown")):
            ax.plot([], [], "o", color="0.4", markerfacecolor=fill, linestyle="", label=what)
        drawn.notes.append(
            "a filled marker: the claims table shows that configuration's KL apart from no KL's at "
            "that β; hollow: it does not (not shown, not testable or no claim); a contradicted claim is named beside "
            "its point"
        )
    if final.empty:
        drawn.empty = "no run of this panel has logged a KL yet"
        return drawn
    ax.set_xscale("log")
    betas = sorted(final[final.kl != NO_KL].beta.unique())
    ax.set_xticks(betas, [f"{b:g}" for b in betas])
    ax.minorticks_off()
    ax.set_xlabel("β (no KL: the black line)")
    last = config["studies"][panel["study"]].get("final_steps", 5)
    ax.set_ylabel(f"KL(π_θ‖π_ref), K3, last {last} steps (nats)")
    ax.grid(alpha=0.3)
    return drawn


# A panel of more lines than this draws no thin per-step lines, and lighter bands: five or more overlapping bands
# with their raw steps over them hide every line (a reviewer could not read the training reward row).
RAW_LINES_UP_TO = 3


def _mark_verdicts(ax, stats: pd.DataFrame, claims: pd.DataFrame, kl_config: str, style: dict) -> None:
    """Fill the marker of each β at which a claim of this configuration against no KL is shown; write "contradicted"
    beside a point a claim contradicts (rare, and a fill cannot say it)."""
    against_none = claims[(claims.candidate == kl_config) & (claims.baseline == NO_KL)]
    for point in stats.itertuples():
        verdicts = set(against_none[np.isclose(against_none.beta.astype(float), point.beta)].verdict)
        if "shown" in verdicts:
            ax.plot(point.x, point.mean, linestyle="", marker=style["marker"], color=style["color"], zorder=4)
        if "contradicted" in verdicts:
            ax.annotate("contradicted", (point.x, point.mean), xytext=(6, 4), textcoords="offset points", fontsize=7,
                        color=VERDICT_COLOURS["contradicted"])  # fmt: skip


def step_curves(ax, rows: pd.DataFrame, column: str, window: int, grid: list[float], dodge_width: float = 0.0):
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
        style = {**style_of(kl_config, beta, grid), "marker": None}
        offset = _dodge(i, len(lines), dodge_width)
        x = stats.step + offset
        ax.plot(x, stats["mean"], label=kl_label(kl_config, None if kl_config == NO_KL else beta), **style)
        _band(ax, x, stats["mean"], stats.se, style["color"], alpha=0.08 if crowded else 0.18)
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
    drawn = Drawn("kl", step_curves(ax, training, "kl_k3", window, beta_grid(config)))
    ax.set_xlabel("training step")
    ax.set_ylabel(f"KL(π_θ‖π_ref), K3, trailing mean of {window} steps (nats)")
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


def _grid_shape(count: int) -> tuple[int, int]:
    """Rows and columns for a figure's panels: at most three across, four as two by two."""
    columns = 2 if count == 4 else min(count, 3)
    return math.ceil(count / columns), columns


def _seeds_text(seeds: set[int], unit: str = "point") -> str:
    """'n = 2 seeds per point', 'n = 1–2 seeds per bar': the title line that gives a panel's n."""
    if not seeds:
        return ""
    low, high = min(seeds), max(seeds)
    return f"n = {low}{'' if low == high else f'–{high}'} seed{'s' if high > 1 else ''} per {unit}"


PROPORTIONS = ("pass@1", "accuracy", "task_reward")  # in [0, 1]: at least 0 to 0.05 shown


def _share_y(axes, drawn: list[Drawn]) -> None:
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


def draw_panels(fig, axes, panels: list[dict], config: dict, tables: dict, claims) -> list[str]:
    """Draw each panel (given the claims table, each panel function sees its rows as tables["claims"]); titles carry
    the panel's n and a count of its claims' verdicts; returns the footnote's lines about claims and panels."""
    about = [panel_claims(claims, panel, config) for panel in panels]  # empty without a claims table
    drawn = [PANELS[panel["kind"]](ax, panel, config, {**tables, "claims": rows if claims is not None else None})
             for ax, panel, rows in zip(axes, panels, about, strict=True)]  # fmt: skip
    _share_y(axes, drawn)
    lines, listed, notes = [], set(), []
    for ax, panel, d, rows in zip(axes, panels, drawn, about, strict=True):
        title = panel.get("title", panel["study"])
        if ax.get_title():
            title = f"{title}: {ax.get_title()}"
        verdicts = "" if claims is None or d.empty else verdicts_text(rows)
        ax.set_title("\n".join(filter(None, [title, d.n_text or _seeds_text(d.seeds, d.unit), verdicts])), fontsize=9)
        if d.empty:
            say_why_empty(ax, d.empty)
        else:
            notes += [f"{title}: {note}." for note in d.notes if f"{title}: {note}." not in notes]
        for row in rows.to_dict("records"):
            line = claim_line(row)
            if line not in listed:
                listed.add(line)
                lines.append(line)
    if claims is not None:
        lines = (
            ["The claims table's verdicts on what these panels show (figures/claims.csv; a difference is a finding "
             "only where it says shown):", *[f"• {line}" for line in lines]]
            if lines else ["No claim of the claims table tests what these panels show."]
        )  # fmt: skip
    return notes + lines


def draw_paper_figure(name: str, config: dict, tables: dict, claims: pd.DataFrame | None = None):
    """A figure of the config's ``figures`` section: its panels, at most three across, one legend beside them, the
    uncertainty convention and (given the claims table) the verdicts of the claims about its panels under them."""
    spec = config["figures"][name]
    panels = spec["panels"]
    rows, columns = _grid_shape(len(panels))
    width = 4.6 * columns + 2.6
    fig, axes = plt.subplots(rows, columns, figsize=(width, 3.6 * rows + 1.2), squeeze=False, layout="constrained")
    axes = axes.ravel()
    for ax in axes[len(panels) :]:
        ax.remove()
    axes = list(axes[: len(panels)])
    claim_lines = draw_panels(fig, axes, panels, config, tables, claims)
    figure_legend(fig, axes)
    fig.suptitle(figure_title(spec["title"], config, [p["model"] for p in panels], width - 2.6), fontsize=11)
    dodged = DODGED if any(panel["kind"] != "bars" for panel in panels) else ""
    footnote(fig, [f"Lines, points and bars: the {UNCERTAINTY}. {dodged}", *claim_lines], width)
    return fig


def paper_figure(name: str, config: dict, tables: dict, png: Path, claims: pd.DataFrame | None = None) -> None:
    """draw_paper_figure, written to ``png`` (and a PDF beside it)."""
    save(draw_paper_figure(name, config, tables, claims), png)


# ---------------------------------------------------------------------------------------------------------
# Training dynamics: what a researcher checks first.

TRAINING_METRICS = {
    "task_reward": "task reward (batch mean, no KL term)",
    "kl_k3": "KL(π_θ‖π_ref), K3 (nats)",
    "grad_norm": "gradient norm (before clipping, log scale)",
}


# A gradient norm spans orders of magnitude across β (0.2 without a penalty, 6 at β = 10): on a shared linear axis the
# small ones are flat lines at 0.
LOG_METRICS = {"grad_norm"}


def draw_training_figure(study: str, config: dict, tables: dict):
    """A study's training reward, KL to the reference and gradient norm over optimiser steps: one row per metric
    (one y range per row), one column per β (each with the no-KL run); per configuration × β each run's trailing mean
    over the study's final_steps steps, then the mean over seeds ± 1 se."""
    spec = config["studies"][study]
    training = tables["training"]
    training = training[training.study == study]
    betas = [float(b) for b in spec["betas"]] if any(k != NO_KL for k in spec["kl"]) else [0.0]
    window = spec.get("final_steps", 5)
    grid = beta_grid(config)
    metrics = [m for m in TRAINING_METRICS if m in training] or list(TRAINING_METRICS)
    width = 4.3 * len(betas) + 2.6
    fig, axes = plt.subplots(len(metrics), len(betas), figsize=(width, 2.7 * len(metrics) + 1.4), squeeze=False,
                             sharex=True, layout="constrained")  # fmt: skip
    notes = []
    for col, beta in enumerate(betas):
        rows = training[(training.kl == NO_KL) | np.isclose(training.beta, beta)]
        for row, metric in enumerate(metrics):
            ax = axes[row, col]
            seeds = step_curves(ax, rows, metric, window, grid, dodge_width=0.3) if metric in rows else set()
            notes += [f"{TRAINING_METRICS[metric]}, β = {beta:g}: {note}." for note in coinciding(ax)]
            ax.grid(alpha=0.3)
            title = "" if row else f"β = {beta:g}" + (" (and no KL)" if NO_KL in spec["kl"] else "")
            ax.set_title("\n".join(filter(None, [title, _seeds_text(seeds)])), fontsize=9)
            if not seeds:
                say_why_empty(ax, f"no run of {study} at β = {beta:g} has logged {metric} yet")
            if col == 0:
                ax.set_ylabel(TRAINING_METRICS[metric], fontsize=8)
            if row == len(metrics) - 1:
                ax.set_xlabel("training step")
    for row in range(len(metrics)):
        if metrics[row] in LOG_METRICS:
            for ax in axes[row]:
                ax.set_yscale("log")
                ax.yaxis.set_major_locator(ticker.LogLocator(subs=(1, 2, 5)))  # plain numbers: 0.2, 0.5, 1, 2, 5
                ax.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
                ax.yaxis.set_minor_formatter(ticker.NullFormatter())
        _share_y(list(axes[row]), [Drawn(metrics[row], empty=None if ax.lines else "") for ax in axes[row]])
    fig.legend(handles=_key_handles(spec["kl"], betas if any(b > 0 for b in betas) else [], grid),
               loc="outside right center", fontsize=8, frameon=False)  # fmt: skip
    train = spec["train"]
    design = f"{train['batch_prompts']} prompts × {train['rollouts']} completions a batch, {train['steps']} steps"
    fig.suptitle(figure_title(f"Training dynamics: {study}", config, spec["models"]) + f"\n{design}", fontsize=11)
    footnote(
        fig,
        [f"Thick lines: each run's value at a step is the mean of its last {window} logged steps up to it (the window "
         "that defines the end of training), with that mean's error from their spread; thin lines, in panels of at "
         f"most {RAW_LINES_UP_TO} lines (more hide one another): each step as logged (mean over seeds); thick lines "
         "and bands: the "
         f"{UNCERTAINTY}. A run with one seed has no band over its first two steps (under three steps, no error). "
         "Lines are dodged sideways by up to 0.15 steps so that equal values do not hide each other. "
         "Rewards logged only on the first update of a batch (several updates per batch) are drawn where logged.",
         *notes],
        width,
    )  # fmt: skip
    return fig


def _key_handles(kls: list[str], betas: list[float], grid: list[float]) -> list:
    """A training figure's legend: one entry per configuration (its colour) and one per β (its line style), not one
    per configuration × β: the columns already say β, and a 19-entry legend is not read."""
    handles = [plt.Line2D([], [], **{**style_of(kl), "marker": None, "linestyle": "-"}, label=kl_label(kl))
               for kl in kls]  # fmt: skip
    handles += [plt.Line2D([], [], color="0.3", linestyle=beta_linestyle(b, grid), label=f"β = {b:g}") for b in betas]
    return handles


def training_figure(study: str, config: dict, tables: dict, png: Path) -> None:
    """draw_training_figure, written to ``png`` (and a PDF beside it)."""
    save(draw_training_figure(study, config, tables), png)


# ---------------------------------------------------------------------------------------------------------
# The claims figure: every claim of the claims table, effect ± critical·se, coloured by verdict.

CLAIM_METRIC_UNITS = {
    "final_kl": "KL(π_θ‖π_ref) at the end of training (nats)",
    "heldout": "held-out pass@1 at the last evaluation",
    "evaluation": "lm-eval mean@k, mean over the claim's tasks",
    "forward_kl": "forward KL(π_ref‖π_θ) at the last snapshot (nats)",
    "entropy": "token entropy of π_θ at the last snapshot (nats)",
}


def _claim_groups(claims: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The forest's panels: one per metric (trends over β apart: their unit is per decade of β), in table order."""
    trend = claims.get("note", pd.Series("", index=claims.index)).fillna("").astype(str).str.startswith("trend")
    keys = claims.metric.astype(str) + np.where(trend, " trend", "")
    return [(key, claims[keys == key]) for key in dict.fromkeys(keys)]


def _signed(row) -> tuple[float, float, float]:
    """(effect, half width, margin) with the sign turned so that the predicted direction is positive."""
    sign = -1.0 if row.get("predicted") == "lower" else 1.0
    half = row["critical"] * row["se"]
    return sign * row["effect"], half, row.get("margin", math.nan)


def draw_claims_forest(claims: pd.DataFrame, config: dict):
    """Every row of the claims table: its effect (candidate − baseline, signed so that the paper's or Table 1's
    prediction points right) ± critical·se, the interval the verdict rule reads, coloured by the verdict; one panel per
    metric. A claim of no difference ("same") shows its margin as a green band around zero: shown when the whole
    interval lies inside it. An interval wider than the panel ends in an arrow; the numbers are on the right."""
    claims = claims.copy()
    margins = {name: c.get("margin") for name, c in config.get("claims", {}).items()}
    claims["margin"] = [
        (margins.get(name) or math.nan) * abs(b) if pd.notna(b) else math.nan
        for name, b in zip(
            claims.claim, claims.get("baseline_mean", pd.Series(math.nan, index=claims.index)), strict=True
        )
    ]
    groups = _claim_groups(claims) if len(claims) else []
    heights = [len(rows) + 1.2 for _, rows in groups] or [1]
    fig, axes = plt.subplots(len(heights), 1, figsize=(12, 0.3 * sum(heights) + 1.6), squeeze=False,
                             height_ratios=heights, layout="constrained")  # fmt: skip
    clipped = pd.concat([_forest_panel(ax, key, rows) for ax, (key, rows) in zip(axes[:, 0], groups, strict=False)]
                        or [claims.iloc[:0]])  # no claims: one empty panel, said below  # fmt: skip
    if not groups:
        say_why_empty(axes[0, 0], "the config names no claims")
    handles = [plt.Line2D([], [], color=c, marker="o", linestyle="-", label=v) for v, c in VERDICT_COLOURS.items()]
    handles.append(plt.Line2D([], [], color=UNTESTED_COLOUR, marker="o", markerfacecolor="white", linestyle="",
                              label="no interval (not testable, no prediction)"))  # fmt: skip
    fig.legend(handles=handles, loc="outside right upper", fontsize=8, frameon=False, title="verdict")
    models = claims.model.dropna().unique() if "model" in claims else []
    fig.suptitle(figure_title("Every claim: effect ± critical·se, the interval the verdict rule reads", config, models),
                 fontsize=11)  # fmt: skip
    footnote(
        fig,
        ["Effect: candidate − baseline (mean over paired units: seeds, or questions), signed so that the predicted "
         "direction is to the right of 0. Thick bar: ± 1 se; thin line: effect ± critical·se, as the claims table's "
         "verdict rule reads it "
         "(figures/claims.csv; its caption gives the rule). Right: verdict, z against its critical value, and n, the "
         "paired units. The figures' footnotes and the claims table give the effect unsigned (candidate − baseline). A "
         "claim of no difference (green band: ± its margin) is shown when the effect lies inside the band by "
         "critical standard errors at both ends, each end tested seed by seed so that the margin's own noise (it is "
         "a fraction of the estimated baseline) is in its error; its z (\"margin z\") is the smaller of the two.",
         clipped_text(clipped)],
        12,
    )  # fmt: skip
    return fig


def claims_forest(claims: pd.DataFrame, config: dict, png: Path) -> None:
    """draw_claims_forest, written to ``png`` (and a PDF beside it)."""
    save(draw_claims_forest(claims, config), png)


def clipped_text(clipped: pd.DataFrame) -> str:
    """The footnote's line on intervals that run past their panel (arrows): how wide the rule's interval is at their
    n, so that an axis-wide line reads as what few seeds allow, not as a drawing error."""
    if clipped.empty:
        return ""
    by = "seeds" if "seeds" in clipped else "units"
    widths = "; ".join(f"{int(n)} seeds: ± {_number(c, 3)} se" for n, c in
                       clipped.groupby(by).critical.min().items())  # fmt: skip
    return (
        "An arrow: the interval runs past the panel (which spans every effect ± 3 se). The rule's interval "
        f"is effect ± critical·se, with critical the larger of min_z and Student's t at seeds − 1 degrees of freedom "
        f"({widths}): the fewer the units, the wider it is, and only an effect that many se from 0 can be shown."
    )


def _forest_panel(ax, key: str, rows: pd.DataFrame) -> pd.DataFrame:
    """One metric's claims (see draw_claims_forest); returns the rows whose interval runs past the panel."""
    metric, _, trend = key.partition(" ")
    clipped = []
    signed = [_signed(row) for row in rows.to_dict("records")]
    spans = [abs(x) + 3 * se for (x, _, _), se in zip(signed, rows.se.fillna(0), strict=True)]  # to 3 se
    spans += [m for _, _, m in signed]
    limit = 1.15 * max([s for s in spans if np.isfinite(s) and s > 0] or [1.0])
    for y, (row, (x, half, margin)) in enumerate(zip(rows.to_dict("records"), signed, strict=True)):
        colour = verdict_colour(row["verdict"])
        if pd.notna(margin):
            ax.fill_betweenx([y - 0.4, y + 0.4], -margin, margin, color="tab:green", alpha=0.15, linewidth=0)
        if pd.notna(half) and pd.notna(x):
            low, high = max(x - half, -limit), min(x + half, limit)
            ax.plot([low, high], [y, y], color=colour, linewidth=1.2)  # ± critical·se: what the rule reads
            ax.plot([x - row["se"], x + row["se"]], [y, y], color=colour, linewidth=3.5, alpha=0.35)  # ± 1 se
            for end, edge, marker in ((x - half, -limit, "<"), (x + half, limit, ">")):
                if abs(end) > limit and np.sign(end) == np.sign(edge):
                    ax.plot(edge, y, marker=marker, color=colour, markersize=6)
                    clipped.append(y)
            ax.plot(x, y, "o", color=colour)
        elif pd.notna(x):
            ax.plot(max(min(x, limit), -limit), y, "o", color=colour, markerfacecolor="white")
        z_name = "margin z" if row.get("predicted") == "same" else "z"
        score = "" if pd.isna(row["z"]) else f"   {z_name} {_number(row['z'])} / {_number(row['critical'], 3)}"
        text = f"{row['verdict']}{score}   {_units_text(row)}"
        ax.annotate(text, (1.01, y), xycoords=("axes fraction", "data"), va="center", fontsize=7, color=colour)
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_xlim(-limit, limit)
    ax.set_ylim(len(rows) - 0.4, -0.6)
    ax.set_yticks(range(len(rows)), [_claim_label(row) for row in rows.to_dict("records")], fontsize=7)
    unit = CLAIM_METRIC_UNITS.get(metric, metric)
    ax.set_title(f"{unit}{': slope per decade of β' if trend else ''}", fontsize=9, loc="left")
    ax.grid(alpha=0.3, axis="x")
    return rows.iloc[sorted(set(clipped))]


def _units_text(row) -> str:
    """'n 4', or 'n 100 questions × 4 seeds' for a claim paired by question (its degrees of freedom are the
    seeds')."""
    seeds = row.get("seeds")
    if pd.isna(seeds) or row.get("pair_by") != "questions":
        return f"n {row.get('units', '')}"
    return f"n {row.get('units', '')} questions × {int(seeds)} seeds"


def _claim_label(row) -> str:
    """'claim, β = 1 vs 0.1' (a claim between two β of one configuration), 'claim, β = 0.1', 'claim (over β)'."""
    if str(row.get("note", "")).startswith("trend"):
        return f"{row['claim']} (over β)"
    beta, below = pd.to_numeric(pd.Series([row.get("beta"), row.get("baseline_beta")]), errors="coerce")
    if pd.isna(beta) or beta == 0:
        return str(row["claim"])
    against = f" vs {below:g}" if pd.notna(below) and row.get("baseline") == row.get("candidate") else ""
    return f"{row['claim']}, β = {beta:g}{against}"
