"""The toy model's figures: Figure 1 (bias and variance of KL-gradient estimates) and where each configuration's
training ends against the optimum (the fixed points), at print size."""

from __future__ import annotations

from pathlib import Path

import matplotlib.colors as mcolors
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib import ticker, transforms

from klstudy.kl import NO_KL, PATHWISE, exactly_zero
from klstudy.report.figures.captions import Caption, finish
from klstudy.report.figures.encoding import (
    FULL_WIDTH,
    GAP_FLOOR,
    MAX_HEIGHT,
    coinciding_groups,
    config_colour,
    kl_label,
    marker_of,
    save,
    style_of,
    tag,
)

# ---------------------------------------------------------------------------------------------------------
# Figure 1 (§3.3).

ESTIMATOR_ORDER = {"k1": 0, "k2": 1, "k3": 2}  # drawing order of a panel's lines: filled, half-filled, hollow markers
NEAR = 1.25  # two lines within this factor of each other at every T are named as lying together (log axes)


def fig01_toy_bias_variance(results: pd.DataFrame, tests: pd.DataFrame, png: Path, settings: dict | None = None):
    """draw_fig01, written to ``png`` (a PDF and the caption, <name>.md, beside it)."""
    fig, text = draw_fig01(results, tests, settings)
    save(fig, png, text)


def _settings_text(settings: dict | None, shown: list[str]) -> str:
    """'“close”: the policy's (a, b) = (0.2, 0.05), the reference's (0, 0); …' (config toy.settings, eqs. (17)-(18))."""
    known = [name for name in shown if name in (settings or {})]
    if not known:
        return ""
    number = lambda v: f"{v:g}".replace("-", "−")  # noqa: E731
    parts = [f"“{name}”: the policy's (a, b) = ({number(settings[name]['a'])}, {number(settings[name]['b'])}), the "
             f"reference's ({number(settings[name]['a_ref'])}, {number(settings[name]['b_ref'])})"
             for name in known]  # fmt: skip
    return "The settings (a: the logit of a 1, b: how much the previous token adds to it): " + "; ".join(parts) + "."


def draw_fig01(results: pd.DataFrame, tests: pd.DataFrame, definitions: dict | None = None):
    """Figure 1: squared bias and variance of each configuration's gradient estimate against T; (figure, caption).
    ``definitions``: config toy.settings, each setting's parameters (the caption defines each column's setting).

    One column per setting, rows: the squared bias of ∂/∂a and ∂/∂b (exact, by enumeration, over the Monte Carlo noise
    floor in grey), the variance of ∂/∂a and ∂/∂b (Monte Carlo, ± 1 se band); log scales, one y range per row pair.
    Configurations whose exact bias is zero have no place on a log axis and are named in the caption; configurations
    that coincide are drawn once and named together, those that nearly do are named in the caption."""
    results = results[(results.placement != "none") & (results.get("loss_gradient", PATHWISE) == PATHWISE)]
    unbiased = set(tests.config[tests.get("exact_unbiased", pd.Series(False, index=tests.index)) == True])  # noqa: E712
    settings = list(dict.fromkeys(results.setting))
    rows = [("squared_bias", "a"), ("squared_bias", "b"), ("variance", "a"), ("variance", "b")]
    fig, axes = plt.subplots(len(rows), len(settings), figsize=(FULL_WIDTH, 8.4), squeeze=False, sharex="col",
                             layout="constrained")  # fmt: skip
    fig.get_layout_engine().set(h_pad=0.06)  # room between rows for the end labels of their log axes
    caption, together, near = Caption(), [], []
    for col, setting in enumerate(settings):
        for row, (metric, param) in enumerate(rows):
            ax = axes[row, col]
            mine = results[(results.setting == setting) & (results.param == param)]
            if metric == "squared_bias":
                lines = _exact_bias_panel(ax, mine[~mine.config.isin(unbiased)])
            else:
                lines = _variance_panel(ax, mine)
            together += [f"{setting}, {_row_name(metric, param)}: {' = '.join(kl_label(n) for n in names)}"
                         for names in lines if len(names) > 1]  # fmt: skip
            near += [f"{setting}, {_row_name(metric, param)}: {', '.join(names)} at {where}"
                     for names, where in _near_groups(_near_lines(ax))]  # fmt: skip
            if row == 0:
                ax.set_title(f"setting “{setting}”")
            if col == 0:
                ax.set_ylabel(_row_name(metric, param))
            if row == len(rows) - 1:
                ax.set_xlabel("sequence length T")
    for first in (0, 2):  # one y range per quantity: squared bias rows together, variance rows together
        _share_log_limits([ax for r in axes[first : first + 2] for ax in r])
    configs = [c for c in dict.fromkeys(results.config)]
    handles = [tag(plt.Line2D([], [], **{**style_of(c), "linestyle": "-"}, label=kl_label(c)), c, None, "marker")
               for c in _table_order(configs)]  # fmt: skip
    handles.append(plt.Rectangle((0, 0), 1, 1, color="0.88", label="Monte Carlo noise floor"))
    fig.legend(handles=handles, loc="outside lower center", ncols=4)
    fig.suptitle("Bias and variance of KL-gradient estimates in the toy model (§3.3)")
    sequences = int(results.sequences.max()) if "sequences" in results else "the config's"
    caption.add(caption.design(FIG01_CAPTION.format(trials=int(results.trials.max()), sequences=sequences)),
                caption.design(_settings_text(definitions, settings)),
                ("Squared bias exactly zero at every T (not drawn on the log axis): "
                 + ", ".join(kl_label(c) for c in configs if c in unbiased) + ".") if unbiased else "",
                ("Drawn once, equal at every T: " + "; ".join(dict.fromkeys(together)) + ".") if together else "",
                (f"Within a factor {caption.number(NEAR)} of each other (read one line as two; lines are drawn in "
                 "falling widths, K1's filled markers widest and beneath, K3's hollow ones on top, so that each "
                 "shows): "
                 + "; ".join(dict.fromkeys(near)) + ".") if near else "")  # fmt: skip
    return fig, finish(fig, caption)


FIG01_CAPTION = (
    "**Bias and variance of KL-gradient estimates in the parametric autoregressive model (the paper's Figure 1, "
    "§3.3).** The estimate of ∇ KL(π‖π_ref) with respect to the policy's parameters a and b, against the sequence "
    "length T, one column per setting (the policy's parameters a and b, the reference's). Top two rows: the squared "
    "bias, exact: the estimator's expectation by enumerating every sequence (T ≤ 16) minus the exact gradient; grey, "
    "the Monte Carlo noise floor, the squared standard error of a bias estimated from {trials} trials of {sequences} "
    "sequences, below which a sampled bias cannot be told from zero. Bottom two rows: the variance, Monte Carlo, with "
    "a ± 1 se band, variance·(1 ± √(2/(trials − 1))). The frameworks' per-token loss corrections are Table 1's, not "
    "this figure's."
)


def _row_name(metric: str, param: str) -> str:
    return f"{'squared bias' if metric == 'squared_bias' else 'variance'} of ∂/∂{param}"


def _table_order(configs: list[str]) -> list[str]:
    """Configurations by placement, then estimator (the legend's rows and columns)."""
    order = {"reward": 0, "loss": 1, "both": 2}
    return sorted(configs, key=lambda c: (order.get(c.split("-")[1] if "-" in c else "", 3), c))


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


def _draw_lines(ax, lines: dict[str, pd.Series]) -> list[list[str]]:
    """One line per group of coinciding configurations, in its first configuration's style (labelled with every
    name); earlier lines wider, so that a line under another shows at its edges."""
    # filled markers (K1) first, widest and beneath, hollow ones (K3) last, on top: a hollow marker over a filled one
    # shows both, a filled one over a hollow one hides it
    groups = sorted(_coinciding_lines(lines), key=lambda group: ESTIMATOR_ORDER.get(group[0][0][:2], 3))
    for i, (names, series) in enumerate(groups):
        style = {**style_of(names[0]), "linestyle": "-"}
        line = ax.plot(series.index, series.to_numpy(), markersize=max(3.0, 7.0 - 0.7 * i),
                       linewidth=max(0.7, 2.6 - 0.3 * i), zorder=2 + 0.01 * i,
                       label=" = ".join(kl_label(n) for n in names), **style)[0]  # fmt: skip
        tag(line, names[0], None, "marker")
    return [names for names, _ in groups]


def _near_groups(pairs: list[tuple[str, str, str]]) -> list[tuple[list[str], str]]:
    """Pairs near at the same T joined into groups ("K2 in reward, K3 in reward, K1 in loss at every T")."""
    groups: list[tuple[list[str], str]] = []
    for a, b, where in pairs:
        home = next((g for g in groups if g[1] == where and (a in g[0] or b in g[0])), None)
        if home is None:
            groups.append(([a, b], where))
        else:
            home[0].extend(n for n in (a, b) if n not in home[0])
    return groups


def _near_lines(ax) -> list[tuple[str, str, str]]:
    """Pairs of drawn lines within NEAR of each other at two thirds of their shared x at least (on a log axis: one
    reads as the other there), with where ('every T', '4 of its 5 T')."""
    lines = [line for line in ax.get_lines() if line.get_gid() and len(line.get_xdata()) > 1]
    pairs = []
    for i, a in enumerate(lines):
        for b in lines[i + 1 :]:
            xa, xb = list(a.get_xdata()), list(b.get_xdata())
            if xa != xb:
                continue
            ya, yb = np.asarray(a.get_ydata(), float), np.asarray(b.get_ydata(), float)
            ratio = np.maximum(ya, yb) / np.minimum(ya, yb)
            close = int(np.sum(ratio < NEAR))
            if close >= max(2, (2 * len(ratio) + 2) // 3) and not np.allclose(ya, yb, rtol=1e-6):
                where = "every T" if close == len(ratio) else f"{close} of its {len(ratio)} T"
                pairs.append((a.get_label(), b.get_label(), where))
    return pairs


def _exact_bias_panel(ax, rows: pd.DataFrame) -> list[list[str]]:
    """Exact squared bias per configuration (exact zeros left out), over the Monte Carlo noise floor."""
    rows = rows.dropna(subset=["exact_bias"]).sort_values("T")
    floor = (rows.groupby("T").std_error.max() ** 2).loc[lambda f: f > 0]
    if len(floor):
        ax.fill_between(floor.index, floor.to_numpy() * 1e-6, floor.to_numpy(), color="0.88", linewidth=0)
        ax.plot(floor.index, floor.to_numpy(), color="0.6", linewidth=0.8, label="_floor", gid="reference floor")
    lines = {}
    for config, line in rows.groupby("config", sort=False):
        kept = [not exactly_zero(abs(b), abs(g)) for b, g in zip(line.exact_bias, line.true_grad, strict=True)]
        line = line[kept]
        if len(line):
            lines[config] = pd.Series((line.exact_bias**2).to_numpy(), index=line["T"].to_numpy())
    groups = _draw_lines(ax, lines)
    _log_t_axis(ax)
    return groups


def _variance_panel(ax, rows: pd.DataFrame) -> list[list[str]]:
    """Monte Carlo variance per configuration (no spread: left out), ± 1 se band."""
    lines, bands = {}, {}
    for config, line in rows.sort_values("T").groupby("config", sort=False):
        line = line[line.variance > 0]
        if len(line):
            lines[config] = pd.Series(line.variance.to_numpy(), index=line["T"].to_numpy())
            bands[config] = np.sqrt(2 / (line.trials.to_numpy() - 1))
    for names, series in _coinciding_lines(lines):
        relative = bands[names[0]]
        band = ax.fill_between(series.index, series * (1 - relative), series * (1 + relative),
                               color=config_colour(names[0]), alpha=0.15, linewidth=0)  # fmt: skip
        tag(band, names[0], None, "band")
    groups = _draw_lines(ax, lines)
    _log_t_axis(ax)
    return groups


def _log_t_axis(ax) -> None:
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda x, _: f"{x:g}"))
    ax.grid(alpha=0.3, which="major")


def _share_log_limits(axes) -> None:
    """One y range for these log axes: from the smallest plotted value to the largest band, bands clipped below;
    every other decade labelled."""
    values = [y for ax in axes for line in ax.get_lines() for y in np.asarray(line.get_ydata(), dtype=float)]
    values = [y for y in values if y > 0 and np.isfinite(y)]
    tops = [y for ax in axes for c in ax.collections for y in c.get_datalim(ax.transData).intervaly if y > 0]
    if values:
        top = max([*values, *[t for t in tops if np.isfinite(t)]])
        for ax in axes:
            ax.set_ylim(min(values) / 5, top * 5)
            ax.yaxis.set_major_locator(ticker.LogLocator(base=10, numticks=5))
            ax.yaxis.set_minor_locator(ticker.LogLocator(base=10, subs=(1.0,)))
            ax.yaxis.set_minor_formatter(ticker.NullFormatter())


# ---------------------------------------------------------------------------------------------------------
# Where each KL configuration's training ends in the toy model (analysis/fixed_points.py's and monte_carlo.py's tables).

UNSETTLED_MARKERS = {"drifts": ">", "still moving": "d"}  # a stable fixed point has its configuration's marker


def toy_fixed_points_figure(points, fronts, agreed, section: dict, png: Path) -> str:
    """draw_toy_fixed_points, written to ``png`` (a PDF beside it); returns the caption (the table's Markdown, which
    has this figure's name, carries it)."""
    fig, text = draw_toy_fixed_points(points, fronts, agreed, section)
    save(fig, png)
    return text


def _group_label(names: list[str]) -> str:
    """A group of coinciding configurations: every name, or the first and how many per-token corrections it holds
    (the caption names them)."""
    corrections = [n for n in names[1:] if n.count("-") == 2]
    if len(corrections) < 3:
        return " = ".join(kl_label(n) for n in names)
    others = [n for n in names[1:] if n.count("-") != 2]
    return " = ".join(kl_label(n) for n in [names[0], *others]) + f" = {len(corrections)} per-token corrections"


def draw_toy_fixed_points(points: pd.DataFrame, fronts: pd.DataFrame, agreed: pd.DataFrame, section: dict):
    """One row per family, exact. Left: the reward–KL plane, the exact frontier (the family's optimum over β, its β
    grid marked) and each configuration's exact stable end points over β (its marker, joined over β); the end points
    of configurations without a fixed point (▶, where the flow stopped) or still moving (◆), once per place (several
    configurations end at one: the caption names them). Right: the gap J_β(optimum) − J_β(end) against β.
    Configurations whose end points coincide at every β are drawn once (the caption names them). Below, the Monte
    Carlo check: a panel per β of the on-policy runs, a row per configuration trained, the seeds' KL at the end
    (mean ± se) under the exact end point's. Returns (figure, caption)."""
    families = list(dict.fromkeys(points.family))
    mc = agreed[agreed["mode"] == "on-policy"]
    heights = [2.6 * len(families), *([2.4] if len(mc) else [])]  # inches: the exact rows, the Monte Carlo check
    fig = plt.figure(figsize=(FULL_WIDTH, min(MAX_HEIGHT, sum(heights) + 1.4)), layout="constrained")
    parts = fig.subfigures(len(heights), 1, squeeze=False, height_ratios=heights)[:, 0]
    axes = parts[0].subplots(len(families), 2, squeeze=False, width_ratios=[1.5, 1])
    caption = Caption()
    listed, legend, keys, leaders = [], {}, {}, {}
    for row, family in enumerate(families):
        mine = points[points.family == family]
        groups = coinciding_groups(mine, "config", ["beta", "reward", "kl"])
        leaders[family] = {n: names[0] for names, _ in groups for n in names}
        ax = axes[row, 0]
        _draw_toy_frontier(ax, fronts, mine, family)
        # falling sizes, filled markers (K1) largest and beneath, hollow (K3) smallest on top: end points that lie
        # on one another each show a rim (near the reference, at large β, most of them do)
        ordered = sorted(groups, key=lambda g: ESTIMATOR_ORDER.get(g[0][0][:2], 3))
        for rank, (names, group) in enumerate(ordered):
            handle = _draw_end_points(ax, names, group, 8.0 - 4.0 * rank / max(len(ordered) - 1, 1), rank)
            if handle is not None:
                legend.setdefault(handle.get_label(), handle)
        listed += _draw_unsettled(ax, mine, family, caption, leaders[family])
        keys.update({names[0]: _group_label(names) for names, group in groups if (group.status != "stable").any()})
        ax.set_title(f"{family} policy: where training ends (exact)")
        ax.set_xlabel("KL(π ‖ π_ref) at the end point")
        ax.set_ylabel("task reward E_π[R]")
        ax.set_ylim(-0.05, 1.08)
        ax.set_yticks(np.linspace(0, 1, 6))
        ax.set_xlim(-0.4, float(np.nanmax(mine.kl)) * 1.04 + 0.05)
        ax.grid(alpha=0.3)
        listed += _draw_toy_gaps(axes[row, 1], groups, family)
        listed += [f"{family} policy, drawn as {kl_label(names[0])}: also {', '.join(kl_label(n) for n in names[1:])}"
                   for names, group in groups if len(names) > 1 and (group.status == "stable").any()]  # fmt: skip
    if len(mc):
        _draw_monte_carlo_check(parts[1], points, mc, leaders)
        for family, config in mc[["family", "config"]].drop_duplicates().itertuples(index=False):
            keys.setdefault(leaders[family].get(config, config), kl_label(leaders[family].get(config, config)))
    drawn_colours = {mcolors.to_hex(h.get_color()) for h in legend.values()}
    for leader, label in keys.items():  # a configuration drawn only where the flow stopped: its colour, named
        colour = config_colour(leader)
        if label not in legend and mcolors.to_hex(colour) not in drawn_colours:
            drawn_colours.add(mcolors.to_hex(colour))
            legend[label] = tag(plt.Line2D([], [], linewidth=4, color=colour, label=label), leader, None, "band")
    handles = list(legend.values())
    statuses = [s for s in UNSETTLED_MARKERS if s in set(points.status)]
    if statuses:
        handles.append(plt.Line2D([], [], linestyle="", marker=UNSETTLED_MARKERS[statuses[0]], color="0.15",
                                  label=" / ".join(f"{UNSETTLED_MARKERS[s].replace('>', '▶').replace('d', '◆')} {s}"
                                                   for s in statuses) + ": where the flow stopped"))  # fmt: skip
    fig.legend(handles=handles, loc="outside lower center", ncols=2)
    fig.suptitle("Where each KL configuration's training ends, against the optimum of J_β (toy model)")
    n = caption.number
    caption.add(TOY_CAPTION.format(length=n(section["length"]), threshold=n(section["reward"]["threshold"]),
                                   betas=", ".join(n(b) for b in section["betas"])),
                _monte_carlo_text(mc, families, section, caption),
                caption.design(" ".join(f"{line}." for line in listed if "at KL" not in line))
                + " " + " ".join(f"{line}." for line in listed if "at KL" in line))  # fmt: skip
    return fig, finish(fig, caption)


def _monte_carlo_text(mc: pd.DataFrame, families: list[str], section: dict, caption: Caption) -> str:
    """The caption's paragraph on the Monte Carlo panels: who was trained, how, and what the panels compare."""
    if mc.empty:
        return "No Monte Carlo runs: the end points are the exact analysis only."
    n = caption.number
    rows = _check_rows(mc)
    trained = "; ".join(f"{family} policy: " + ", ".join(kl_label(c) for f, c in rows if f == family)
                        for family in dict.fromkeys(f for f, _ in rows))  # fmt: skip
    return (MONTE_CARLO_CAPTION.format(seeds=n(section["monte_carlo"]["seeds"]),
                                       mc_betas=", ".join(n(b) for b in section["monte_carlo"]["betas"]),
                                       trained=trained, where=_monte_carlo_where(mc, families)))  # fmt: skip


MONTE_CARLO_CAPTION = """\
Bottom, the Monte Carlo check: {seeds} seeds of each configuration trained on-policy through the trainer's loss, a \
panel per β ∈ {{{mc_betas}}}, a row per configuration trained ({trained}){where}. In each row, the exact end \
point's KL (its marker, above; ▶ ◆ where the exact flow stopped: no end point) and the seeds' (×, below: their mean \
± 1 se), on a log scale; the marker and the cross take the colour the legend gives the \
configuration (configurations whose exact end points coincide share one). The toy's claims judge the seeds' task \
reward against the exact end points' (the verdicts: the toy's claims table, among the report's claims); the \
off-policy runs are in the Monte Carlo table, not drawn."""


def _draw_monte_carlo_check(subfig, points: pd.DataFrame, mc: pd.DataFrame, leaders: dict) -> None:
    """A panel per β of the on-policy Monte Carlo runs, a row per (family, configuration) trained: the exact end
    point's KL (the marker of the configuration's group, or ▶ / ◆ where the flow stopped) above the seeds' mean ± se
    (a cross: no placement's marker, no estimator's fill), so that neither hides the other."""
    betas = sorted(set(mc.beta))
    rows = _check_rows(mc)
    one_family = len({family for family, _ in rows}) == 1
    axes = subfig.subplots(1, len(betas), sharex=True, sharey=True, squeeze=False)[0]
    for ax, beta in zip(axes, betas, strict=True):
        for y, (family, config) in enumerate(rows):
            leader = leaders[family].get(config, config)
            exact = points[(points.family == family) & (points.config == config) & np.isclose(points.beta, beta)]
            runs = mc[(mc.family == family) & (mc.config == config) & np.isclose(mc.beta, beta)]
            if len(exact):
                end = exact.iloc[0]
                style = ({**style_of(leader), "linestyle": ""} if end.status == "stable" else
                         {"color": config_colour(leader), "linestyle": "", "marker": UNSETTLED_MARKERS[end.status]})
                tag(ax.plot([end.kl], [y - CHECK_OFFSET], markersize=5.5, label="_exact", **style)[0], leader, None,
                    "marker" if end.status == "stable" else "band")  # fmt: skip
            for run in runs.itertuples():
                bars = ax.errorbar([run.mc_kl], [y + CHECK_OFFSET], xerr=[run.mc_kl_se], fmt="x",
                                   ms=5.5, mew=1.0, capsize=1.5, lw=0.8, color=config_colour(leader),
                                   label="_monte_carlo")  # fmt: skip
                tag(bars.lines[0], leader, None, "band")
        ax.set_xscale("log")
        ax.set_yticks(range(len(rows)), [kl_label(c) if one_family else f"{f}: {kl_label(c)}" for f, c in rows])
        ax.set_ylim(len(rows) - 0.5, -0.5)
        ax.set_title(f"β {beta:g}")
        ax.set_xlabel("KL(π ‖ π_ref) at the end")
        ax.grid(alpha=0.3, axis="x", which="major")
    _decades_axis(axes[0], [*points[points.family.isin(mc.family)].kl, *mc.mc_kl,
                            *(mc.mc_kl + mc.mc_kl_se)])  # fmt: skip
    family = rows[0][0] if one_family else "each"
    subfig.suptitle(f"Monte Carlo check, {family} policy: the exact end point (marker, above) and the seeds' "
                    "(×, mean ± se, below)", fontsize=8)  # fmt: skip


def _check_rows(mc: pd.DataFrame) -> list[tuple[str, str]]:
    """The Monte Carlo panels' rows, (family, configuration): by family, then placement and estimator, no KL last."""
    trained = list(dict.fromkeys(mc[["family", "config"]].itertuples(index=False, name=None)))
    order = {c: i for i, c in enumerate(_table_order([c for _, c in trained]))}
    families = list(dict.fromkeys(f for f, _ in trained))
    return sorted(trained, key=lambda fc: (families.index(fc[0]), fc[1] == NO_KL, order[fc[1]]))


def _decades_axis(ax, values) -> None:
    """A log x range around ``values`` with a labelled power of ten in it at least (only decades labelled: a range
    under a decade would label its minor ticks over one another)."""
    values = [v for v in values if v > 0 and np.isfinite(v)]
    low, high = min(values) / 1.6, max(values) * 1.6
    if np.floor(np.log10(high)) - np.ceil(np.log10(low)) < 1:
        low, high = 10 ** np.floor(np.log10(low)), 10 ** np.ceil(np.log10(high))
    ax.set_xlim(low, high)
    ax.xaxis.set_minor_formatter(ticker.NullFormatter())


CHECK_OFFSET = 0.24  # rows: the exact end point this far above the row's line, the seeds' cross as far below


def _monte_carlo_where(mc: pd.DataFrame, families: list[str]) -> str:
    """'; the parametric family has no Monte Carlo runs' where a family has none."""
    without = [f for f in families if f not in set(mc.family)]
    if not without:
        return ""
    return f"; the {' and '.join(without)} {'family has' if len(without) == 1 else 'families have'} no Monte Carlo runs"


def _draw_unsettled(ax, points: pd.DataFrame, family: str, caption: Caption, leaders: dict) -> list[str]:
    """The end points without a stable fixed point, one marker per place, status and configuration, in the colour of
    the configuration drawn for its group of coinciding ones (``leaders``); where several configurations stop at one
    place (within SAME_PLACE in KL and reward), their markers stand one above another, centred on the place, so that
    each stays whole; returns the caption's lines naming who ends there, at the drawn place."""
    unsettled = points[points.status != "stable"]
    lines = []
    for at in _places(unsettled):
        configs = list(dict.fromkeys(leaders.get(c, c) for c in at.config))
        status = at.status.iloc[0]
        shape = UNSETTLED_MARKERS.get(status, "x")
        markers = []
        for i, c in enumerate(configs):
            first = at[at.config.map(lambda n: leaders.get(n, n)) == c].iloc[0]
            shift = transforms.offset_copy(ax.transData, fig=ax.figure, x=0,
                                           y=(i - (len(configs) - 1) / 2) * -STACK_STEP, units="points")  # fmt: skip
            drawn = ax.plot(first.kl, first.reward, linestyle="", marker=shape, color=config_colour(c), zorder=5,
                            markeredgecolor="white", markeredgewidth=0.4, markersize=6.5, transform=shift,
                            clip_on=False, label="_unsettled")[0]  # fmt: skip
            markers.append(tag(drawn, c, None, "band"))
        marker = markers[0]
        who = {}
        for config, rows in at.groupby("config", sort=False):
            who.setdefault(kl_label(config), []).extend(f"{b:g}" for b in rows.beta)
        names = caption.design("; ".join(f"{name} (β {', '.join(b)})" for name, b in who.items()))
        lines.append(f"{family} policy, {status}, at KL {caption.value(marker, 0, '.2f', axis='x')} and task reward "
                     f"{caption.value(marker, 0, '.2f')}: {names}")  # fmt: skip
    return lines


SAME_PLACE = 0.01  # end points within this in KL and in reward share a place (one marker each, stacked)
STACK_STEP = 7.5  # points between stacked markers


def _places(unsettled: pd.DataFrame) -> list[pd.DataFrame]:
    """The unsettled end points by status and place: each joins the first place of its status within SAME_PLACE."""
    places: list[list[int]] = []
    for i, row in unsettled.iterrows():
        for place in places:
            first = unsettled.loc[place[0]]
            if (first.status == row.status and abs(first.kl - row.kl) <= SAME_PLACE
                    and abs(first.reward - row.reward) <= SAME_PLACE):  # fmt: skip
                place.append(i)
                break
        else:
            places.append([i])
    return [unsettled.loc[place] for place in places]


TOY_CAPTION = """\
**Where each KL configuration's training ends (toy model of §3.3).** A KL penalty is meant to make training optimise \
J_β = E_π[R] − β·KL(π‖π_ref), with R = 1 for a sequence of T = {length} tokens with at least {threshold} ones. Top, \
exact (float64), a row per policy family. Left: grey, the exact optimum of J_β over β (the reward–KL frontier) in \
each policy family, its points at β ∈ {{{betas}}} marked with their β; dotted, the unconstrained optimum π*_β, which \
the parametric family cannot reach. Each configuration's exact end point at each β, joined over β (β falls from \
lower left to upper right), in falling sizes (K1's filled markers largest, beneath; K3's hollow ones smallest, on \
top: end points that lie on one another each show a rim); ▶ no fixed point: the update drifts to the boundary and is \
drawn where the followed flow stopped; ◆ still moving when stopped; each in its configuration's colour; where \
several configurations stop at one place, their markers stand one above another, centred on it (the stack's height \
is not a difference in reward). Right: the gap J_β(optimum) − J_β(end) of the stable end points off the optimum, in \
the same falling sizes."""


def _draw_end_points(ax, names: list[str], group: pd.DataFrame, markersize: float = 5.0, rank: int = 0):
    """A group's exact stable end points over β, joined (``markersize``; ``rank``: drawn over the groups before);
    returns its legend handle (None without one)."""
    style = {**style_of(names[0]), "linestyle": "-"}
    stable = group[group.status == "stable"].sort_values("beta")
    if stable.empty:
        return None
    handle = ax.plot(stable.kl, stable.reward, linewidth=0.9, markersize=markersize, zorder=3 + 0.01 * rank,
                     label=_group_label(names), **style)[0]  # fmt: skip
    return tag(handle, names[0], None, "marker")


def _draw_toy_frontier(ax, fronts: pd.DataFrame, points: pd.DataFrame, family: str) -> None:
    """The family's frontier, through its end points on the optimum, its β grid marked; beside the parametric one,
    the tabular family's (the unconstrained π*_β)."""
    on_optimum = points[(points.status == "stable") & (points.objective_gap < GAP_FLOOR)]
    front = pd.concat([fronts[fronts.family == family][["kl", "reward"]], on_optimum[["kl", "reward"]]]).sort_values(
        "kl"
    )
    ax.plot(front.kl, front.reward, color="black", lw=2.2, alpha=0.25, label="_frontier", zorder=1, gid="reference")
    for beta, at in on_optimum.groupby("beta"):
        ax.annotate(f"β {beta:g}", (at.kl.iloc[0], at.reward.iloc[0]), xytext=(-4, 6), textcoords="offset points",
                    ha="right", fontsize=7, color="0.35")  # fmt: skip
    if family == "parametric" and (fronts.family == "tabular").any():
        tabular = fronts[fronts.family == "tabular"].sort_values("kl")
        ax.plot(tabular.kl, tabular.reward, color="black", lw=0.8, ls=":", alpha=0.5, label="_unconstrained")


def _draw_toy_gaps(ax, groups: list[tuple[list[str], pd.DataFrame]], family: str) -> list[str]:
    """J_β(optimum) − J_β(end) against β for the stable end points off the optimum, a line per group of coinciding
    configurations; returns the caption's lines on the groups on the optimum at every β and on those without a fixed
    point (nothing to draw)."""
    on_optimum = []
    # falling sizes as in the end points' panel (filled largest, beneath): gaps within a marker's height each show
    ordered = sorted(groups, key=lambda g: ESTIMATOR_ORDER.get(g[0][0][:2], 3))
    for rank, (names, group) in enumerate(ordered):
        stable = group[group.status == "stable"]
        off = stable[stable.objective_gap >= GAP_FLOOR].sort_values("beta")
        if len(off):
            size = 7.0 - 3.5 * rank / max(len(ordered) - 1, 1)
            tag(ax.plot(off.beta, off.objective_gap, markersize=size, linewidth=0.9, label="_gap",
                        zorder=3 + 0.01 * rank, **{**style_of(names[0]), "linestyle": "-"})[0],
                names[0], None, "marker")  # fmt: skip
        if len(stable) and (stable.objective_gap < GAP_FLOOR).all():
            on_optimum.append(_group_label(names))
    ax.set_xscale("log")
    ax.set_yscale("log")
    betas = sorted({b for _, group in groups for b in group.beta})
    ax.set_xticks(betas, [f"{b:g}" for b in betas])
    ax.xaxis.set_minor_formatter(ticker.NullFormatter())
    ax.set_xlabel("β")
    ax.set_ylabel("J_β(optimum) − J_β(end point)")
    ax.set_title(f"{family} policy: distance to the optimum")
    ax.grid(alpha=0.3, which="major")
    return [f"{family} policy, on the optimum (gap below {GAP_FLOOR:g}) at every β: {', '.join(on_optimum) or 'none'}"]


__all__ = ["draw_fig01", "fig01_toy_bias_variance", "draw_toy_fixed_points", "toy_fixed_points_figure", "NO_KL",
           "marker_of"]  # fmt: skip
