"""The atlas's figures (analysis/atlas.py's tables): β_eff/β on log axes, 1 dashed; no β_eff: an arrow at a bound."""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib import patheffects, ticker
from matplotlib.transforms import ScaledTranslation

from klstudy.frameworks import OFFERS, PRESETS, presets_of  # not analysis.atlas, which imports torch
from klstudy.report.figures import encoding
from klstudy.report.figures.captions import Caption, as_math, finish, table
from klstudy.report.figures.encoding import config_colour, key_handles, kl_label, marker_of, save, style_of, tag
from klstudy.report.figures.toy import coinciding

AXIS_NAMES = {"rloo": "RLOO", "mean": "− mean", "group_std": "÷ group std", "batch_std": "÷ batch std",
              "loo_std": "LOO ÷ std", "none": "none", "group_whiten": "− mean, whitened",
              "whiten": "whitened"}  # fmt: skip
GRID_FIGURE, LENGTH_FIGURE = "atlas_grid", "atlas_length"  # beside the atlas's presets (each PNG and caption, .md)
BOUND_MARKERS = {"x": r"$\leftarrow$", "y": r"$\downarrow$"}  # no β_eff: below this bound
CLAMP_MARKER = r"$\dagger$"  # beside an end point where the preset's clamp binds (the table's †, analysis/atlas.py)
MARK_WORDS = {**dict.fromkeys(BOUND_MARKERS.values(), "no β_eff: below the bound"), **{m: w for w, m in
              encoding.UNSETTLED_MARKERS.items()}, "x": "no β_eff, no bound",
              CLAMP_MARKER: "† clamp binds: end point depends on the path"}  # fmt: skip
# The length caption's two values of a line: β_eff/β where its first and last values are, not at T = 1 and the last T.
ENDS_OF_A_LINE = ("at the first T with a value", "at the last T with a value")


def preset_name(name: str, preset: dict | None = None) -> str:
    """A preset by its framework, version and variant: 'TRL 1.10–1.16', 'verl 0.7 KL loss' (no identifiers)."""
    if not preset:
        return name
    framework = preset["framework"].lower()
    kind = name[len(framework) + 1 :] if name.lower().startswith(framework + "-") else name.split("-", 1)[-1]
    kind = re.sub(r"^[\d.]+(-|$)", "", kind)
    spelt = {"reinforce": "REINFORCE++", **{w: w.upper() for w in ("grpo", "rloo", "ppo", "kl", "k1", "k2", "k3")}}
    version = str(preset.get("version", "")).split(" + ")[0]
    version = "".join(".".join(p.split(".")[:2]) if p[:1].isdigit() else p for p in re.split(r"(–)", version))
    words = [spelt.get(w, w) for w in kind.split("-") if w]
    return " ".join(p for p in (preset["framework"], version if version[:1].isdigit() else "", *words) if p)


def setting_name(setting, presets: dict | None = None) -> str:
    """A preset by its framework ('TRL 1.10–1.16'); a grid's setting by its KL configuration (G: the axis')."""
    preset = setting.get("preset")
    return preset_name(preset, (presets or {}).get(preset)) if isinstance(preset, str) and preset else kl_label(
        setting["config"])


def _bounds(rows: pd.DataFrame) -> pd.Series:
    """curve_beta_min/β where a stable end point has no β_eff, its KL beyond the family's optima, and that bound says
    something (below 1: weaker than asked by at least this much); NaN elsewhere."""
    beyond = rows.get("beyond_curve", pd.Series(False, index=rows.index)).fillna(False).astype(bool)
    bound = rows.curve_beta_min / rows.beta
    return bound.where((rows.status == "stable") & rows.beta_eff_ratio.isna() & beyond & (bound < 1))


def _draw_point(ax, at: float, ratio: float, bound: float, config: str, axis: str, taken: dict | None = None):
    """β_eff/β as the configuration's marker, or the bound it lies below as an arrow (``taken``: the arrows drawn at
    each place, the next one beside them); None where neither."""
    value, marker = (ratio, marker_of(config)) if np.isfinite(ratio) else (bound, {"marker": BOUND_MARKERS[axis]})
    if not np.isfinite(value):
        return None
    xy, k = (([value], [at]) if axis == "x" else ([at], [value])), 0
    if taken is not None and not np.isfinite(ratio):
        k = taken[(round(at), "arrow")] = taken.get((round(at), "arrow"), -1) + 1
    line = ax.plot(*xy, linestyle="", markersize=5 if np.isfinite(ratio) else 8, color=config_colour(config),
                   label="_point" if np.isfinite(ratio) else "_bound",
                   transform=ax.transData + ScaledTranslation(0.06 * k, 0, ax.figure.dpi_scale_trans),
                   **marker)[0]  # fmt: skip
    return tag(line, config, None, "marker") if np.isfinite(ratio) else line


def _stops(ax, places, rows: pd.DataFrame, config: str, taken: dict, axis: str = "y") -> None:
    """Where a setup has neither a β_eff nor an arrow, why, in its colour on the panel's edge (bottom; on the presets'
    rows, left), once, stacked inwards past the others ``taken`` at its place: ▶ drifts, ✚ still moving, × stable
    but no β_eff found and no bound under 1 (the table has each)."""
    missing = rows.beta_eff_ratio.isna().to_numpy() & rows.bound.isna().to_numpy()
    marks = zip(np.asarray(places)[missing], rows.status[missing], strict=True)
    for at, status in {(round(a), s): (a, s) for a, s in marks}.values():  # one a place and status
        k = taken[(round(at), "stop")] = taken.get((round(at), "stop"), -1) + 1
        xy, edge = ((at, 0.03 + 0.05 * k), ax.get_xaxis_transform()) if axis == "y" else (
            (0.03 + 0.05 * k, at), ax.get_yaxis_transform())
        tag(ax.plot(*xy, transform=edge, linestyle="", markersize=4, color=config_colour(config), label="_stop",
                    marker=encoding.UNSETTLED_MARKERS.get(status, "x"), clip_on=False)[0], config, None, "band")


def _mark_handles(fig) -> list:
    """The legend's entries for the marks besides β_eff (MARK_WORDS) that ``fig`` draws, each as drawn."""
    drawn = {ln.get_marker() for ax in fig.axes for ln in ax.lines if ln.get_label() in ("_bound", "_stop", "_clamp")}
    return [plt.Line2D([], [], color="0.3", ls="", marker=m, label=w) for m, w in MARK_WORDS.items() if m in drawn]


def _log_axis(axes: list, axis: str, room: float = 0.0) -> None:
    """β_eff/β on one log scale for these panels, 1 and all drawn inside, the bottom ``room`` (a fraction) left."""
    values = [1.0] + [v for ax in axes for ln in ax.lines if ln.get_label() not in ("_stop", "_clamp")  # on the edge
                      for v in np.asarray(ln.get_ydata() if axis == "y" else ln.get_xdata(), dtype=float)
                      if np.isfinite(v) and v > 0]  # fmt: skip
    high, lowest = max(values) * 1.6, min(values)
    low = min(lowest / 1.6, lowest / (high / lowest) ** (room / (1 - room)))
    subs = (1, 2, 5)[:: 1 + (axis == "x")] if high / low < (100 if room else 1000) else (1,)  # else decades
    for ax in axes:
        getattr(ax, f"set_{axis}scale")("log")
        getattr(ax, f"set_{axis}lim")(low, high)
        (scale := getattr(ax, f"{axis}axis")).set_major_locator(ticker.LogLocator(subs=subs))
        scale.set_major_formatter(ticker.FormatStrFormatter("%g"))
        scale.set_minor_formatter(ticker.NullFormatter())
        (ax.axvline if axis == "x" else ax.axhline)(1, color="0.5", linestyle=(0, (3, 2)), linewidth=0.8,
                                                    gid="reference one", zorder=1)  # fmt: skip
    if room:  # the edge's marks on a grey band, named by a minor tick (no grid line), no tick of β_eff/β inside it
        edge = low * (high / low) ** (room - 0.03)
        major, minor = ([t for t in tick.tick_values(low, high) if edge <= t <= high] for tick in (
            scale.get_major_locator(), scale.get_minor_locator()))  # fmt: skip
        scale.set_ticks(major)
        scale.set_ticks([*minor, np.sqrt(low * edge)], ["" for _ in minor] + [as_math("no β_eff")], minor=True)
        for ax in axes:
            ax.axhspan(low, edge, color="0.9", zorder=0, linewidth=0)


def _selected(points: pd.DataFrame, section: dict | None):
    """The points at the section's β (default: every β), which of them are presets', the β and the families."""
    betas = (section or {}).get("betas") or sorted(points.beta.unique())
    points = points[points.beta.isin(betas)]
    preset = points.get("preset", pd.Series(np.nan, index=points.index)).fillna("").astype(str) != ""
    return points, preset, betas, list(dict.fromkeys(points.family))


def figure(points: pd.DataFrame, section: dict | None = None):
    """Per policy family, a panel per β of the frameworks' presets, a row per group that ends alike at every β (the
    grid of KL configurations: grid_figure). Returns (figure, caption)."""
    presets, (points, preset, betas, families) = presets_of(section or {}), _selected(points, section)
    fig, axes = plt.subplots(len(families), len(betas), figsize=(encoding.FULL_WIDTH, 6.8), squeeze=False,
                             sharey="row", layout="constrained")  # fmt: skip
    caption, quoted = Caption(), []
    for row, family in zip(axes, families, strict=True):
        _presets_row(row, points[preset & (points.family == family)], presets, betas, family, caption, quoted)
    _log_axis(list(axes.ravel()), "x")
    encoding.legend_below(fig, key_handles(encoding.drawn_configs(fig), []) + _mark_handles(fig), 3)
    fig.suptitle("How strongly each framework's preset regularises: β_eff/β (toy model, exact)")
    caption.add(
        "**How strongly each framework's KL setup regularises, as its code ships it (toy model of §3.3, exact).** "
        f"β_eff/β per policy family at T = {caption.number(int(points['T'].iloc[0]))} tokens, a row per group of "
        "presets that end alike, a panel per β; below the dashed 1 a setup regularises more weakly than asked.",
        table(["family, preset", "β_eff/β at the largest β"], quoted) if quoted else "")  # fmt: skip
    return fig, finish(fig, caption)


def grid_figure(points: pd.DataFrame, section: dict | None = None):
    """Per policy family, a panel per β (two a row): each KL configuration of toy.atlas.configs over the advantage
    normalisations and G. Returns (figure, caption)."""
    points, preset, betas, families = _selected(points, section)
    pairs, n = -(-len(betas) // 2), len(betas)
    fig = plt.figure(figsize=(encoding.FULL_WIDTH, encoding.MAX_HEIGHT), layout="constrained")
    spec = fig.add_gridspec(pairs * len(families), min(n, 2))
    for f, i in [(f, i) for f in range(len(families)) for i in range(0, n, 2)]:  # a row's β on one scale of its own
        row = _panels(fig, [spec[f * pairs + i // 2, k] for k in range(len(betas[i : i + 2]))])
        grid = points[~preset & (points.family == families[f])]
        _log_axis(row, "y", _grid_row(row, grid, families[f], betas[i : i + 2]))
    encoding.legend_below(fig, key_handles(drawn := encoding.drawn_configs(fig), []) + _mark_handles(fig), 3)
    fig.suptitle(f"How strongly {len(drawn)} KL configurations regularise: β_eff/β over normalisation and G "
                 "(toy model, exact)")  # fmt: skip
    shipped = {p.kl for p in PRESETS.values()} | {c for offers in OFFERS.values() for c, _ in offers}
    named = [(c in shipped, kl_label(c)) for c in drawn]
    (caption := Caption()).add(
        f"**How strongly {len(drawn)} KL configurations (config toy.atlas.configs) regularise under four advantage "
        "normalisations and group sizes G (toy model of §3.3, exact)**: of them, presets or offers use (" + ("; ".join(
        n for ship, n in named if ship) or "none") + ")" + "".join(f", not {n}" for ship, n in named if not ship) + "; "
        "the presets' other settings: the presets' figure; every configuration: the toy's fixed points. β_eff/β per "
        "policy family and β, a line per configuration, broken between normalisations (RLOO's does not depend on G); "
        "below the dashed 1 weaker than asked.")  # fmt: skip
    return fig, finish(fig, caption)


def _panels(fig, cells) -> list:
    """A panel in each cell, all on one y axis, its tick labels on the left column's only."""
    axes = [fig.add_subplot(cell, sharey=fig.axes[-1] if i else None) for i, cell in enumerate(cells)]
    return [ax.tick_params(which="both", labelleft=ax.get_subplotspec().colspan.start == 0) or ax for ax in axes]


def _presets_row(axes, rows: pd.DataFrame, presets: dict, betas: list, family: str, caption: Caption, quoted: list):
    """A panel per β, a row per group of presets that end alike at every β, named on the left in its KL
    configuration's colour; adds to ``quoted`` the values at the largest β."""
    rows = rows.assign(bound=_bounds(rows), state=pd.factorize(rows.status)[0],  # alike: in status and clamp too
                       clamped=rows.get("clamp_binds", pd.Series(0.0, index=rows.index)).fillna(0) > 0)
    ends = {s: g.sort_values("beta")[["beta_eff_ratio", "bound", "state", "clamped"]].to_numpy(float).ravel()
            for s, g in rows.groupby("setting", sort=False)}  # fmt: skip
    groups = coinciding(ends)
    names = [" = ".join(dict.fromkeys(setting_name(rows[rows.setting == s].iloc[0], presets) for s in g))
             for g in groups]
    for ax, beta in zip(axes, betas, strict=True):
        for y, group in enumerate(groups):
            at = rows[(rows.setting == group[0]) & (rows.beta == beta)]
            _stops(ax, [y] * len(at), at, rows[rows.setting == group[0]].config.iloc[0], {}, "x")
            clamped = len(at) and at.clamped.iloc[0]
            at = at[["beta_eff_ratio", "bound", "config"]].to_numpy()[0] if len(at) else (np.nan, np.nan, "")
            line = _draw_point(ax, y, float(at[0]), float(at[1]), at[2], "x")
            if clamped:  # the dagger up right of the point, arrow or stop (at 0.03 of the panel: _stops)
                xy, place = ((line.get_xdata()[0], y), ax.transData) if line else ((0.03, y), ax.get_yaxis_transform())
                ax.plot(*xy, ls="", ms=6, marker=CLAMP_MARKER, color=config_colour(at[2]), label="_clamp",
                        clip_on=False, transform=place + ScaledTranslation(5 / 72, 4 / 72, ax.figure.dpi_scale_trans))
            if line is not None and beta == betas[-1] and np.isfinite(float(at[0])):
                quoted.append([f"{family}, {caption.design(names[y])}", caption.value(line, -1, ".2f", axis="x")])
        ax.set_gid("dots against a reference")  # each point read against 1 (the tests' rule)
        ax.set(title=f"β = {beta:g}", ylim=(len(groups) - 0.5, -0.5), xlabel="β_eff / β")
        ax.grid(alpha=0.3)
    axes[0].set_yticks(range(len(groups)), names, fontsize=7)
    axes[0].set(ylabel=f"{family} policy: presets")
    axes[0].tick_params(axis="y", pad=13, length=0)  # black names (legible printed), each after its configuration's
    beside = axes[0].get_yaxis_transform() + ScaledTranslation(-8 / 72, 0, axes[0].figure.dpi_scale_trans)  # marker
    for y, group in enumerate(groups):
        config = rows[rows.setting == group[0]].config.iloc[0]
        tag(axes[0].plot(0, y, transform=beside, ls="", ms=5, clip_on=False, label="_swatch", color=config_colour(
            config), **marker_of(config))[0], config, None, "marker")  # fmt: skip


def _places(rows: pd.DataFrame) -> dict:
    """The x of each (normalisation, G): G's that end alike for every configuration and β (RLOO's) share one."""
    places, x = {}, 0
    for normalisation, mine in rows.groupby("normalisation", sort=False):
        groups = coinciding({g: at.sort_values(["config", "beta"]).beta_eff_ratio.to_numpy(dtype=float)
                             for g, at in mine.groupby("group", sort=True)})  # fmt: skip
        places.update({(normalisation, g): x + i for i, same in enumerate(groups) for g in same})
        x += len(groups)
    return places


def _grid_row(axes, rows: pd.DataFrame, family: str, betas: list) -> float:
    """A panel per β: x each normalisation (named on top) and G, a line per configuration broken between them, each
    at its own offset within every cell (none hidden). Returns the fraction of a panel its bottom edge's marks take."""
    rows = rows.assign(bound=_bounds(rows)).sort_values(["normalisation", "group"], kind="stable")
    places, taken, names = _places(rows), {ax: {} for ax in axes}, list(dict.fromkeys(rows.normalisation))
    breaks = [max(x for (n, _), x in places.items() if n == name) + 0.5 for name in names][:-1]  # normalisations'
    shape = {c: marker_of(c)["marker"] for c in dict.fromkeys(rows.config)}
    stride = max(map(count := [*shape.values()].count, shape.values()))  # the commonest shape's spread apart:
    configs = sorted(shape, key=lambda c: (-count(shape[c]), shape[c]))  # equal □ at every stride-th offset
    configs = [c for i in range(stride) for c in configs[i::stride]]
    for ax, beta in zip(axes, betas, strict=True):
        [ax.axvline(x, color="0.75", linewidth=0.6, zorder=0) for x in breaks]  # a rule where the lines break
        for config, at in rows[rows.beta == beta].groupby("config", sort=False):
            xs = [places[c] for c in zip(at.normalisation, at.group, strict=True)]
            line = pd.Series(at.beta_eff_ratio.to_numpy(), index=xs).groupby(level=0).first().reindex(
                sorted({*places.values(), *breaks}))  # fmt: skip
            shift = encoding.dodge(configs.index(config), len(configs), 0.95)  # one place in every cell
            tag(ax.plot(line.index + shift, line, ms=3.5, lw=0.7, path_effects=[patheffects.withStroke(
                linewidth=1.5, foreground="white")], **style_of(config))[0], config, None, "marker")  # fmt: skip
            for x, bound in zip(xs, at.bound, strict=True):
                _draw_point(ax, x + shift, np.nan, bound, config, "y", taken[ax])
            _stops(ax, np.array(xs) + shift, at, config, taken[ax])
        ticks = sorted(set(places.values()))
        ax.set_xticks(ticks, [",".join(str(g) for (_, g), x in places.items() if x == t) if sum(
            v == t for v in places.values()) == 1 else "" for t in ticks])  # fmt: skip
        (top := ax.secondary_xaxis("top")).tick_params(length=0)
        top.set_xticks([np.mean([x for (n, _), x in places.items() if n == name]) for name in names],
                       [AXIS_NAMES.get(n, n) for n in names], fontsize=7)  # fmt: skip
        ax.set(title=f"{family} policy, β = {beta:g}", xlabel="G")
        ax.grid(alpha=0.3, axis="y")
    axes[0].set_ylabel("β_eff / β")
    return 0.05 * (2 + max([n for t in taken.values() for (_, kind), n in t.items() if kind == "stop"] + [0]))


def length_figure(length: pd.DataFrame, section: dict | None = None):
    """β_eff/β against T, a panel per family and normalisation, a line per setting and β, each shifted a little in T;
    where a line has no value, why, on the bottom edge (_stops)."""
    presets, options = presets_of(section or {}), (section or {}).get("length") or {}
    rows = length[length.beta.isin(options["betas"])] if options.get("betas") else length
    panels = list(dict.fromkeys(zip(rows.family, rows.normalisation, strict=True)))
    fig, axes = plt.subplots(1, max(len(panels), 1), figsize=(encoding.FULL_WIDTH, 3.6), squeeze=False, sharey=True,
                             layout="constrained")  # fmt: skip
    caption, quoted, alike, shown = Caption(), [], {}, {}  # alike: {configuration: {"0.3 and 1": axes}}
    for ax, (family, normalisation) in zip(axes[0], panels, strict=False):
        taken = {}
        mine = rows[(rows.family == family) & (rows.normalisation == normalisation)].assign(bound=lambda r: _bounds(r))
        for _, at in mine.groupby("setting", sort=False):  # a setting's β whose lines coincide (drawn as one)
            betas = {b: g.sort_values("T").beta_eff_ratio.to_numpy(dtype=float) for b, g in at.groupby("beta")}
            shown.setdefault(config := at.config.iloc[0], {})[ax] = None
            for same in [g for g in coinciding(betas) if len(g) > 1 and np.isfinite(betas[g[0]]).any()]:
                alike.setdefault(config, {}).setdefault(" and ".join(f"{b:g}" for b in same), {})[ax] = None
        for k, ((_, beta), group) in enumerate(lines := list(mine.groupby(["setting", "beta"], sort=False))):
            group = group.sort_values("T").assign(T=lambda g, k=k: g["T"] + encoding.dodge(k, len(lines), 0.4))
            first = group.iloc[0]
            name = setting_name(first, presets)
            line = tag(ax.plot(group["T"], group.beta_eff_ratio, markersize=3, label="_setting",
                               **style_of(first.config, beta))[0], first.config, beta)  # fmt: skip
            for t, bound in zip(group["T"], group.bound, strict=True):
                _draw_point(ax, t, np.nan, bound, first.config, "y", taken)
            _stops(ax, group["T"], group, first.config, taken)
            finite = np.flatnonzero(np.isfinite(group.beta_eff_ratio.to_numpy(dtype=float)))
            if len(finite):
                quoted.append([f"{family}, {AXIS_NAMES.get(normalisation, normalisation)}", caption.design(name),
                               caption.number(beta), caption.value(line, int(finite[0])),
                               caption.value(line, int(finite[-1]))])  # fmt: skip
        ax.set(title=f"{family}, {AXIS_NAMES.get(normalisation, normalisation)}", xlabel="T, tokens per answer")
        ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True, nbins=5))
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].set_ylabel("β_eff / β")
    _log_axis(list(axes[0]), "y")
    where = lambda c, on: "" if on.keys() == shown[c].keys() else ": " + "; ".join(ax.get_title() for ax in on)
    said = {c: "".join(f"\n(β = {b} coincide{where(c, on)})" for b, on in alike.get(c, {}).items()) for c in shown}
    handles = [plt.Line2D([], [], color=config_colour(c), label=kl_label(c) + said[c], **marker_of(c))
               for c in shown] + key_handles([], sorted(rows.beta.unique())) + _mark_handles(fig)  # fmt: skip
    encoding.legend_below(fig, handles, -(-len(handles) // 3))  # three rows
    fig.suptitle("How strongly each setup regularises against the answer's length T (toy model, exact)")
    fraction = caption.number(options.get("threshold_fraction", 0.75))
    caption.add("**β_eff/β against the answer's length T (toy model of §3.3, exact).** The reward is at least "
        f"ceil({fraction} × T) ones in T tokens; below the dashed 1 a setup regularises more weakly than asked. A "
        "panel per policy family and advantage normalisation, a line per setting (colour: its KL configuration; the "
        "table names it) and β (line style); where two β of a setting coincide, the legend says so.",
        table(["panel", "setting", "β", *ENDS_OF_A_LINE], quoted) if quoted else "")  # fmt: skip
    return fig, finish(fig, caption)


def draw(points: pd.DataFrame, length: pd.DataFrame, png, section: dict | None = None) -> str:
    """figure() to ``png``, grid_figure() and length_figure() beside it, with PDFs (and their captions); returns the
    atlas's caption (its Markdown has its table)."""
    save(Path(png).with_name(f"{GRID_FIGURE}.png"), *grid_figure(points, section))
    save(Path(png).with_name(f"{LENGTH_FIGURE}.png"), *length_figure(length, section))
    fig, text = figure(points, section)
    save(png, fig)
    return text
