"""The toy model's figures: Figure 1 (bias and variance of KL-gradient estimates) and where each configuration's
training ends against the optimum (the fixed points), at print size."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib import ticker

from klstudy.kl import PATHWISE, exactly_zero
from klstudy.report.figures.captions import Caption, finish
from klstudy.report.figures.encoding import COINCIDE, FULL_WIDTH, GAP_FLOOR, dodge, kl_label, save, style_of, tag

UNSETTLED_MARKERS = {"drifts": ">", "still moving": "d"}  # no stable fixed point: where the followed flow stopped


def coinciding(series: dict[str, np.ndarray]) -> list[list[str]]:
    """The keys whose arrays are equal to COINCIDE (NaN equal to NaN), grouped in order: each group drawn once."""
    groups: list[list[str]] = []
    for key, values in series.items():
        home = next((g for g in groups if len(series[g[0]]) == len(values) and np.allclose(
            series[g[0]], values, rtol=COINCIDE, atol=1e-9, equal_nan=True)), None)  # fmt: skip
        if home is None:
            groups.append([key])
        else:
            home.append(key)
    return groups


def labelled_lines(axes) -> list:
    """Each labelled line of these panels once, by label (a legend's entries)."""
    seen = {}
    for line in (line for ax in axes for line in ax.get_lines() if not line.get_label().startswith("_")):
        seen.setdefault(line.get_label(), line)
    return list(seen.values())


def group_label(names: list[str]) -> str:
    """"K1 in reward = K3 in reward and loss"; past three names, the first and a count (the caption names all)."""
    if len(names) <= 3:
        return " = ".join(kl_label(n) for n in names)
    return f"{kl_label(names[0])} = {len(names) - 1} more (the caption names them)"


# Figure 1 (§3.3).


def fig01_toy_bias_variance(results: pd.DataFrame, tests: pd.DataFrame, png: Path, settings: dict | None = None):
    """draw_fig01, written to ``png`` (a PDF and the caption, <name>.md, beside it)."""
    fig, text = draw_fig01(results, tests, settings)
    save(fig, png, text)


def draw_fig01(results: pd.DataFrame, tests: pd.DataFrame, definitions: dict | None = None):
    """Figure 1, a column per setting: the exact squared bias over the Monte Carlo noise floor and the variance ±1 se
    against T on log axes; the exactly unbiased named in the caption. Returns (figure, caption)."""
    results = results[(results.placement != "none") & (results.get("loss_gradient", PATHWISE) == PATHWISE)]
    unbiased = set(tests.config[tests.get("exact_unbiased", pd.Series(False, index=tests.index)) == True])  # noqa: E712
    settings = list(dict.fromkeys(results.setting))
    rows = [("squared_bias", "a"), ("squared_bias", "b"), ("variance", "a"), ("variance", "b")]
    fig, axes = plt.subplots(len(rows), len(settings), figsize=(FULL_WIDTH, 8.4), squeeze=False, sharex="col",
                             sharey="row", layout="constrained")  # fmt: skip
    for col, setting in enumerate(settings):
        for row, (metric, param) in enumerate(rows):
            ax = axes[row, col]
            mine = results[(results.setting == setting) & (results.param == param)].sort_values("T")
            if metric == "squared_bias":
                _bias_panel(ax, mine[~mine.config.isin(unbiased)])
            else:
                _variance_panel(ax, mine)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda x, _: f"{x:g}"))
            ax.grid(alpha=0.3)
            ax.set_title(f"setting “{setting}”" if row == 0 else "")
            ax.set_ylabel(f"{metric.replace('_', ' ')} of ∂/∂{param}" if col == 0 else "")
            ax.set_xlabel("sequence length T" if row == len(rows) - 1 else "")
    for row in axes:  # one y range per row covering every line drawn in it (set_ylim froze the first panel's)
        row[0].set_ylim(top=3 * max([y for ax in row for line in ax.get_lines() for y in line.get_ydata() if y > 0],
                                    default=1.0))  # fmt: skip
    legend = labelled_lines(axes.ravel()) + [plt.Rectangle((0, 0), 1, 1, color="0.88", label="Monte Carlo noise floor")]
    fig.legend(handles=legend, loc="outside lower center", ncols=3)
    fig.suptitle("Bias and variance of KL-gradient estimates in the toy model (§3.3)")
    caption = Caption()
    n = caption.number
    defined = [f"“{s}”: policy (a, b) = ({n(definitions[s]['a'])}, {n(definitions[s]['b'])}), reference "
               f"({n(definitions[s]['a_ref'])}, {n(definitions[s]['b_ref'])})"
               for s in settings if s in (definitions or {})]  # fmt: skip
    caption.add(
        caption.design("**Bias and variance of KL-gradient estimates (the paper's Figure 1, §3.3).** ") +
        "The gradient of KL(π‖π_ref) "
        "with respect to the policy's logit a and its dependence b on the previous token, against the sequence length "
        "T. Top two rows: the squared bias, exact by enumeration, over the Monte Carlo noise floor (grey, from "
        f"{n(int(results.trials.max()))} trials). Bottom two rows: the Monte Carlo variance, its ± 1 se band "
        f"often narrower than the line. Lines within {n(COINCIDE * 100)} % of each other at every T are drawn once, "
        "named together; the others are shifted a little along T so that each shows.",
        ("Settings: " + "; ".join(defined) + ".") if defined else "",
        ("Exactly unbiased, not drawn on the log axis: " + ", ".join(kl_label(c) for c in sorted(unbiased)) + ".")
        if unbiased else "")  # fmt: skip
    return fig, finish(fig, caption)


def _draw_lines(ax, lines: dict[str, pd.Series]) -> list[list[str]]:
    """One line per group of configurations equal at every T, in the first's style, each shifted a little in T."""
    groups = coinciding({c: s.to_numpy() for c, s in lines.items()})
    for i, names in enumerate(groups):
        series = lines[names[0]]
        tag(ax.plot(series.index * 2 ** dodge(i, len(groups), 0.3), series.to_numpy(), label=group_label(names),
                    markersize=4, **{**style_of(names[0]), "linestyle": "-"})[0], names[0], None, "marker")
    return groups


def _bias_panel(ax, rows: pd.DataFrame) -> None:
    rows = rows.dropna(subset=["exact_bias"])
    floor = (rows.groupby("T").std_error.max() ** 2).loc[lambda f: f > 0]
    if len(floor):
        ax.fill_between(floor.index, floor.to_numpy() * 1e-6, floor.to_numpy(), color="0.88", linewidth=0)
        ax.plot(floor.index, floor.to_numpy(), color="0.6", linewidth=0.8, label="_floor", gid="reference floor")
    lines = {}
    for config, line in rows.groupby("config", sort=False):
        line = line[[not exactly_zero(abs(b), abs(g)) for b, g in zip(line.exact_bias, line.true_grad, strict=True)]]
        if len(line):
            lines[config] = pd.Series((line.exact_bias**2).to_numpy(), index=line["T"].to_numpy())
    _draw_lines(ax, lines)
    low = min([y for line in ax.get_lines() for y in line.get_ydata() if y > 0] or [1e-12])
    ax.set_ylim(bottom=low / 10)


def _variance_panel(ax, rows: pd.DataFrame) -> None:
    lines, bands = {}, {}
    for config, line in rows.groupby("config", sort=False):
        line = line[line.variance > 0]
        if len(line):
            lines[config] = pd.Series(line.variance.to_numpy(), index=line["T"].to_numpy())
            bands[config] = np.sqrt(2 / (line.trials.to_numpy() - 1))
    for names, line in zip(_draw_lines(ax, lines), ax.get_lines(), strict=True):
        series, relative = lines[names[0]], bands[names[0]]
        band = ax.fill_between(line.get_xdata(), series * (1 - relative), series * (1 + relative),
                               color=style_of(names[0])["color"], alpha=0.15, linewidth=0)  # fmt: skip
        tag(band, names[0], None, "band")


# Where each KL configuration's training ends (analysis/fixed_points.py's and monte_carlo.py's tables).


def toy_fixed_points_figure(points, fronts, agreed, section: dict, png: Path) -> str:
    """draw_toy_fixed_points, written to ``png`` (a PDF beside it); returns the caption (the table's Markdown
    carries it)."""
    fig, text = draw_toy_fixed_points(points, fronts, agreed, section)
    save(fig, png)
    return text


def draw_toy_fixed_points(points: pd.DataFrame, fronts: pd.DataFrame, agreed: pd.DataFrame, section: dict):
    """A reward–KL panel per policy family (the optimum over β, each configuration's end points), then the Monte Carlo
    seeds' KL against the exact end points'. Returns (figure, caption)."""
    families = list(dict.fromkeys(points.family))
    mc = agreed[agreed["mode"] == "on-policy"]
    fig, axes = plt.subplots(1, len(families) + bool(len(mc)), figsize=(FULL_WIDTH, 5.6), squeeze=False,
                             layout="constrained")  # fmt: skip
    axes = axes[0]
    shared = [_end_points_panel(ax, points[points.family == family], fronts[fronts.family == family], family)
              for ax, family in zip(axes, families, strict=False)]  # fmt: skip
    if len(mc):
        _monte_carlo_panel(axes[-1], mc)
    handles = labelled_lines(axes) + [plt.Line2D([], [], color="0.3", linestyle="", marker=">",
                                                 label="▶ drifts, ◆ still moving: no fixed point")]  # fmt: skip
    fig.legend(handles=handles, loc="outside lower center", ncols=2)
    fig.suptitle("Where each KL configuration's training ends, against the optimum of J_β (toy model)")
    caption = Caption()
    n = caption.number
    caption.add(
        "**Where each KL configuration's training ends (toy model of §3.3, exact).** A penalty is meant to make "
        f"training optimise J_β = E[R] − β·KL(π‖π_ref), R = 1 for T = {n(section['length'])} tokens with at least "
        f"{n(section['reward']['threshold'])} ones. Per policy family: grey, the optimum of J_β over β (β ∈ "
        f"{{{', '.join(n(b) for b in section['betas'])}}} marked); each configuration's end points over β, joined; "
        "configurations that end alike at every β share a line."
        + (f" Right: {n(section['monte_carlo']['seeds'])} on-policy seeds per configuration and β, their mean KL at "
           "the end against the exact end point's: on the diagonal they agree." if len(mc) else "")
        + "".join(f" {family} policy, one line: " + "; ".join(kl_label(c) for c in names) + "."
                  for family, groups in zip(families, shared, strict=False) for names in groups if len(names) > 3)
        + " The table below: every end point (of one that drifts, where its flow stopped).")  # fmt: skip
    return fig, finish(fig, caption)


def _end_points_panel(ax, points: pd.DataFrame, front: pd.DataFrame, family: str) -> list[list[str]]:
    on_optimum = points[(points.status == "stable") & (points.objective_gap < GAP_FLOOR)]
    curve = pd.concat([front[["kl", "reward"]], on_optimum[["kl", "reward"]]]).sort_values("kl")
    ax.plot(curve.kl, curve.reward, color="black", lw=2.2, alpha=0.25, label="optimum of J_β over β", zorder=1,
            gid="reference")  # fmt: skip
    for beta, at in on_optimum.groupby("beta"):
        ax.annotate(f"β {beta:g}", (at.kl.iloc[0], at.reward.iloc[0]), xytext=(-4, 6), textcoords="offset points",
                    ha="right", fontsize=7, color="0.35")  # fmt: skip
    ends = {c: g.sort_values("beta")[["beta", "kl", "reward"]].to_numpy(dtype=float).ravel()
            for c, g in points.groupby("config", sort=False)}  # fmt: skip
    groups = coinciding(ends)
    for names in groups:
        group = points[points.config == names[0]].sort_values("beta")
        stable = group[group.status == "stable"]
        style = {**style_of(names[0]), "linestyle": "-"}
        tag(ax.plot(stable.kl, stable.reward, linewidth=0.9, markersize=5, label=group_label(names), zorder=3,
                    **style)[0], names[0], None, "marker")  # fmt: skip
        for status, at in group[group.status != "stable"].groupby("status"):
            tag(ax.plot(at.kl, at.reward, linestyle="", marker=UNSETTLED_MARKERS.get(status, "x"), markersize=6,
                        color=style["color"], zorder=5, label="_unsettled")[0], names[0], None, "band")  # fmt: skip
    ax.set_title(f"{family} policy (exact)")
    ax.set_xlabel("KL(π‖π_ref) at the end point")
    ax.set_ylabel("task reward E_π[R]")
    ax.set_ylim(-0.05, 1.08)
    ax.grid(alpha=0.3)
    return groups


def _monte_carlo_panel(ax, mc: pd.DataFrame) -> None:
    """The on-policy seeds' mean KL at the end (± se) against the exact end point's, a point per configuration and
    β, on log axes with the diagonal."""
    for (_, config), runs in mc.groupby(["family", "config"], sort=False):
        bars = ax.errorbar(runs.kl, runs.mc_kl, yerr=runs.mc_kl_se, linestyle="", markersize=5, capsize=0,
                           **{k: v for k, v in style_of(config).items() if k != "linestyle"})  # fmt: skip
        tag(bars.lines[0], config, None, "marker").set_label(kl_label(config))  # its legend entry
    values = [v for v in [*mc.kl, *mc.mc_kl] if v > 0]
    low, high = min(values) / 2, max(values) * 2
    ax.plot([low, high], [low, high], color="0.5", linestyle=(0, (3, 2)), linewidth=0.8, label="_diagonal",
            gid="reference diagonal")  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.set_title(f"Monte Carlo check, {', '.join(dict.fromkeys(mc.family))} policy")
    ax.set_xlabel("exact end point's KL")
    ax.set_ylabel("seeds' mean KL at the end")
    ax.grid(alpha=0.3)
