"""The length sweep's figure, beside the atlas's (``draw`` writes both): β_eff/β against the answer's length T
(figures/atlas_length.csv), a panel per policy family and advantage normalisation, drawn with the atlas's helpers
(atlas.py)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib import ticker

from klstudy.frameworks import presets_of
from klstudy.report.figures.atlas import (
    AXIS_NAMES,
    BOUND_MARKER,
    BOUND_TEXT,
    LENGTH_FIGURE,
    NBSP,
    NEAR_RATIO,
    _bounds,
    _draw_arrows,
    _draw_overlapping,
    _drawable,
    _drawn_configs,
    _is_preset,
    _reference_one,
    _share_log_axis,
    _why,
    figure,
    preset_name,
)
from klstudy.report.figures.captions import Caption, finish
from klstudy.report.figures.encoding import FULL_WIDTH, config_colour, key_handles, kl_label, new_figure, save


def draw(points: pd.DataFrame, length: pd.DataFrame, png, section: dict | None = None, *, beta_min: float) -> str:
    """figure(), written to ``png`` (a PDF beside it), and length_figure() beside it (LENGTH_FIGURE: its PNG, PDF and
    caption); returns the atlas's caption (the table's Markdown, figures/atlas.md, which has this figure's name, opens
    with it)."""
    fig, text = figure(points, section, beta_min=beta_min)
    save(fig, png)
    length_fig, length_text = length_figure(length, section)
    save(length_fig, Path(png).with_name(f"{LENGTH_FIGURE}.png"), length_text)
    return text


def length_figure(length: pd.DataFrame, section: dict | None = None):
    """β_eff/β against the answer's length T for the length sweep's settings (config toy.atlas.length), a panel per
    family and advantage normalisation (settings of one KL configuration, which share a colour, fall in different
    panels), a line per setting and β (line style: β), each setting named in its panel in its configuration's
    colour. Returns (figure, caption)."""
    presets = presets_of(section or {})
    options = (section or {}).get("length") or {}
    rows = length[length.beta.isin(options["betas"])] if options.get("betas") else length
    families = [f for f in options.get("families") or (section or {}).get("families") or [] if f in set(rows.family)]
    panels = [(family, normalisation) for family in families or dict.fromkeys(rows.family)
              for normalisation in dict.fromkeys(rows[rows.family == family].normalisation)]  # fmt: skip
    fig, axes = new_figure(FULL_WIDTH, 2.6, 1, max(len(panels), 1), sharey=True)
    axes = list(axes[0])
    caption = Caption()
    quoted, missing, notes = [], [], []
    for ax, (family, normalisation) in zip(axes, panels, strict=False):
        mine = rows[(rows.family == family) & (rows.normalisation == normalisation)]
        title = f"{family}, {AXIS_NAMES.get(normalisation, normalisation)}"
        panel_quotes, panel_notes = _length_panel(ax, mine, presets, title, caption)
        quoted, notes = quoted + panel_quotes, notes + panel_notes
        missing += _length_not_drawn(mine, presets, title)
    if not panels:
        axes[0].text(0.5, 0.5, "no length sweep in this run", transform=axes[0].transAxes, ha="center", fontsize=7)
    axes[0].set_ylabel("β_eff / β (log)")
    _share_log_axis(axes, "y", room_below=3.0)
    handles = key_handles(_drawn_configs(axes), sorted(rows.beta.unique()))
    handles.append(plt.Line2D([], [], color="0.5", linestyle=(0, (3, 2)), linewidth=0.8,
                              label="β_eff/β = 1: as strong as asked"))  # fmt: skip
    bounded = len(_bounds(rows)) > 0
    if bounded:
        handles.append(plt.Line2D([], [], color="0.3", linestyle="", marker=BOUND_MARKER, markersize=7,
                                  label="no β_eff: below the bar (↓)"))  # fmt: skip
    fig.legend(handles=handles, loc="outside lower center", ncols=3)
    fig.suptitle("How strongly each setup regularises against the answer's length T (toy model, exact)")
    fraction = caption.number(options.get("threshold_fraction", 0.75))
    caption.add(
        "**β_eff/β against the answer's length T (toy model of §3.3, exact, float64).** The reward is at least "
        f"ceil({fraction} × T) ones in T tokens; β_eff is the β whose optimum of J_β has the same KL to the reference "
        "as the setup's end point (below the dashed 1: weaker regularisation than asked for). A panel per policy "
        "family and advantage normalisation, a line per setting (its name in the panel, in its KL configuration's "
        "colour) and β asked for (line style); the settings are those the run's configuration lists for the length "
        "sweep. The atlas's figure beside it shows the settings at one T across normalisations, G and presets.",
        (f"Lines on one another or within a marker's height ({NEAR_RATIO - 1:.0%}), drawn in falling widths so that "
         "each shows: "
         + "; ".join(notes) + ".") if notes else "",
        ("Drawn values, first and last T: " + "; ".join(quoted) + ".") if quoted else "",
        caption.design("Not drawn (no β_eff; a gap in its line): " + "; ".join(missing) + ".") if missing else "",
        f"↓: {BOUND_TEXT}" if bounded else "",
    )
    return fig, finish(fig, caption)


def _length_not_drawn(rows: pd.DataFrame, presets: dict | None, title: str) -> list[str]:
    """The length sweep's points without a β_eff, a setting and β at a time, with why: 'tabular, ÷ group std, TRL
    1.10–1.16, G = 8 at β = 0.3: T = 4, 5, 6, 7, 8 (still moving)'."""
    out = []
    for (_, beta), group in rows.groupby(["setting", "beta"], sort=False):
        missing = group[~group.index.isin(_drawable(group).index)].sort_values("T")
        if missing.empty:
            continue
        first = group.iloc[0]
        name = _length_setting_name(first, group, presets)
        whys = {}
        for row in missing.itertuples():
            whys.setdefault(_why(row, 0.0), []).append(str(int(row.T)))
        out.append(f"{title}, {name} at β = {beta:g}: "
                   + "; ".join(f"T = {', '.join(ts)} ({why})" for why, ts in whys.items()))  # fmt: skip
    return out


def _length_setting_name(first, group: pd.DataFrame, presets: dict | None) -> str:
    """A length sweep's setting in words: its preset's name or its KL configuration's, with G unless RLOO."""
    name = (preset_name(first.preset, (presets or {}).get(first.preset)) if _is_preset(group.head(1)).iloc[0]
            else kl_label(first.config))  # fmt: skip
    return name if first.normalisation == "rloo" else f"{name}, G{NBSP}={NBSP}{int(first.group)}"


def _length_panel(ax, rows: pd.DataFrame, presets: dict | None, title: str, caption: Caption) -> tuple[list, list]:
    """One family and normalisation of the length sweep: a line per setting and β (broken at a T without β_eff),
    the settings named at the bottom in their colours; lines that overlap drawn in falling widths. Returns the
    caption's quotes of each line's first and last point, and its notes on the lines that overlap."""
    names, quotes, series = {}, [], []
    for (_, beta), group in rows.groupby(["setting", "beta"], sort=False):
        drawable = _drawable(group)
        if drawable.empty:
            continue
        every_t = group.sort_values("T")
        first = group.iloc[0]
        name = _length_setting_name(first, group, presets)
        names[name] = first.config
        ys = every_t.beta_eff_ratio.where(every_t.index.isin(drawable.index))  # a gap where there is no β_eff
        series.append({"config": first.config, "beta": beta, "name": name, "xs": list(every_t["T"]),
                       "ys": list(ys)})  # fmt: skip
    notes = []
    # a point per T, small markers; lines that run together over two T or more overlap there
    for group in _draw_overlapping(ax, series, 2.5, "_length", growth=2.5, at_least=2):
        for one in group:
            line, t = one["line"], [int(v) for v in one["line"].get_xdata()]
            ends = np.flatnonzero(np.isfinite(np.asarray(one["ys"], dtype=float)))[[0, -1]]
            quotes.append(f"{title}, {caption.design(one['name'])} at β = {one['beta']:g}: "
                          + ", ".join(f"{caption.value(line, int(i))} at T = {caption.number(t[i])}" for i in ends))
        if len(group) > 1:
            named = [f"{caption.design(o['name'])} at β = {o['beta']:g}" for o in group]
            notes.append(f"{title}: " + " and ".join(named))
    _draw_bounds(ax, rows)
    for i, (name, config) in enumerate(reversed(names.items())):  # at the bottom, under the lines, 8 pt apart
        ax.annotate(name, (0.03, 0), xycoords="axes fraction", xytext=(0, 2 + 8 * i), textcoords="offset points",
                    ha="left", va="bottom", fontsize=7, color=config_colour(config))  # fmt: skip
    _reference_one(ax)
    ax.set_xlabel("T, tokens per answer")
    ax.set_title(title, fontsize=8)
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True, nbins=5))
    ax.grid(alpha=0.3, axis="y")
    return quotes, notes


def _draw_bounds(ax, rows: pd.DataFrame) -> None:
    """Each bound of ``_bounds`` as an arrow at the bound, where its line has a gap (a gap alone hid the strongest
    weakening of the sweep, below the axis)."""
    _draw_arrows(ax, [(row.T, row.bound, row.config) for row in _bounds(rows).itertuples()])


__all__ = ["draw", "length_figure"]
