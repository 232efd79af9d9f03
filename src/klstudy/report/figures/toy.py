"""The toy model's figures: Figure 1 (bias and variance of KL-gradient estimates) and where each configuration's
training ends against the optimum (the fixed points).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.colors as mcolors
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib import ticker

from klstudy.kl import PATHWISE, exactly_zero
from klstudy.report.figures.encoding import (
    GAP_FLOOR,
    caption,
    coinciding_groups,
    config_colour,
    figure_legend,
    footnote,
    kl_label,
    save,
    style_of,
)

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
# Where each KL configuration's training ends in the toy model (analysis/fixed_points.py's and monte_carlo.py's tables).

EXACT_MARKERS = {"drifts": ">", "still moving": "d"}  # a stable fixed point has its configuration's marker


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
    return [
        f"- {family} policy, on the optimum (gap < {GAP_FLOOR:g}) at every β: {', '.join(on_optimum) or 'none'}.",
        f"- {family} policy, no fixed point: {'; '.join(no_fixed_point) or 'none'}.",
    ]
