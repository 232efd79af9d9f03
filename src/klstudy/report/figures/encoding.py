"""The study's figures, drawn from tidy result tables (never from typed-in numbers); its tables are tables.py's.

Every figure uses one encoding, defined here for every module that draws (``style_of``, ``beta_linestyle``):
colour = KL configuration (colour-blind safe, never a verdict's colour), marker shape = placement, marker fill =
estimator, line style (bars: hatching) = β by its value; and one uncertainty convention (aggregate.UNCERTAINTY): a
point, line or bar is the mean over n training seeds, its error bar or band ± one standard error that combines the
seeds' spread with each measurement's own error (no band from one seed), a description, not a test. An image holds
a one-line title and at most two footnote lines; everything else (n, the convention, each claim's verdict, z and
critical value from figures/claims.csv) is its caption, written as <name>.md beside the PNG. A figure never decides
whether a difference is a finding: the claims figure (claims_forest) draws every claim's effect ± critical·se, the
interval the verdict reads, in the metric's own sign.
"""

from __future__ import annotations

import math
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.colors as mcolors  # noqa: E402
import matplotlib.patches as mpatches  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib import ticker  # noqa: E402

from klstudy.aggregate import (  # noqa: E402
    UNCERTAINTY,
    exactly_zero,
    final_values,
    mean_and_se,
    step_values,
    trailing_mean,
)
from klstudy.kl import NO_KL, PATHWISE, KLSpec  # noqa: E402

# ---------------------------------------------------------------------------------------------------------
# The shared encoding.

# Colour = KL configuration, from the Okabe–Ito and Tol colour-blind-safe sets: one hue family per estimator (K1
# blues, K3 oranges, K2 purples), a lighter or darker shade per placement, so that the paper's central contrasts
# (K1 in the reward against K3 in the loss; K3 in the reward against K3 in the loss) differ in hue or in lightness.
# Green and red are not used here: they are the verdicts' (VERDICT_COLOURS).
CONFIG_COLOURS = {
    NO_KL: "black",
    "k1-reward": "#0072B2",
    "k1-loss": "#56B4E9",
    "k1-both": "#1D3F6E",
    "k3-reward": "#E69F00",
    "k3-loss": "#8C510A",
    "k3-both": "#F5D08A",
    "k2-reward": "#CC79A7",
    "k2-loss": "#7B2D64",
    "k2-both": "#E8B5D3",
}
BASE_COLOUR = "0.6"  # the base model (no RL)
# A framework's per-token loss gradient: its pathwise configuration's colour, darkened by this much (0: the same).
LOSS_GRADIENT_SHADES = {PATHWISE: 0.0, "ratio": 0.35, "score": 0.55, "st": -0.35, "isst": -0.55}
# Without colour: the marker's shape says the placement, its fill the estimator (K1 filled, K3 hollow, K2 half).
PLACEMENT_MARKERS = {"reward": "o", "loss": "s", "both": "^", "none": "D"}
ESTIMATOR_FILLS = {"k1": "full", "k3": "none", "k2": "bottom"}
# β by its value, the same β drawn the same way in every figure of every run (not by its rank in one run's grid).
BETA_STYLES = {
    0.005: ((0, (1, 1)), "oo"),
    0.01: ((0, (3, 1, 1, 1, 1, 1)), "++"),
    0.05: ((0, (6, 1.5, 1, 1.5)), "||"),  # not solid: solid is no KL's
    0.1: ("--", "//"),
    0.3: ("-.", "\\\\"),
    1.0: (":", ".."),
    3.0: ((0, (5, 2, 1, 2, 1, 2)), "xx"),
    10.0: ((0, (8, 3)), "--"),
}
VERDICT_COLOURS = {"shown": "#009E73", "contradicted": "#CC3311", "not shown": "0.45"}
UNTESTED_COLOUR = "0.75"  # "not testable: …", "no prediction": no interval to read


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


def _beta_style(beta: float | None) -> tuple:
    """(line style, hatch) of β: BETA_STYLES' nearest β on a log scale; β = 0 (no KL): solid, unhatched."""
    if not beta or float(beta) <= 0:
        return "-", ""
    nearest = min(BETA_STYLES, key=lambda b: abs(math.log(b) - math.log(float(beta))))
    return BETA_STYLES[nearest]


def beta_linestyle(beta: float | None):
    """The line style of β, the same in every figure."""
    return _beta_style(beta)[0]


def beta_hatch(beta: float | None) -> str:
    """A bar's hatching for β, the same in every figure."""
    return _beta_style(beta)[1]


def _placement_and_estimator(kl_config: str) -> tuple[str, str]:
    if kl_config in (NO_KL, "base"):
        return "none", "k1"
    spec = KLSpec.from_name(kl_config)
    return spec.placement, spec.estimator


def marker_of(kl_config: str) -> dict:
    """The marker of a configuration: shape = placement, fill = estimator (hollow markers keep a white face)."""
    placement, estimator = _placement_and_estimator(kl_config)
    fill = ESTIMATOR_FILLS.get(estimator, "full")
    return {"marker": PLACEMENT_MARKERS[placement], "fillstyle": fill, "markerfacecoloralt": "white",
            **({"markerfacecolor": "white", "fillstyle": "full"} if fill == "none" else {})}  # fmt: skip


def style_of(kl_config: str, beta: float | None = None) -> dict:
    """Keyword arguments for ax.plot: the configuration's colour and marker, β's line style."""
    return {"color": config_colour(kl_config), "linestyle": beta_linestyle(beta), **marker_of(kl_config)}


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


def save(fig, png: Path, caption: str | None = None) -> None:
    """Write the figure as PNG and as a PDF beside it and, given its caption, the caption as <name>.md beside them:
    what the image leaves out (n, the uncertainty convention, the verdicts with z and critical) is read there."""
    png = Path(png)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=150, bbox_inches="tight")
    fig.savefig(png.with_suffix(".pdf"), bbox_inches="tight")
    plt.close(fig)
    if caption is not None:
        png.with_suffix(".md").write_text(f"![{png.stem}]({png.name})\n\n{caption.strip()}\n")


def model_names(config: dict, models) -> str:
    """The models as a reader knows them: the hub id, the GGUF file, or '<alias> (built locally)'."""
    names = []
    for model in dict.fromkeys(models):
        spec = config["models"].get(model, {})
        names.append(spec.get("hub_id") or spec.get("gguf") or f"{model} (built locally)")
    return ", ".join(names)


def run_text(config: dict, models) -> str:
    """The caption's line on the run: its models and scale (not in the image: names a reader need not parse)."""
    return f"Models: {model_names(config, models)}; {config['scale']} scale."


FOOTNOTE_LINES = 2  # at most, inside an image: the rest is the caption's


def footnote(fig, text: str) -> None:
    """At most FOOTNOTE_LINES short lines under the panels; the figure grows by their height."""
    lines = text.strip().split("\n")
    if len(lines) > FOOTNOTE_LINES:
        raise ValueError(f"a footnote of {len(lines)} lines: the caption is the place for more than {FOOTNOTE_LINES}")
    fig.supxlabel(text.strip(), x=0.0, ha="left", fontsize=8, linespacing=1.3)
    fig.set_figheight(fig.get_figheight() + 0.16 * len(lines))


def caption(*paragraphs: str) -> str:
    """A figure's caption (figures/<name>.md): its paragraphs, empty ones left out."""
    return "\n\n".join(p.strip() for p in paragraphs if p and p.strip())


def figure_legend(fig, axes, wrap: int = 0) -> None:
    """One legend for the whole figure, right of the panels (outside the data); each label once (wrapped to ``wrap``
    characters, given one)."""
    seen = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if not label.startswith("_"):
                seen.setdefault(label, handle)
    if seen:
        labels = [textwrap.fill(label, wrap) if wrap else label for label in seen]
        fig.legend(list(seen.values()), labels, loc="outside right center", fontsize=8, frameon=False)


def _say_in_panel(ax, text: str) -> None:
    """A short note about what a panel's data is, in the panel's upper middle (its lines lie elsewhere)."""
    ax.text(0.5, 0.6, text, transform=ax.transAxes, ha="center", va="center", fontsize=8, color="0.25")


def task_name(task: str) -> str:
    """A task as a reader names it: 'mmlu_college_biology' → 'MMLU biology', 'math_test' → 'math test'."""
    return task.replace("mmlu_college_", "MMLU ").replace("countdown", "Countdown").replace("_", " ")


def study_name(config: dict, study: str) -> str:
    """A study as its description names it, without the paper's figure numbers or notes: 'on-policy grid'."""
    return re.sub(r"\s*\(Fig[^)]*\)|;.*$", "", config["studies"][study].get("description", study))


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


def _band(ax, stats: pd.DataFrame, x, colour, alpha: float = 0.18) -> None:
    """± 1 se around the mean over seeds, only where n ≥ 2: one seed's own error (over steps or questions) is not a
    spread over seeds, and a band would draw it as one."""
    mean, se = stats["mean"].to_numpy(dtype=float), stats.se.to_numpy(dtype=float)
    seeds = stats.n.to_numpy() >= 2
    ax.fill_between(x, mean - se, mean + se, where=seeds, color=colour, alpha=alpha, linewidth=0)


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
    """A panel's title line from the claims table's verdicts on it, 'claims: 0 of 4 shown', so that a difference the
    eye sees between bars or points is read beside what the rule says of it (each claim's z: the caption)."""
    if rows.empty:
        return ""
    judged = rows[rows.verdict.isin(VERDICT_COLOURS)]  # shown, not shown, contradicted: the rows with a test
    if judged.empty:
        return f"claims: none of {len(rows)} testable here"
    contradicted = (judged.verdict == "contradicted").sum()
    counts = f"{(judged.verdict == 'shown').sum()} of {len(judged)} shown"
    return f"claims: {counts}" + (f", {contradicted} contradicted" if contradicted else "")


# ---------------------------------------------------------------------------------------------------------
# Figure 1 (§3.3).


def fig01_toy_bias_variance(results: pd.DataFrame, tests: pd.DataFrame, png: Path) -> None:
    """draw_fig01, written to ``png`` (a PDF and the caption, <name>.md, beside it)."""
    fig, text = draw_fig01(results, tests)
    save(fig, png, text)


def draw_fig01(results: pd.DataFrame, tests: pd.DataFrame):
    """Figure 1: squared bias and variance of each configuration's gradient estimate against T; (figure, caption).

    One row per setting; columns ∂/∂a and ∂/∂b for the squared bias, then for the variance; log scales, one y range
    per quantity. The squared bias is the exact one (toy.py's enumeration, T ≤ toy.EXACT_MAX_LENGTH), over the Monte
    Carlo noise floor (the squared standard error of a bias estimate: what Table 1's test cannot tell from zero),
    drawn as a grey area; configurations whose exact bias is zero (Table 1) have no place on a log axis and are named
    in the legend. The variance is the Monte Carlo one, ± 1 se. Configurations that coincide are drawn once and named
    together. The frameworks' per-token loss corrections are Table 1's, not this figure's (the paper's)."""
    results = results[(results.placement != "none") & (results.get("loss_gradient", PATHWISE) == PATHWISE)]
    unbiased = set(tests.config[tests.get("exact_unbiased", pd.Series(False, index=tests.index)) == True])  # noqa: E712
    settings = list(dict.fromkeys(results.setting))
    panels = [("squared_bias", "a"), ("squared_bias", "b"), ("variance", "a"), ("variance", "b")]
    fig, axes = plt.subplots(len(settings), 4, figsize=(14, 2.9 * len(settings)), squeeze=False, layout="constrained")
    for row, setting in enumerate(settings):
        for col, (metric, param) in enumerate(panels):
            rows = results[(results.setting == setting) & (results.param == param)]
            drawn = _exact_bias_panel if metric == "squared_bias" else _variance_panel
            drawn(axes[row, col], rows[~rows.config.isin(unbiased)] if metric == "squared_bias" else rows)
            what = "squared bias (exact)" if metric == "squared_bias" else "variance (Monte Carlo)"
            axes[row, col].set_title(f"{setting}: {what} of ∂/∂{param}", fontsize=9)
            axes[row, col].set_ylabel(what.split(" (")[0] if col in (0, 2) else "")
    for first in (0, 2):  # one y range per quantity: squared bias panels together, variance panels together
        _share_log_limits([ax for r in axes for ax in r[first : first + 2]])
    if unbiased:  # last in the legend: a note on the lines above it
        names = " = ".join(kl_label(c) for c in results.config.unique() if c in unbiased)
        axes[-1, -1].plot([], [], linestyle="", marker="", label=f"squared bias exactly 0 (not drawn): {names}")
    figure_legend(fig, axes.ravel(), wrap=34)
    fig.suptitle("Bias and variance of KL-gradient estimates in the toy model (§3.3)", fontsize=11)
    footnote(fig, "Squared bias: exact, by enumeration; grey: the Monte Carlo noise floor (below it a sampled bias "
             "reads as 0).\nVariance: Monte Carlo, ± 1 se (a description, not a test).")  # fmt: skip
    sequences = int(results.sequences.max()) if "sequences" in results else "the config's"
    return fig, caption(FIG01_CAPTION.format(trials=int(results.trials.max()), sequences=sequences))


FIG01_CAPTION = """\
**Bias and variance of KL-gradient estimates in the parametric autoregressive model (the paper's Figure 1, §3.3).** \
Squared bias (left two columns) and variance (right two) of the estimate of ∇ KL(A‖B) with respect to the policy \
parameters a and b, against the sequence length T, one row per (a, b, a_ref, b_ref) setting. The squared bias is \
exact: the estimator's expectation by enumerating every sequence (T ≤ 16; T = 32 has 2³² sequences and no exact \
value) minus the exact gradient. The grey area is the Monte Carlo noise floor, the squared standard error of a bias \
estimated from {trials} trials of {sequences} sequences: a sampled bias below it cannot be told from zero, which is \
why Table 1 also gives the exact verdict. Configurations whose exact bias is zero (Table 1's exact_unbiased) are \
named in the legend and not drawn (0 has no place on a log axis); so are exact zeros of a biased configuration (∂/∂b \
at T = 1, where b does not enter). The variance is the Monte Carlo one, ± 1 standard error, variance·(1 ± √(2/(trials \
− 1))): a description of the estimates' spread, not a test. Colour = configuration, marker shape = placement, marker \
fill = estimator (K1 filled, K3 hollow, K2 half); configurations with equal values at every T are drawn once and \
named together. The frameworks' per-token loss corrections are in Table 1."""


def _coinciding_lines(lines: dict[str, pd.Series], rtol: float = 1e-6) -> list[tuple[list[str], pd.Series]]:
    """Series (index: x) equal at every x, grouped: [(configurations, series)], each group drawn once."""
    groups: list[tuple[list[str], pd.Series]] = []
    for config, series in lines.items():
        for names, first in groups:
            if first.index.equals(series.index) and np.allclose(first, series, rtol=rtol, atol=0):
                names.append(config)
                break
        else:
            groups.append(([config], series))
    return groups


def _draw_lines(ax, lines: dict[str, pd.Series]) -> None:
    """One line per group of coinciding configurations, in its first configuration's style, named together."""
    for names, series in _coinciding_lines(lines):
        ax.plot(series.index, series.to_numpy(), markersize=5, label=" = ".join(kl_label(n) for n in names),
                **{**style_of(names[0]), "linestyle": "-"})  # fmt: skip


def _exact_bias_panel(ax, rows: pd.DataFrame) -> None:
    """Exact squared bias per configuration (exact zeros left out), over the Monte Carlo noise floor."""
    rows = rows.dropna(subset=["exact_bias"]).sort_values("T")
    floor = (rows.groupby("T").std_error.max() ** 2).loc[lambda f: f > 0]
    if len(floor):
        ax.fill_between(floor.index, floor.to_numpy() * 1e-6, floor.to_numpy(), color="0.88", linewidth=0)
        ax.plot(floor.index, floor.to_numpy(), color="0.6", linewidth=1, linestyle="-",
                label="Monte Carlo noise floor (se² of a sampled bias)")  # fmt: skip
    lines = {}
    for config, line in rows.groupby("config", sort=False):
        kept = [not exactly_zero(abs(b), abs(g)) for b, g in zip(line.exact_bias, line.true_grad, strict=True)]
        line = line[kept]
        if len(line):
            lines[config] = pd.Series((line.exact_bias**2).to_numpy(), index=line["T"].to_numpy())
    _draw_lines(ax, lines)
    _log_t_axis(ax)


def _variance_panel(ax, rows: pd.DataFrame) -> None:
    """Monte Carlo variance per configuration (no spread: left out), ± 1 se band."""
    lines, bands = {}, {}
    for config, line in rows.sort_values("T").groupby("config", sort=False):
        line = line[line.variance > 0]
        if len(line):
            lines[config] = pd.Series(line.variance.to_numpy(), index=line["T"].to_numpy())
            bands[config] = np.sqrt(2 / (line.trials.to_numpy() - 1))
    for names, series in _coinciding_lines(lines):
        relative = bands[names[0]]
        ax.fill_between(series.index, series * (1 - relative), series * (1 + relative), color=config_colour(names[0]),
                        alpha=0.15, linewidth=0)  # fmt: skip
    _draw_lines(ax, lines)
    _log_t_axis(ax)


def _log_t_axis(ax) -> None:
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length T")
    ax.grid(alpha=0.3, which="major")


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
        x = stats.step + _dodge(i, len(lines), 0.3 * every)
        ax.plot(x, stats["mean"], markersize=4, label=label, **style)
        _band(ax, stats, x, style["color"])
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
        _say_in_panel(ax, "every run scores 0 at every evaluation")
    train = config["studies"][panel["study"]]["train"]
    if _too_short_for_lag(train):
        drawn.notes.append(_async_text(train))
    return drawn


# Multiple-choice tasks (MMLU and its procedural stand-ins, data.py): four letters A–D, so chance is 1/4.
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
        x = [t + _dodge(g, len(groups), 0.8) for t in range(len(tasks))]
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
        x = stats.step + _dodge(i, len(lines), 0.3 * gap)
        ax.plot(x, stats["mean"], markersize=4, label=kl_label(kl_config, beta), **style)
        _band(ax, stats, x, style["color"])
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
        shift = _dodge(i, len(configs), 0.12 if len(betas) > 1 else 0.5)  # decades on a log axis, else categories
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
        offset = _dodge(i, len(lines), dodge_width)
        x = stats.step + offset
        ax.plot(x, stats["mean"], label=kl_label(kl_config, None if kl_config == NO_KL else beta), **style)
        _band(ax, stats, x, style["color"], alpha=0.08 if crowded else 0.18)
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
    the panel's n and a count of its claims' verdicts; returns the caption's lines about claims and panels."""
    about = [panel_claims(claims, panel, config) for panel in panels]  # empty without a claims table
    drawn = [PANELS[panel["kind"]](ax, panel, config, {**tables, "claims": rows if claims is not None else None})
             for ax, panel, rows in zip(axes, panels, about, strict=True)]  # fmt: skip
    _share_y(axes, drawn)
    lines, listed, notes = [], set(), []
    for ax, panel, d, rows in zip(axes, panels, drawn, about, strict=True):
        title = panel.get("title", study_name(config, panel["study"]))
        if ax.get_title():
            title = f"{title}: {ax.get_title()}"
        verdicts = "" if claims is None or d.empty else verdicts_text(rows)
        ax.set_title("\n".join(filter(None, [title, d.n_text or _seeds_text(d.seeds, d.unit), verdicts])), fontsize=9)
        if d.empty:
            say_why_empty(ax, d.empty)
        else:
            new = [f"- {title}: {note}." for note in [*d.notes, *coinciding(ax)]]
            notes += [note for note in dict.fromkeys(new) if note not in notes]
        for row in rows.to_dict("records"):
            line = claim_line(row)
            if line not in listed:
                listed.add(line)
                lines.append(line)
    if claims is not None:
        lines = (
            ["The claims table's verdicts on what these panels show (figures/claims.csv; a difference is a finding "
             "only where it says shown):", "", *[f"- {line}" for line in lines]]
            if lines else ["No claim of the claims table tests what these panels show."]
        )  # fmt: skip
    return notes + lines


SERIES_SE = (
    "Lines, points and bars are the mean over n training seeds (n in each panel's title) with ± 1 standard error: a "
    "description of the runs' spread, not a test. The claims rule reads effect ± critical·se, with critical the larger "
    "of min_z and Student's t at seeds − 1 degrees of freedom{widths}: a gap between two ± 1 se bands is no finding "
    "unless the claims table says shown (the claims figure draws that interval). A series of one seed has no band: "
    "its own error over steps or questions is not a spread over seeds."
)


def series_se_text(claims: pd.DataFrame | None) -> str:
    """SERIES_SE with the critical values the claims table used at each number of seeds (none without a table)."""
    if claims is None or "seeds" not in claims or claims.critical.isna().all():
        return SERIES_SE.format(widths="")
    used = claims.dropna(subset=["critical", "seeds"]).groupby("seeds").critical.min()
    return SERIES_SE.format(widths=" (" + ", ".join(f"{c:.3g} at {int(n)} seeds" for n, c in used.items()) + ")")
IN_IMAGE_SE = (
    "Mean over n seeds (panel titles) ± 1 se; a bar's se includes lm-eval's error over questions (one seed: that "
    "alone).\n"
    "A description, not a test: which differences are findings, the claims figure and this figure's caption say."
)


def draw_paper_figure(name: str, config: dict, tables: dict, claims: pd.DataFrame | None = None):
    """A figure of the config's ``figures`` section: its panels, at most three across, one legend beside them, a
    two-line footnote; returns (figure, caption): the caption holds the run, the uncertainty convention, the panels'
    notes and (given the claims table) the verdicts of the claims about its panels."""
    spec = config["figures"][name]
    panels = spec["panels"]
    rows, columns = _grid_shape(len(panels))
    width = 4.6 * columns + 2.6
    fig, axes = plt.subplots(rows, columns, figsize=(width, 3.6 * rows + 1.0), squeeze=False, layout="constrained")
    axes = axes.ravel()
    for ax in axes[len(panels) :]:
        ax.remove()
    axes = list(axes[: len(panels)])
    lines = draw_panels(fig, axes, panels, config, tables, claims)
    figure_legend(fig, axes, wrap=30)
    fig.suptitle(spec["title"], fontsize=11)
    footnote(fig, IN_IMAGE_SE)
    dodged = DODGED if any(panel["kind"] != "bars" for panel in panels) else ""
    convention = f"{series_se_text(claims)} {UNCERTAINTY[0].upper()}{UNCERTAINTY[1:]}. {dodged}"
    text = caption(f"**{spec['title']}** ({name}). {run_text(config, [p['model'] for p in panels])}", convention,
                   "\n".join(lines))  # fmt: skip
    return fig, text


def paper_figure(name: str, config: dict, tables: dict, png: Path, claims: pd.DataFrame | None = None) -> None:
    """draw_paper_figure, written to ``png`` (a PDF and the caption, <name>.md, beside it)."""
    fig, text = draw_paper_figure(name, config, tables, claims)
    save(fig, png, text)


# ---------------------------------------------------------------------------------------------------------
# Training dynamics: what a researcher checks first.

# Axis labels: what is logged, on which samples (the sampling policy's: with several updates per batch or an
# asynchronous lag it is not π_θ), and the smoothing drawn ({window}: the study's final_steps).
TRAINING_METRICS = {
    "task_reward": "task reward, batch mean\n(trailing {window}-step mean)",
    "kl_k3": "KL(π_sampling‖π_ref), K3, nats\n(trailing {window}-step mean)",
    "grad_norm": "gradient norm before clipping\n(trailing {window}-step mean, log)",
}


# A gradient norm spans orders of magnitude across β (0.2 without a penalty, 6 at β = 10): on a shared linear axis the
# small ones are flat lines at 0.
LOG_METRICS = {"grad_norm"}


def draw_training_figure(study: str, config: dict, tables: dict):
    """A study's training reward, KL to the reference and gradient norm over optimiser steps: one row per metric
    (one y range per row), one column per β (each with the no-KL run); per configuration × β each run's trailing mean
    over the study's final_steps steps, then the mean over seeds ± 1 se. Returns (figure, caption)."""
    spec = config["studies"][study]
    training = tables["training"]
    training = training[training.study == study]
    betas = [float(b) for b in spec["betas"]] if any(k != NO_KL for k in spec["kl"]) else [0.0]
    window = spec.get("final_steps", 5)
    metrics = [m for m in TRAINING_METRICS if m in training] or list(TRAINING_METRICS)
    width = 4.3 * len(betas) + 2.6
    fig, axes = plt.subplots(len(metrics), len(betas), figsize=(width, 2.7 * len(metrics) + 1.4), squeeze=False,
                             sharex=True, layout="constrained")  # fmt: skip
    notes = []
    for col, beta in enumerate(betas):
        rows = training[(training.kl == NO_KL) | np.isclose(training.beta, beta)]
        for row, metric in enumerate(metrics):
            ax = axes[row, col]
            seeds = step_curves(ax, rows, metric, window, dodge_width=0.3) if metric in rows else set()
            name = TRAINING_METRICS[metric].split("\n")[0].split(",")[0]
            notes += [f"{name}, β = {beta:g}: {note}." for note in coinciding(ax)]
            ax.grid(alpha=0.3)
            title = "" if row else f"β = {beta:g}" + (" (and no KL)" if NO_KL in spec["kl"] else "")
            ax.set_title("\n".join(filter(None, [title, _seeds_text(seeds)])), fontsize=9)
            if not seeds:
                say_why_empty(ax, f"no run of {study} at β = {beta:g} has logged {metric} yet")
            if col == 0:
                ax.set_ylabel(TRAINING_METRICS[metric].format(window=window), fontsize=8)
            if row == len(metrics) - 1:
                ax.set_xlabel("training step")
    if _too_short_for_lag(spec["train"]):
        for ax, metric in zip(axes[:, 0], metrics, strict=True):
            if metric in LAGGED_METRICS and ax.lines:
                _say_in_panel(ax, LAGGED_METRICS[metric].format(**spec["train"]))
    for row in range(len(metrics)):
        if metrics[row] in LOG_METRICS:
            for ax in axes[row]:
                ax.set_yscale("log")
                ax.yaxis.set_major_locator(ticker.LogLocator(subs=(1, 2, 5)))  # plain numbers: 0.2, 0.5, 1, 2, 5
                ax.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
                ax.yaxis.set_minor_formatter(ticker.NullFormatter())
        _share_y(list(axes[row]), [Drawn(metrics[row], empty=None if ax.lines else "") for ax in axes[row]])
    fig.legend(handles=_key_handles(spec["kl"], betas if any(b > 0 for b in betas) else []),
               loc="outside right center", fontsize=8, frameon=False)  # fmt: skip
    fig.suptitle(f"Training dynamics: {study_name(config, study)}", fontsize=11)
    footnote(fig, f"Thick: each run's trailing {window}-step mean, then the mean over n seeds ± 1 se (a "
             f"description, not a test); thin (panels of at most {RAW_LINES_UP_TO} lines): each step as logged."
             "\nKL: the "
             "K3 estimate on the sampling policy's own batch.")  # fmt: skip
    text = TRAINING_CAPTION.format(study=study, description=spec.get("description", study), window=window,
                                   raw=RAW_LINES_UP_TO, run=run_text(config, spec["models"]), uncertainty=UNCERTAINTY,
                                   design=_design_text(spec["train"]))  # fmt: skip
    return fig, caption(text, _async_text(spec["train"]), "\n".join(f"- {n}" for n in notes))


TRAINING_CAPTION = """\
**Training dynamics of the study {study}** ({description}). {run} {design}

Rows: the task reward (the batch mean, no KL term), the K3 estimate of KL(π_sampling‖π_ref) per sequence on the batch \
the sampling policy drew (with several updates per batch or an asynchronous lag the sampling policy trails π_θ) and \
the gradient norm before clipping (a log axis: it spans orders of magnitude across β); columns: β, each with the \
no-KL run. Thick lines: each run's value at a step is the mean of its last {window} logged steps up to it (the window \
that defines the end of training, so the KL's last point is the run's final KL), then the {uncertainty}; a band is \
drawn only where n ≥ 2 seeds (one seed's error over steps is not a spread over seeds), and it is a description, not a \
test (the claims table judges differences). Thin lines, in a panel of at most {raw} lines: each step as logged, the \
mean over seeds. Lines are dodged sideways by up to 0.15 steps so that equal values do not hide each other. With \
several updates per generation batch, the reward is logged on the batch's first update only."""


def _design_text(train: dict) -> str:
    return f"{train['batch_prompts']} prompts × {train['rollouts']} completions a batch, {train['steps']} steps."


# What a metric of the sampled batch is in a run no longer than its asynchronous lag (every batch from the initial
# policy), said in the panel.
LAGGED_METRICS = {
    "task_reward": "every batch was sampled by the initial policy\n(async level {async_level}, {steps} steps): "
                   "the reference's reward",
    "kl_k3": "every batch was sampled by the initial policy\n(async level {async_level}, {steps} steps): "
             "0 by construction",
}  # fmt: skip


def _too_short_for_lag(train: dict) -> bool:
    """Whether every batch of the run was sampled by the initial policy (steps ≤ async_level + 1)."""
    return bool(train.get("async_level", 0)) and train["steps"] <= train["async_level"] + 1


def _async_text(train: dict) -> str:
    """Why an asynchronous run of at most async_level + 1 steps shows nothing: every batch it trained on was sampled
    by the initial policy (trainer.py: the batch trained at step t was generated at step max(0, t − k))."""
    level, steps = train.get("async_level", 0), train["steps"]
    if not level:
        return ""
    text = (f"Asynchronous RL at level {level}: the batch trained at step t was sampled at step max(0, t − {level}), "
            f"so the first {level + 1} steps train on batches of the initial policy, the reference: "
            "KL(π_sampling‖π_ref) is 0 there.")  # fmt: skip
    if _too_short_for_lag(train):
        text += (f" This study has {steps} steps: its KL row is 0 at every step, and its reward is the reference's, "
                 "by construction, not a finding.")  # fmt: skip
    return text


def _key_handles(kls: list[str], betas: list[float]) -> list:
    """A training figure's legend: one entry per configuration (its colour) and one per β (its line style), not one
    per configuration × β: the columns already say β, and a 19-entry legend is not read."""
    handles = [plt.Line2D([], [], **{**style_of(kl), "linestyle": "-"}, label=kl_label(kl)) for kl in kls]
    handles += [plt.Line2D([], [], color="0.3", linestyle=beta_linestyle(b), label=f"β = {b:g}") for b in betas]
    return handles


def training_figure(study: str, config: dict, tables: dict, png: Path) -> None:
    """draw_training_figure, written to ``png`` (and a PDF beside it)."""
    fig, text = draw_training_figure(study, config, tables)
    save(fig, png, text)


# ---------------------------------------------------------------------------------------------------------
# The claims figure: every claim of the claims table, effect ± critical·se, coloured by verdict.

CLAIM_METRIC_UNITS = {
    "final_kl": "KL(π_sampling‖π_ref) at the end of training (nats)",
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


# The values a metric can take, for the range its differences can reach (candidate − baseline, the baseline's mean b
# known): a proportion lies in [0, 1], so a difference in [−b, 1 − b]; a KL or an entropy is ≥ 0, so ≥ −b.
PROPORTION_METRICS = {"heldout", "evaluation"}
NON_NEGATIVE_METRICS = {"final_kl", "forward_kl", "entropy"}
PREDICTED_MARKERS = {"higher": "▶", "lower": "◀"}  # after a claim's name on the axis: the direction predicted
MARGIN_COLOUR = "0.82"  # a same claim's margin: neither a verdict's colour nor a configuration's


def difference_range(metric: str, baseline_mean: float, trend: bool) -> tuple[float, float]:
    """The range of candidate − baseline that the metric allows (a trend's slope: unbounded)."""
    b = 0.0 if pd.isna(baseline_mean) else float(baseline_mean)
    if trend:
        return -math.inf, math.inf
    if metric in PROPORTION_METRICS:
        return -b if pd.notna(baseline_mean) else -1.0, 1.0 - b if pd.notna(baseline_mean) else 1.0
    if metric in NON_NEGATIVE_METRICS and pd.notna(baseline_mean):
        return -b, math.inf
    return -math.inf, math.inf


def draw_claims_forest(claims: pd.DataFrame, config: dict):
    """Every row of the claims table: its effect (candidate − baseline, in the metric's own sign and units) ±
    critical·se, the interval the verdict rule reads, clipped to what the metric allows (the clip marked), coloured by
    the verdict; one panel per metric; the predicted direction as a triangle after the claim's name. A claim of
    no difference ("same") shows its margin as a band around zero. Returns (figure, caption)."""
    claims = claims.copy()
    margins = {name: c.get("margin") for name, c in config.get("claims", {}).items()}
    baseline = claims.get("baseline_mean", pd.Series(math.nan, index=claims.index))
    claims["margin"] = [(margins.get(name) or math.nan) * abs(b) if pd.notna(b) else math.nan
                        for name, b in zip(claims.claim, baseline, strict=True)]  # fmt: skip
    groups = _claim_groups(claims) if len(claims) else []
    heights = [len(rows) + 1.4 for _, rows in groups] or [1]
    fig, axes = plt.subplots(len(heights), 1, figsize=(12, 0.3 * sum(heights) + 1.4), squeeze=False,
                             height_ratios=heights, layout="constrained")  # fmt: skip
    past = pd.concat([_forest_panel(ax, key, rows) for ax, (key, rows) in zip(axes[:, 0], groups, strict=False)]
                     or [claims.iloc[:0]])  # no claims: one empty panel, said below  # fmt: skip
    if not groups:
        say_why_empty(axes[0, 0], "the config names no claims")
    fig.legend(handles=_forest_handles(claims.get("verdict", [])), loc="outside right upper", fontsize=8,
               frameon=False)  # fmt: skip
    fig.suptitle("Every claim: effect ± critical·se, the interval its verdict reads", fontsize=11)
    footnote(fig, "Effect: candidate − baseline in the metric's units; ▶/◀ after a claim's name: the direction "
             "predicted.\n"
             "|: clipped at the metric's possible range; arrow: the interval runs past the panel.")  # fmt: skip
    models = claims.model.dropna().unique() if "model" in claims else []
    return fig, caption(FOREST_CAPTION, run_text(config, models) if len(models) else "", clipped_text(past))


FOREST_CAPTION = """\
**Every claim, at a glance.** One row per row of the claims table (figures/claims.csv): the effect, candidate − \
baseline (the mean over paired units: training seeds, or held-out questions), in the metric's own sign and units, \
with the interval effect ± critical·se that the verdict rule reads, coloured by the verdict (green shown, red \
contradicted, grey not shown; a hollow grey point: no interval, such as a claim that cannot be tested). A triangle \
after the claim's name points the way the paper or Table 1 predicts (▶ higher, ◀ lower); a claim of no difference has \
none and shows its margin as a grey band around 0: shown when the effect lies inside it by critical standard errors \
at both ends, each end tested seed by seed so that the margin's own noise (a fraction of the estimated baseline) is \
in its error; its z ("margin z") is the smaller of the two. An interval is clipped at the range the metric allows (a \
pass@1 or accuracy difference lies in [−b, 1 − b] for a baseline b; a KL or entropy difference is at least −b), \
marked |; one wider than its panel (which spans every effect ± 3 se) ends in an arrow. Right: verdict, z against its \
critical value, and n, the paired units. One panel per metric; a claim that a configuration's KL falls as β grows, \
tested as a slope over the β grid, has its own panel (per decade of β)."""


def _forest_handles(verdicts) -> list:
    """The legend: the verdicts that occur (a key to a colour no row has would be read as a finding), then the marks."""
    present = set(verdicts)
    handles = [plt.Line2D([], [], color=c, marker="o", linestyle="-", label=v)
               for v, c in VERDICT_COLOURS.items() if v in present]  # fmt: skip
    handles.append(plt.Line2D([], [], color=UNTESTED_COLOUR, marker="o", markerfacecolor="white", linestyle="",
                              label="no interval (not testable,\nno prediction)"))  # fmt: skip
    handles.append(plt.Line2D([], [], color="0.3", marker="|", markersize=10, linestyle="",
                              label="clipped at the metric's range"))  # fmt: skip
    handles.append(mpatches.Patch(color=MARGIN_COLOUR, label="margin of a 'same' claim"))
    return handles


def claims_forest(claims: pd.DataFrame, config: dict, png: Path) -> None:
    """draw_claims_forest, written to ``png`` (a PDF and the caption, claims_forest.md, beside it)."""
    fig, text = draw_claims_forest(claims, config)
    save(fig, png, text)


def clipped_text(clipped: pd.DataFrame) -> str:
    """The caption's line on intervals that run past their panel (arrows): how wide the rule's interval is at their
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


def _forest_view(rows: pd.DataFrame) -> float:
    """Half the width of a panel: every effect ± 3 se and every margin, with some room."""
    spans = [*(rows.effect.abs() + 3 * rows.se.fillna(0)), *rows.margin]
    return 1.15 * max([s for s in spans if np.isfinite(s) and s > 0] or [1.0])


def _forest_panel(ax, key: str, rows: pd.DataFrame) -> pd.DataFrame:
    """One metric's claims (see draw_claims_forest); returns the rows whose interval runs past the panel."""
    metric, _, trend = key.partition(" ")
    limit = _forest_view(rows)
    past = []
    for y, row in enumerate(rows.to_dict("records")):
        colour = verdict_colour(row["verdict"])
        x, half = row["effect"], row["critical"] * row["se"]
        if pd.notna(row["margin"]):
            ax.fill_betweenx([y - 0.4, y + 0.4], -row["margin"], row["margin"], color=MARGIN_COLOUR, linewidth=0)
        if pd.notna(half) and pd.notna(x):
            if _draw_interval(ax, y, x, half, difference_range(metric, row.get("baseline_mean"), bool(trend)),
                              limit, colour):  # fmt: skip
                past.append(y)
            ax.plot(x, y, "o", color=colour)
        elif pd.notna(x):
            ax.plot(max(min(x, limit), -limit), y, "o", color=colour, markerfacecolor="white")
        z_name = "margin z" if row.get("predicted") == "same" else "z"
        score = "" if pd.isna(row["z"]) else f"   {z_name} {_number(row['z'])} / {_number(row['critical'], 3)}"
        ax.annotate(f"{row['verdict']}{score}   {_units_text(row)}", (1.02, y), xycoords=("axes fraction", "data"),
                    va="center", fontsize=7, color=colour if colour != UNTESTED_COLOUR else "0.4")  # fmt: skip
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_xlim(-limit, limit)
    ax.set_ylim(len(rows) - 0.4, -0.6)
    labels = [f"{_claim_label(row)}  {PREDICTED_MARKERS.get(row.get('predicted'), '')}".rstrip() for row in
              rows.to_dict("records")]  # fmt: skip
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    unit = CLAIM_METRIC_UNITS.get(metric, metric)
    ax.set_title(f"{unit}{': slope per decade of β' if trend else ''}, candidate − baseline", fontsize=9, loc="left")
    ax.grid(alpha=0.3, axis="x")
    return rows.iloc[sorted(set(past))]


def _draw_interval(ax, y: float, x: float, half: float, allowed: tuple[float, float], limit: float, colour) -> bool:
    """effect ± half clipped to the metric's range (a | where clipped) and to the panel (an arrow where it runs past);
    returns whether it ran past the panel."""
    low, high = max(x - half, allowed[0]), min(x + half, allowed[1])
    ax.plot([max(low, -limit), min(high, limit)], [y, y], color=colour, linewidth=1.4)
    past = False
    ends = ((low, x - half < allowed[0], -limit, "<"), (high, x + half > allowed[1], limit, ">"))
    for end, clip, edge, arrow in ends:
        if abs(end) > limit and np.sign(end) == np.sign(edge):
            ax.plot(edge, y, marker=arrow, color=colour, markersize=6)
            past = True
        elif clip:
            ax.plot(end, y, marker="|", color="0.15", markersize=10, markeredgewidth=1.6)
    return past


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


# ---------------------------------------------------------------------------------------------------------
# Where each KL configuration's training ends in the toy model (fixed_points.py's tables).

EXACT_MARKERS = {"drifts": ">", "still moving": "d"}  # a stable fixed point has its configuration's marker
GAP_FLOOR = 1e-12  # J_β(optimum) − J_β(end) below this: on the optimum to rounding error


def toy_fixed_points_figure(points, fronts, agreed, section: dict, png: Path) -> str:
    """draw_toy_fixed_points, written to ``png`` (a PDF beside it); returns the caption (the table's Markdown, which
    has this figure's name, carries it)."""
    fig, text = draw_toy_fixed_points(points, fronts, agreed, section)
    save(fig, png)
    return text


def draw_toy_fixed_points(points: pd.DataFrame, fronts: pd.DataFrame, agreed: pd.DataFrame, section: dict):
    """One row per family. Left and centre: the reward–KL plane with the exact frontier (the family's optimum over
    β, through the end points that are on it), each configuration's exact end points over β (its marker, joined
    over β, labelled with β; ▶: no fixed point, drawn where the flow stopped; ◆: still moving) and the on-policy
    Monte Carlo end points (hollow circles, ± the seeds' sd, labelled with β); the paper's configurations left, the
    frameworks' per-token corrections centre. Configurations whose end points coincide at every β are drawn once and
    named together. Right: the gap J_β(optimum) − J_β(end) against β. One legend, outside. Returns (figure, caption)."""
    families = list(dict.fromkeys(points.family))
    fig, axes = plt.subplots(len(families), 3, figsize=(19, 5.2 * len(families)), squeeze=False, layout="constrained",
                             gridspec_kw={"width_ratios": [1, 1, 0.8]})  # fmt: skip
    listed = []
    for row, family in enumerate(families):
        mine = points[points.family == family]
        groups = coinciding_groups(mine, "config", ["beta", "reward", "kl"])
        for col in (0, 1):  # a group with any of the paper's configurations left, with any framework's variant centre
            ax = axes[row, col]
            _draw_toy_frontier(ax, fronts, mine, family)
            mine_here = [(names, group) for names, group in groups if _has_variant(names, bool(col))]
            labels = [label for names, group in mine_here for label in _draw_end_points(ax, names, group)]
            drawn = [name for names, _ in mine_here for name in names]
            mc = agreed[(agreed.family == family) & (agreed["mode"] == "on-policy") & agreed.config.isin(drawn)]
            _label_betas(ax, labels + _draw_monte_carlo(ax, mc))
            kind = "frameworks' per-token KL-loss corrections" if col else "the paper's configurations, K2, no KL"
            ax.set_title(f"{family} policy: {kind}", fontsize=10)
            ax.set_xlabel("KL(π ‖ π_ref) at the end point")
            ax.set_ylabel("task reward E_π[R]")
            ax.set_xlim(-0.1, max(3.7, float(mine.kl.max()) + 0.3))
            ax.set_ylim(-0.05, 1.1)
            ax.grid(alpha=0.3)
        listed += _draw_toy_gaps(axes[row, 2], groups, family)
    _toy_status_keys(axes[0, 0])
    figure_legend(fig, axes.ravel(), wrap=44)
    fig.suptitle("Where each KL configuration's training ends, against the optimum of J_β = E[R] − β·KL (toy model)",
                 fontsize=11)  # fmt: skip
    footnote(fig, "Exact end points (float64), labelled with β; hollow circles: Monte Carlo end points, mean ± sd over "
             "seeds, labelled with β.\nConfigurations with the same end point at every β are drawn once and named "
             "together (legend).")  # fmt: skip
    return fig, caption(TOY_CAPTION.format(length=section["length"], seeds=section["monte_carlo"]["seeds"],
                                           threshold=section["reward"]["threshold"],
                                           betas=", ".join(f"{b:g}" for b in section["betas"]),
                                           mc_betas=", ".join(f"{b:g}" for b in section["monte_carlo"]["betas"])),
                        "\n".join(listed))  # fmt: skip


TOY_CAPTION = """\
**Where each KL configuration's training ends (toy model of §3.3).** The objective a KL penalty is meant to optimise \
is J_β = E_π[R] − β·KL(π‖π_ref), with R = 1 for a sequence of length T = {length} with at least {threshold} ones. \
Grey line: the exact optimum of J_β over β (the reward–KL frontier) in each policy family, through the exact end \
points that lie on it (the optimum at their own β), so that none of them lies above the line drawn between two rungs \
of the frontier's β grid; dotted: the unconstrained π*_β that the parametric family cannot reach. Markers: each \
configuration's exact end point at β ∈ {{{betas}}} (marker shape = placement, fill = estimator, colour = \
configuration, as in every figure), joined over β and labelled with β; ▶: no fixed point, the update drifts to the \
boundary (drawn where the followed flow stopped); ◆: still moving when stopped. Hollow circles with bars: the Monte \
Carlo end points of {seeds} seeds trained on-policy through the trainer's loss (mean ± the seeds' standard deviation, \
a description of their scatter, not a test), labelled with β, for β ∈ {{{mc_betas}}}; the toy's claims \
(figures/toy_claims.md) judge them. Configurations whose exact end points coincide at every β are drawn once and \
named together in the legend. Right: the gap J_β(optimum) − J_β(end) of the stable end points off the optimum."""


def coinciding_groups(rows: pd.DataFrame, key: str, columns: list[str], equal_nan: bool = False):
    """[(names, rows)]: the values of ``key`` whose rows (status and ``columns``, sorted by the first) coincide,
    grouped, each group drawn once. ``equal_nan``: NaN (and a missing status) equals NaN."""
    groups: list[tuple[list[str], pd.DataFrame]] = []
    for name, group in rows.groupby(key, sort=False):
        group = group.sort_values(columns[0]).reset_index(drop=True)
        for names, first in groups:
            status = (first.status.astype(str), group.status.astype(str)) if equal_nan else (first.status, group.status)
            same = len(first) == len(group) and (status[0] == status[1]).all() and np.allclose(
                first[columns].astype(float), group[columns].astype(float), rtol=1e-6, atol=1e-9,
                equal_nan=equal_nan)  # fmt: skip
            if same:
                names.append(name)
                break
        else:
            groups.append(([name], group))
    return groups


def _has_variant(names: list[str], variant: bool) -> bool:
    """Whether a group holds a framework's per-token correction (variant; its name has a third part: k3-loss-ratio)
    or, not variant, one of the paper's configurations."""
    return any((name.count("-") == 2) == variant for name in names)


def _draw_end_points(ax, names: list[str], group: pd.DataFrame) -> list[tuple]:
    """A group's exact end points over β: stable ones joined, the others marked alone; returns the stable ones' β
    labels (kl, reward, β, colour) for _label_betas."""
    style = {**style_of(names[0]), "linestyle": "-"}
    stable = group[group.status == "stable"]
    ax.plot(stable.kl, stable.reward, linewidth=0.9, markersize=6, zorder=3, label=_group_label(names), **style)
    for status, at in group[group.status != "stable"].groupby("status"):
        ax.plot(at.kl, at.reward, linestyle="", marker=EXACT_MARKERS.get(status, "x"), color=style["color"],
                markersize=7, zorder=3)  # fmt: skip
    return [(p.kl, p.reward, p.beta, style["color"]) for p in stable.itertuples()]


def _group_label(names: list[str]) -> str:
    return " = ".join(kl_label(n) for n in names)


LABEL_CELL = (0.5, 0.08)  # β labels of points within one such cell (KL, reward) are written once, together


def _draw_monte_carlo(ax, mc: pd.DataFrame) -> list[tuple]:
    """The Monte Carlo end points, mean ± the seeds' sd; returns their β labels (kl, reward, β, colour)."""
    for config, runs in mc.groupby("config", sort=False):
        spread = np.sqrt(runs.seeds)
        ax.errorbar(runs.mc_kl, runs.mc_reward, xerr=runs.mc_kl_se * spread, yerr=runs.mc_reward_se * spread, fmt="o",
                    mfc="none", ms=11, capsize=2, color=config_colour(config), lw=0.8, linestyle="")  # fmt: skip
    return [(p.mc_kl, p.mc_reward, p.beta, config_colour(p.config)) for p in mc.itertuples()]


def _label_betas(ax, labels: list[tuple]) -> None:
    """Write each point's β beside it, once for the points of a LABEL_CELL (at large β every configuration ends near
    the reference: one 'β 3' for all, in grey where they differ in colour)."""
    cells: dict[tuple, list[tuple]] = {}
    for kl, reward, beta, colour in labels:
        cells.setdefault((round(kl / LABEL_CELL[0]), round(reward / LABEL_CELL[1])), []).append((kl, reward, beta,
                                                                                                 colour))  # fmt: skip
    for members in cells.values():
        betas = ", ".join(f"{b:g}" for b in sorted({m[2] for m in members}))
        colours = {mcolors.to_hex(m[3]) for m in members}
        ax.annotate(f"β {betas}", (max(m[0] for m in members), min(m[1] for m in members)),
                    textcoords="offset points", xytext=(7, -11), fontsize=7,
                    color=colours.pop() if len(colours) == 1 else "0.3")  # fmt: skip


def _draw_toy_frontier(ax, fronts: pd.DataFrame, points: pd.DataFrame, family: str) -> None:
    """The family's frontier, through its end points on the optimum (each the optimum at its β: a chord between two
    frontier rungs passes below them); beside the parametric one, the tabular family's (the unconstrained π*_β)."""
    on_optimum = points[(points.status == "stable") & (points.objective_gap < GAP_FLOOR)][["kl", "reward"]]
    front = pd.concat([fronts[fronts.family == family][["kl", "reward"]], on_optimum]).sort_values("kl")
    ax.plot(front.kl, front.reward, color="black", lw=2, alpha=0.3, label="optimum of J_β over β (frontier)")
    if family == "parametric" and (fronts.family == "tabular").any():
        tabular = fronts[fronts.family == "tabular"].sort_values("kl")
        ax.plot(tabular.kl, tabular.reward, color="black", lw=1, ls=":", alpha=0.5, label="unconstrained optimum π*_β")


def _toy_status_keys(ax) -> None:
    """Legend proxies for what markers mean beyond the configuration."""
    for marker, text in ((">", "exact: no fixed point, drifts (drawn where stopped)"),
                         ("d", "exact: still moving when stopped")):  # fmt: skip
        ax.plot([], [], linestyle="", marker=marker, color="0.3", label=text)
    ax.errorbar([], [], xerr=[], yerr=[], fmt="o", mfc="none", color="0.3", label="Monte Carlo, mean ± sd (β labelled)")


def _draw_toy_gaps(ax, groups: list[tuple[list[str], pd.DataFrame]], family: str) -> list[str]:
    """J_β(optimum) − J_β(end) against β for the stable end points off the optimum, a line per group of coinciding
    configurations; returns the caption's lines on the groups on the optimum at every β and on those without a fixed
    point (nothing to draw)."""
    on_optimum, no_fixed_point = [], []
    for names, group in groups:
        stable = group[group.status == "stable"]
        off = stable[stable.objective_gap >= GAP_FLOOR]
        if len(off):
            ax.plot(off.beta, off.objective_gap, markersize=5, linewidth=1, label=_group_label(names),
                    **{**style_of(names[0]), "linestyle": "-"})  # fmt: skip
        if len(stable) and (stable.objective_gap < GAP_FLOOR).all():
            on_optimum.append(_group_label(names))
        unsettled = group[group.status != "stable"]
        if len(unsettled):
            states = ", ".join(f"{b:g} {s}" for b, s in zip(unsettled.beta, unsettled.status, strict=True))
            no_fixed_point.append(f"{_group_label(names)} (β {states})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    betas = sorted({b for _, group in groups for b in group.beta})
    ax.set_xticks(betas, [f"{b:g}" for b in betas])  # the β grid, plainly: no minor labels to crowd it
    ax.xaxis.set_minor_formatter(ticker.NullFormatter())
    ax.set_xlabel("β")
    ax.set_ylabel("J_β(family's optimum) − J_β(end point)")
    ax.set_title(f"{family} policy: distance to the optimum (stable, off it)", fontsize=10)
    ax.grid(alpha=0.3, which="major")
    return [f"- {family} policy, on the optimum (gap < {GAP_FLOOR:g}) at every β: {', '.join(on_optimum) or 'none'}.",
            f"- {family} policy, no fixed point: {'; '.join(no_fixed_point) or 'none'}."]
