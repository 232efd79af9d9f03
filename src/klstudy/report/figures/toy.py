"""The toy model's figures: Figure 1 (bias and variance of KL-gradient estimates) and where each configuration's
training ends against the optimum (the fixed points), at print size."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib import patheffects, ticker
from matplotlib.legend_handler import HandlerTuple

from klstudy.kl import PATHWISE, exactly_zero
from klstudy.report.figures import encoding
from klstudy.report.figures.captions import Caption, finish
from klstudy.report.figures.encoding import config_colour, dodge, key_handles, kl_label, marker_of, style_of, tag


def coinciding(series: dict[str, np.ndarray]) -> list[list[str]]:
    """The keys whose arrays are equal to COINCIDE (NaN equal to NaN), grouped in order: each group drawn once."""
    groups: list[list[str]] = []
    for key, values in series.items():
        home = next((g for g in groups if len(series[g[0]]) == len(values) and np.allclose(
            series[g[0]], values, rtol=encoding.COINCIDE, atol=1e-9, equal_nan=True)), None)  # fmt: skip
        groups.append([key]) if home is None else home.append(key)
    return groups


def group_label(names: list[str]) -> str:
    """"K1 in reward = K3 in reward and loss"; past three names, the first and a count (the caption names all)."""
    return " = ".join(kl_label(n) for n in names) if len(names) <= 3 else (
        f"{kl_label(names[0])} = {len(names) - 1} more (the caption names them)")


def short_names(names: list[str]) -> str:
    """'K2 in loss; K1/K3 in loss, ratio-weighted': configurations alike but in their estimator named together."""
    estimators: dict[str, list[str]] = {}
    for name in names:
        estimator, _, rest = kl_label(name).partition(" ")
        estimators.setdefault(rest, []).append(estimator)
    return "; ".join(f"{'/'.join(e)} {rest}" for rest, e in estimators.items())


def draw_fig01(results: pd.DataFrame, tests: pd.DataFrame, definitions: dict | None = None):
    """Figure 1, a column per setting: the exact squared bias over the Monte Carlo noise floor and the variance
    against T on log axes; the exactly unbiased named in the caption. Returns (figure, caption)."""
    results = results[(results.placement != "none") & (results.get("loss_gradient", PATHWISE) == PATHWISE)]
    unbiased = set(tests.config[tests.get("exact_unbiased", pd.Series(False, index=tests.index)) == True])  # noqa: E712
    settings = list(dict.fromkeys(results.setting))
    rows = [("squared_bias", "a"), ("squared_bias", "b"), ("variance", "a"), ("variance", "b")]
    fig, axes = plt.subplots(len(rows), len(settings), figsize=(encoding.FULL_WIDTH, 8.4), squeeze=False, sharex="col",
                             sharey="row", layout="constrained")  # fmt: skip
    for col, setting in enumerate(settings):
        for row, (metric, param) in enumerate(rows):
            ax = axes[row, col]
            mine = results[(results.setting == setting) & (results.param == param)].sort_values("T")
            if metric == "squared_bias":
                _bias_panel(ax, mine[~mine.config.isin(unbiased)])
            else:
                draw_coinciding(ax, {c: pd.Series(g.variance.to_numpy(), index=g["T"].to_numpy())
                                 for c, g in mine[mine.variance > 0].groupby("config", sort=False)})  # fmt: skip
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda x, _: f"{x:g}"))
            ax.grid(alpha=0.3)
            ax.set(title=f"setting “{setting}”" if row == 0 else "", xlabel="sequence length T" if row == len(rows) - 1
                   else "", ylabel=f"{metric.replace('_', ' ')} of ∂/∂{param}" if col == 0 else "")  # fmt: skip
    for row in axes:  # one y range per row holding every line drawn in it, so that none runs off the panel
        ys = [y for ax in row for line in ax.get_lines() for y in line.get_ydata() if y > 0]
        row[0].set_ylim(min(ys, default=0.1) / 3, max(ys, default=1.0) * 3)
    floor = plt.Rectangle((0, 0), 1, 1, color="0.88", label="Monte Carlo noise floor")
    fig.legend(handles=key_handles(encoding.drawn_configs(fig), []) + [floor], loc="outside lower center", ncols=3,
               markerscale=1.4)
    fig.suptitle("Bias and variance of KL-gradient estimates in the toy model (§3.3)")
    caption = Caption()
    n = caption.number
    trials, enumerated = int(results.trials.max()), results.dropna(subset=["exact_bias"])["T"].max()
    defined = [f"“{s}”: policy (a, b) = ({n(definitions[s]['a'])}, {n(definitions[s]['b'])}), reference "
               f"({n(definitions[s]['a_ref'])}, {n(definitions[s]['b_ref'])})"
               for s in settings if s in (definitions or {})]  # fmt: skip
    caption.add(caption.design("**Bias and variance of KL-gradient estimates (the paper's Figure 1, §3.3).** ") +
        "The gradient of KL(π‖π_ref) in the policy's logit a and its weight b on the previous token, against "
        "the length T. Top two rows: the squared bias, exact by enumeration, over the Monte "
        f"Carlo noise floor (grey, {n(trials)} trials), enumerated up to T = {n(enumerated)}"
        + caption.design("; a bias exactly 0 is not drawn.") + " Bottom two rows: the Monte Carlo variance; its ±1 se, "
        f"±{n(100 * np.sqrt(2 / (trials - 1)), '.0f')} %, is thinner than the line, so no band is drawn.",
        ("Settings: " + "; ".join(defined) + ".") if defined else "",
        ("Exactly unbiased, not drawn on the log axis: " + ", ".join(kl_label(c) for c in sorted(unbiased)) + ".")
        if unbiased else "")  # fmt: skip
    return fig, finish(fig, caption)


def draw_coinciding(ax, lines: dict[str, pd.Series], place=lambda x, i, n: x * 2 ** dodge(i, n, 0.8),
                    named: bool = False) -> None:  # fmt: skip
    """One line per group of configurations equal at every x (COINCIDE), in the first's colour, its x ``place``d
    apart from the other groups'; its markers alternate between the group's configurations, so that each shows, each
    ringed in white so that one over another (or over a line) keeps its edge and fill."""
    groups = coinciding({c: s.to_numpy() for c, s in lines.items()})
    by_value = np.argsort([np.log(lines[names[0]]).median() for names in groups])  # near lines: places far apart
    slots = dict(zip(by_value, [*range(0, len(groups), 2), *range(1, len(groups), 2)], strict=True))
    for i, names in enumerate(groups):
        x, y = place(lines[names[0]].index.to_numpy(dtype=float), slots[i], len(groups)), lines[names[0]].to_numpy()
        _draw_group(ax, names, x, y)
        if named and len(names) > 1:  # the legend names each; the panel says which are one line (Figure 1's bias)
            ax.annotate(group_label(names), (x[-1], y[-1]), (-4, 5), "data", "offset points", ha="right", fontsize=7)


def _draw_group(ax, names: list[str], x, y):
    """One line in the first's colour, its markers alternating between ``names``, each ringed in white; the line."""
    line = tag(ax.plot(x, y, color=config_colour(names[0]), label="_group")[0], names[0], None, "band")
    for k, name in enumerate(names):
        tag(ax.plot(x[k :: len(names)], y[k :: len(names)], markersize=5, label="_member", zorder=3, path_effects=[
            patheffects.withStroke(linewidth=2, foreground="white")], **{**style_of(name), "linestyle": ""})[0],
            name, None, "marker")  # fmt: skip
    return line


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
    draw_coinciding(ax, lines, named=True)


def draw_toy_fixed_points(points: pd.DataFrame, fronts: pd.DataFrame, agreed: pd.DataFrame, section: dict):
    """A reward–KL panel per policy family (the optimum over β, each configuration's end points), then the Monte Carlo
    seeds' KL over the exact end points'. Configurations ending alike in every family share a line, named together."""
    families = list(dict.fromkeys(points.family))
    ends = {c: g.sort_values(["family", "beta"])[["beta", "kl", "reward"]].to_numpy(dtype=float).ravel()
            for c, g in points.groupby("config", sort=False)}  # fmt: skip
    groups = coinciding(ends)
    mc = (checked := agreed[agreed["mode"] == "on-policy"])[lambda c: c.status == "stable"]
    fig, (axes,) = plt.subplots(1, len(families) + bool(len(mc)), figsize=(encoding.FULL_WIDTH, 5.6), squeeze=False,
                                layout="constrained")  # fmt: skip
    for ax, family in zip(axes, families, strict=False):
        _end_points_panel(ax, points[points.family == family], fronts[fronts.family == family], family, groups)
    farthest = _monte_carlo_panel(axes[-1], mc, groups) if len(mc) else None
    from klstudy.analysis.monte_carlo import AGREEMENT_Z  # here: it imports torch, which a figure job does not need
    keys = {group_label(g): tuple(key_handles(g[:3], [])) for g in groups if g[0] in set(points.config[
        points.status == "stable"])}  # a line's key: its first three configurations' markers  # fmt: skip
    seen = {line.get_label(): keys.get(line.get_label(), line) for ax in axes for line in ax.get_lines()
            if not line.get_label().startswith("_")}  # fmt: skip
    seen |= {f"{s}: no fixed point (where stopped)": plt.Line2D([], [], color="0.3", linestyle="", marker=m)
             for s, m in encoding.UNSETTLED_MARKERS.items()}  # fmt: skip
    fig.legend([*seen.values()], [*seen], loc="outside lower center", ncols=2, handler_map={tuple: HandlerTuple(None)})
    fig.suptitle("Where each KL configuration's training ends, against the optimum of J_β (toy model)")
    n = (caption := Caption()).number
    caption.add(
        "**Where each KL configuration's training ends (toy model of §3.3, exact).** R = 1: at least "
        f"{n(section['reward']['threshold'])} ones in T = {n(section['length'])} tokens. Per family: grey, the optimum "
        "of J_β over β (each β's point labelled); each configuration's end points, "
        "joined over β, at their values even where they overlap; overlapping ▶ ✚ stacked upward."
        + (f" Right: {n(section['monte_carlo']['seeds'])} on-policy seeds' mean end KL ÷ the exact one, ±1 se "
           f"({', '.join(dict.fromkeys(mc.family))}; the {n(mc.config.nunique())} of the {n(checked.config.nunique())} "
           "configurations checked whose exact end point is stable"
           f"{'; left out: β = ' * bool(left := [n(b) for b in section['betas'] if b not in set(mc.beta)])}"
           f"{', '.join(left)}); within "
           f"{n(AGREEMENT_Z)} se agrees. Farthest: {kl_label(farthest[0])} at β = {n(farthest[1])}, "
           f"{caption.value(*farthest[2:])}." if len(mc) else "")
        + "".join(f" One line: {short_names(names)}." for names in groups if len(names) > 3))  # fmt: skip
    return fig, finish(fig, caption)


def _end_points_panel(ax, points: pd.DataFrame, front: pd.DataFrame, family: str, groups: list[list[str]]) -> None:
    on_optimum = points[(points.status == "stable") & (points.objective_gap < encoding.GAP_FLOOR)]
    curve = pd.concat([front[["kl", "reward"]], on_optimum[["kl", "reward"]]]).sort_values("kl")
    ax.plot(curve.kl, curve.reward, color="black", lw=2.2, alpha=0.25, label="optimum of J_β over β", zorder=1,
            gid="reference")  # fmt: skip
    for beta, at in on_optimum.groupby("beta"):
        ax.annotate(f"β {beta:g}", (at.kl.iloc[0], at.reward.iloc[0]), xytext=(-4, 6), textcoords="offset points",
                    ha="right", fontsize=7, color="0.35")  # fmt: skip
    ends = []  # (KL, reward, status, configuration, colour, label) of every end point drawn
    for names in groups:
        group = points[points.config == names[0]].sort_values("beta")
        stable, label = group[group.status == "stable"], group_label(names)
        if len(stable):  # Figure 1's way: one line, its markers alternating; named here for the figure's legend
            _draw_group(ax, names, stable.kl.to_numpy(), stable.reward.to_numpy()).set_label(label)
        ends += [(e.kl, e.reward, e.status, names[0], config_colour(names[0]), label if stable.empty else "_unsettled")
                 for e in group.round(3).drop_duplicates(["kl", "reward"]).itertuples()]  # fmt: skip
    # Each at its true KL; one with no fixed point that would overlap an end point drawn (within 0.09 in, at the
    # panel's size before its layout) is stacked upward in steps of 0.03, above its row (the table has each value).
    ax.set_xlim(-0.15 * (most := max([e[0] for e in ends] + [*curve.kl])), 1.06 * most)  # room for β's labels
    inches = ax.get_position().size * ax.figure.get_size_inches() / [1.21 * most, 1.13]
    at = []
    for kl, reward, status, name, colour, label in sorted(ends, key=lambda e: (e[2] != "stable", e[0])):
        y = reward
        while status != "stable" and any(max(abs(kl - a) * inches[0], abs(y - b) * inches[1]) < 0.09 for a, b in at):
            y += 0.03
        at.append((kl, y))
        if status != "stable":
            tag(ax.plot(kl, y, linestyle="", marker=encoding.UNSETTLED_MARKERS.get(status, "x"), markersize=6,
                        color=colour, zorder=5, label=label, clip_on=False)[0], name, None, "band")
    ax.set(title=f"{family} policy (exact)", xlabel="KL(π‖π_ref) at the end point", ylabel="task reward E_π[R]")
    ax.set(ylim=(-0.05, max(1.08, max(b for _, b in at) + 0.05)), yticks=np.linspace(0, 1, 6))
    ax.grid(alpha=0.3)


def _monte_carlo_panel(ax, mc: pd.DataFrame, groups: list[list[str]]) -> None:
    """The on-policy seeds' mean KL at the end over the exact end point's, ±1 se, per β (categories): a point per
    configuration in its own colour and marker (its legend in the panel), read against 1. Returns the farthest."""
    betas = sorted(mc.beta.unique())
    order, ratios = [name for names in groups for name in names if name in set(mc.config)], []
    for i, config in enumerate(order):
        runs = mc[mc.config == config].sort_values("beta")
        x = np.array([betas.index(b) for b in runs.beta]) + dodge(i, len(order), 0.8)
        y = (runs.mc_kl / runs.kl).to_numpy()
        bars = ax.errorbar(x, y, yerr=runs.mc_kl_se / runs.kl, linestyle="", markersize=4, capsize=0, elinewidth=0.8,
                           **{**marker_of(config), "color": config_colour(config)})  # fmt: skip
        tag(bars.lines[0], config, None, "marker").set_label("_mc")
        ratios += [(abs(y[k] - 1), config, b, bars.lines[0], k) for k, b in enumerate(runs.beta)]
    ax.axhline(1, color="0.5", linestyle=(0, (3, 2)), linewidth=0.8, gid="reference one")
    ax.legend(handles=key_handles(order, []), loc="best", handlelength=1.5)
    ax.set_xticks(range(len(betas)), [f"β = {b:g}" for b in betas])
    ax.set_title(f"Monte Carlo check, {', '.join(dict.fromkeys(mc.family))} policy")
    ax.set_ylabel("seeds' mean KL at the end ÷ the exact end point's")
    ax.grid(alpha=0.3, axis="y")
    return max(ratios, key=lambda r: r[0])[1:]  # (configuration, β, its line, index): the caption quotes it
