"""The atlas's figure: how strongly each setup practitioners run regularises, β_eff/β, from the atlas's tables
(analysis/atlas.py; figures/atlas.csv and figures/atlas_length.csv, whose columns it reads).

One row per policy family, three panels: the frameworks' presets against β; the grid of normalisations × G for each
KL configuration (normalisation and G on the x axis, the one encoding for the rest: colour = KL configuration,
marker = placement, fill = estimator, line style = β); and the length sweep against T. The y axis is β_eff/β on a log
scale, 1 (dashed) where a setup regularises as strongly as asked.
"""

from __future__ import annotations

import re

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib import ticker

from klstudy.frameworks import presets_of  # not analysis.atlas, which imports torch
from klstudy.kl import NO_KL
from klstudy.report.figures.captions import Caption, finish
from klstudy.report.figures.encoding import (
    FULL_WIDTH,
    beta_linestyle,
    coinciding_groups,
    config_colour,
    key_handles,
    kl_label,
    marker_of,
    save,
    style_of,
    tag,
)

# A normalisation as a reader names it (kl.ADVANTAGES), short enough for an axis.
NORMALISATION_NAMES = {"rloo": "RLOO", "grpo": "− group mean (Dr. GRPO)", "group_std": "÷ group std (GRPO)",
                       "batch_std": "÷ batch std (TRL batch)", "loo_std": "RLOO ÷ the others' std (NeMo-RL)",
                       "none": "no baseline", "group_whiten": "− group mean, whitened (OpenRLHF REINFORCE++-baseline)",
                       "whiten": "whitened, no baseline (OpenRLHF REINFORCE++)"}  # fmt: skip
AXIS_NAMES = {"rloo": "RLOO", "grpo": "− mean", "group_std": "÷ group std", "batch_std": "÷ batch std",
              "loo_std": "LOO ÷ std", "none": "none", "group_whiten": "− mean, whitened",
              "whiten": "whitened"}  # fmt: skip
NBSP = "\u00a0"  # "G = 8" and "β = 1" are not broken across a wrapped line


def _short_version(version: str) -> str:
    """'0.7.0' → '0.7', '1.10.0–1.16.0' → '1.10–1.16', '0.3.0 + PR 1445' → '0.3 + PR 1445'; 'main' → '' (a version
    that is not a number is left to the table)."""
    if not version[:1].isdigit():
        return ""
    short = lambda part: ".".join(part.split(".")[:2]) if re.fullmatch(r"[\d.]+", part) else part  # noqa: E731
    return "".join(short(part) for part in re.split(r"(–| \+ )", version))


def preset_name(name: str, preset: dict | None = None) -> str:
    """A preset by its framework, version and variant: 'TRL 1.10–1.16', 'verl 0.7 KL loss', 'OpenRLHF 0.11 GRPO',
    'slime default' (the key's words after the framework and its version name the variant)."""
    if not preset:
        return name
    framework = preset["framework"].lower()  # the key's first words name the framework ('nemo-rl-0.7')
    kind = name[len(framework) + 1 :] if name.lower().startswith(framework + "-") else name.split("-", 1)[-1]
    kind = re.sub(r"^[\d.]+(-|$)", "", kind)  # the key's version ('0.7-kl-loss'): the preset's own is written
    spelt = {"reinforce": "REINFORCE++", **{w: w.upper() for w in ("grpo", "rloo", "ppo", "kl", "k1", "k2", "k3")}}
    words = [spelt.get(w, w) for w in kind.split("-") if w]
    return " ".join(part for part in (preset["framework"], _short_version(str(preset.get("version", ""))), *words)
                    if part)  # fmt: skip


def setting_name(setting: dict | pd.Series, presets: dict | None = None) -> str:
    """'K3 in loss, ÷ group std (GRPO), G = 8'; RLOO's expected update does not depend on G: 'K3 in loss, RLOO'; a
    preset: its framework's name (preset_name)."""
    preset = setting.get("preset")
    if isinstance(preset, str) and preset:
        return preset_name(preset, (presets or {}).get(preset))
    words = f"{kl_label(setting['config'])}, {NORMALISATION_NAMES.get(setting['normalisation'])}"
    return words if setting["normalisation"] == "rloo" else f"{words}, G{NBSP}={NBSP}{int(setting['group'])}"


def _is_preset(rows: pd.DataFrame) -> pd.Series:
    return rows.get("preset", pd.Series(np.nan, index=rows.index)).fillna("").astype(str) != ""


def _drawable(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows with a β_eff/β to draw: a stable fixed point whose KL lies among the optima's."""
    return rows[(rows.status == "stable") & rows.beta_eff_ratio.notna()]


def draw(points: pd.DataFrame, length: pd.DataFrame, png, section: dict | None = None, *, beta_min: float) -> str:
    """figure(), written to ``png`` (a PDF beside it); returns the caption (the table's Markdown, figures/atlas.md,
    which has this figure's name, opens with it)."""
    fig, text = figure(points, length, section, beta_min=beta_min)
    save(fig, png)
    return text


def figure(points: pd.DataFrame, length: pd.DataFrame, section: dict | None = None, *, beta_min: float):
    """One row per policy family: the presets against β, the grid (normalisation × G) per KL configuration and β,
    the length sweep against T; β_eff/β on a shared log axis. ``section``: config toy.atlas (its presets name the
    frameworks). ``beta_min``: the smallest β at which the effective β is searched. Returns (figure, caption)."""
    presets = presets_of(section or {})  # config names the shipped ones (frameworks.py), plus extra_presets
    # The grid's β only (the presets' own β and the field's range are the summary table's, docs/atlas.md): a β axis
    # of ten categories does not print at this size.
    betas = (section or {}).get("betas") or sorted(points.beta.unique())
    points = points[points.beta.isin(betas)]
    length_betas = ((section or {}).get("length") or {}).get("betas")
    length = length[length.beta.isin(length_betas)] if length_betas else length
    families = list(dict.fromkeys(points.family))
    # Per family two rows: the presets across the page (their names need its width), then the grid and the length.
    fig = plt.figure(figsize=(FULL_WIDTH, min(9.0, 4.0 * len(families) + 1.0)), layout="constrained")
    mosaic = [row for f in range(len(families)) for row in ([f"p{f}", f"p{f}"], [f"g{f}", f"l{f}"])]
    panels = fig.subplot_mosaic(mosaic, width_ratios=[2.3, 1])
    axes = np.array([[panels[f"p{f}"], panels[f"g{f}"], panels[f"l{f}"]] for f in range(len(families))])
    caption = Caption()
    quoted, missing = [], []
    for row, family in enumerate(families):
        mine = points[points.family == family]
        quoted += _presets_panel(axes[row, 0], mine[_is_preset(mine)], presets, family, caption)
        _grid_panel(axes[row, 1], mine[~_is_preset(mine)], family)
        _length_panel(axes[row, 2], length[length.family == family], family)
        missing += _not_drawn(mine, presets, beta_min, family)
    _share_log_axis(axes)
    for ax in axes[:, 0]:
        _label_ends(ax, *ax._atlas_ends)
    configs = list(
        dict.fromkeys(tag_config(line) for ax in axes.ravel() for line in ax.get_lines() if tag_config(line))
    )  # the configurations drawn
    grid_betas = sorted(points.beta.unique())
    handles = key_handles(configs, [b for b in grid_betas])
    handles.append(plt.Line2D([], [], color="0.5", linestyle=(0, (3, 2)), linewidth=0.8,
                              label="β_eff/β = 1: as strong as asked"))  # fmt: skip
    fig.legend(handles=handles, loc="outside lower center", ncols=3)
    fig.suptitle("How strongly each setup regularises: β_eff/β (toy model, exact)")
    length_t = caption.number(int(points["T"].iloc[0]))
    fraction = caption.number(((section or {}).get("length") or {}).get("threshold_fraction", 0.75))
    caption.add(
        "**How strongly each setup practitioners run regularises (toy model of §3.3, exact, float64).** β_eff is the β "
        "whose optimum of J_β has the same KL to the reference as the setup's end point; β_eff/β below 1 (under the "
        "dashed line) means weaker regularisation than asked for, above it stronger. One row per policy family. "
        f"Left: each framework's preset (its KL term, normalisation and G, as its code ships them) against the β "
        f"asked for, at T = {length_t} tokens, named at its line's end; presets that end at the same points are one "
        "line, named together. Centre: the grid, each KL configuration with each advantage normalisation (RLOO, "
        "whose expected update does not depend on G; the group mean, Dr. GRPO; ÷ the group's standard deviation, "
        "GRPO; ÷ the batch's, TRL's batch option) and G, one line per KL configuration and β over G. Right: β_eff/β "
        f"against the answer's length T, the reward at least ceil({fraction} × T) ones (the settings the config's "
        "atlas length section lists, named in the panel).",
        ("Drawn values, " + "; ".join(quoted) + ".") if quoted else "",
        caption.design("Not drawn (no β_eff): " + "; ".join(missing) + ".") if missing else "",
    )
    return fig, finish(fig, caption)


def _presets_panel(ax, rows: pd.DataFrame, presets: dict | None, family: str, caption: Caption) -> list[str]:
    """Each group of coinciding presets against β (categories), named at its right end; returns the caption's
    quotes of the values drawn at the largest β."""
    betas = sorted(rows.beta.unique())
    position = {b: i for i, b in enumerate(betas)}
    quotes, ends = [], []
    for names, group in coinciding_groups(rows, "setting", ["beta", "beta_eff_ratio"], equal_nan=True):
        drawable = _drawable(group).sort_values("beta")
        if drawable.empty:
            continue
        first = group.iloc[0]
        label = " =\n".join(setting_name(rows[rows.setting == n].iloc[0].to_dict(), presets) for n in names)
        line = ax.plot([position[b] for b in drawable.beta], drawable.beta_eff_ratio, linestyle="-", linewidth=1,
                       markersize=4, color=config_colour(first.config), **marker_of(first.config))[0]  # fmt: skip
        tag(line, first.config, None, "marker")
        ends.append((line, label))
        if drawable.beta.max() == max(betas):
            quotes.append(
                f"{family}, {label.replace(chr(10), ' ')} at β = {max(betas):g}: {caption.value(line, -1, '.2f')}"
            )
    ax.set_xticks(range(len(betas)), [f"{b:g}" for b in betas])
    ax.set_xlim(-0.4, len(betas) + 2.6)  # room for the names right of the lines
    ax.spines[["right", "top"]].set_visible(False)
    ax._atlas_ends = (ends, len(betas) - 0.6)  # named once the shared y axis is set
    ax.set_xlabel("β asked for")
    ax.set_ylabel(f"{family} policy\nβ_eff / β (log)")
    ax.set_title("framework presets", loc="left")
    ax.axhline(1, color="0.5", linestyle=(0, (3, 2)), linewidth=0.8, gid="reference one")
    ax.grid(alpha=0.3, axis="y")
    return quotes


JOIN = {"arrowstyle": "-", "color": "0.7", "linewidth": 0.5, "shrinkA": 0, "shrinkB": 2}  # a name to its line's end


def _label_ends(ax, ends: list, right: float) -> None:
    """Each line's name right of its last point, at x = ``right``, spread apart vertically (a line of 7 pt each, on
    the log axis) so that none overlap; a thin grey line joins a name moved from its point."""
    if not ends:
        return
    low, high = (np.log10(v) for v in ax.get_ylim())
    height = ax.get_window_extent().height / ax.figure.dpi * 72  # points
    gap = (high - low) * 9.5 / max(height, 1.0)
    placed = sorted(((float(np.log10(line.get_ydata()[-1])), line, label) for line, label in ends), key=lambda e: e[0])
    last, heights = -np.inf, []
    for y, _line, label in placed:
        lines = label.count("\n") + 1
        heights.append(max(y, last + gap * (lines + 1) / 2))
        last = heights[-1] + gap * (lines - 1) / 2
    down = min(max(0.0, last + gap / 2 - high), max(0.0, heights[0] - gap - low))  # the stack kept inside the panel
    for (_y, line, label), y_text in zip(placed, heights, strict=True):
        y_text -= down
        end = (line.get_xdata()[-1], line.get_ydata()[-1])
        ax.annotate(label, end, xytext=(right, 10**y_text), textcoords="data", ha="left", va="center", fontsize=7,
                    color=line.get_color(), arrowprops=JOIN)  # fmt: skip


def _grid_panel(ax, rows: pd.DataFrame, family: str) -> None:
    """The grid: x the normalisations, each with its G (RLOO once: its expected update does not depend on G), one
    line per KL configuration and β over G (colour: configuration; line style: β)."""
    categories = []  # (normalisation, G or None)
    for normalisation in dict.fromkeys(rows.normalisation):
        mine = rows[rows.normalisation == normalisation]
        per_g = mine.pivot_table(index="group", columns=["config", "beta"], values="beta_eff_ratio", dropna=False)
        same = len(per_g) <= 1 or np.allclose(per_g.to_numpy(), per_g.to_numpy()[:1], equal_nan=True)
        groups = [None] if same else sorted(mine.group.unique())
        categories += [(normalisation, g) for g in groups]
    x_of = {c: i for i, c in enumerate(categories)}
    for (config, beta), group in rows.groupby(["config", "beta"], sort=False):
        for normalisation in dict.fromkeys(group.normalisation):
            part = _drawable(group[group.normalisation == normalisation]).sort_values("group")
            if (normalisation, None) in x_of:
                part = part.head(1)
                xs = [x_of[(normalisation, None)]] * len(part)
            else:
                xs = [x_of[(normalisation, g)] for g in part.group]
            if len(part):
                tag(ax.plot(xs, part.beta_eff_ratio, markersize=3.5, linewidth=1, label="_grid",
                            **style_of(config, beta))[0], config, beta)  # fmt: skip
    labels = [f"{g}" if g else "any" for _, g in categories]
    ax.set_xticks(range(len(categories)), labels)
    ax.set_xlim(-0.6, len(categories) - 0.4)
    for normalisation in dict.fromkeys(n for n, _ in categories):
        xs = [x_of[c] for c in categories if c[0] == normalisation]
        ax.text(np.mean(xs), 1.01, AXIS_NAMES.get(normalisation, normalisation), transform=ax.get_xaxis_transform(),
                ha="center", va="bottom", fontsize=7)  # fmt: skip
        if xs[0] > 0:
            ax.axvline(xs[0] - 0.5, color="0.75", linewidth=0.6)
    ax.axhline(1, color="0.5", linestyle=(0, (3, 2)), linewidth=0.8, gid="reference one")
    ax.set_xlabel("G, completions per prompt, by advantage normalisation")
    ax.grid(alpha=0.3, axis="y")


def _length_panel(ax, rows: pd.DataFrame, family: str) -> None:
    """β_eff/β against T for the length sweep's settings (colour: configuration; line style: β), each named by its
    normalisation and G in the panel."""
    names = []
    for (_, beta), group in rows.groupby(["setting", "beta"], sort=False):
        drawable = _drawable(group).sort_values("T")
        if drawable.empty:
            continue
        first = group.iloc[0]
        tag(ax.plot(drawable["T"], drawable.beta_eff_ratio, markersize=3, linewidth=1, label="_length",
                    **style_of(first.config, beta))[0], first.config, beta)  # fmt: skip
        name = NORMALISATION_NAMES.get(first.normalisation, first.normalisation)
        names.append(name if first.normalisation == "rloo" else f"{name}, G{NBSP}={NBSP}{int(first.group)}")
    if names:
        ax.text(0.03, 0.03, "\n".join(dict.fromkeys(names)), transform=ax.transAxes, ha="left", va="bottom", fontsize=7,
                color="0.25")  # fmt: skip
    else:
        ax.text(0.5, 0.5, f"no length sweep in the {family} policy", transform=ax.transAxes, ha="center", fontsize=7)
    ax.axhline(1, color="0.5", linestyle=(0, (3, 2)), linewidth=0.8, gid="reference one")
    ax.set_xlabel("T, tokens per answer")
    ax.set_title("against T")
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True, nbins=6))
    ax.grid(alpha=0.3, axis="y")


def _share_log_axis(axes) -> None:
    """One log y axis for every panel: from the smallest to the largest β_eff/β drawn, 1 inside."""
    values = [y for ax in axes.ravel() for line in ax.get_lines() for y in np.asarray(line.get_ydata(), dtype=float)
              if np.isfinite(y) and y > 0]  # fmt: skip
    low, high = min([*values, 1.0]) / 1.3, max([*values, 1.0]) * 1.3
    for ax in axes.ravel():
        ax.set_yscale("log")
        ax.set_ylim(low, high)
        ax.yaxis.set_major_locator(ticker.LogLocator(subs=(1, 2, 5)))
        ax.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())


def _not_drawn(rows: pd.DataFrame, presets: dict | None, beta_min: float, family: str) -> list[str]:
    """The caption's list of the presets and grid settings without a β_eff, by reason and β, the G of one setting
    named together ('K3 in loss, ÷ batch std (TRL batch), G = 2, 4, 8')."""
    missing = rows[~rows.index.isin(_drawable(rows).index)].copy()
    if missing.empty:
        return []
    missing["why"] = [_why(r, beta_min) for r in missing.itertuples()]
    out = []
    for (why, beta), group in missing.groupby(["why", "beta"], sort=False):
        names: dict[str, list[int]] = {}
        for _, r in group.iterrows():
            if _is_preset(group.loc[[r.name]]).iloc[0] or r.normalisation == "rloo":
                names.setdefault(setting_name(r.to_dict(), presets), [])
            else:
                base = setting_name(r.to_dict() | {"normalisation": r.normalisation}, presets).rsplit(", G", 1)[0]
                names.setdefault(base, []).append(int(r.group))
        words = [f"{n}, G = {', '.join(map(str, sorted(set(g))))}" if g else n for n, g in names.items()]
        out.append(f"{family} policy, β = {beta:g}, {why}: {'; '.join(words)}")
    return out


def tag_config(line) -> str | None:
    """The configuration a tagged line is drawn for (None: not tagged)."""
    gid = line.get_gid() or ""
    return gid.split("kl=")[1].split(";")[0] if gid.startswith("style kl=") else None


def _why(row, beta_min: float) -> str:
    if row.status != "stable":
        return str(row.status)
    if getattr(row, "beyond_curve", False):  # the family's own curve stops where its optimum's KL stops growing
        return f"more KL than the optimum at β = {getattr(row, 'curve_beta_min', beta_min):.2g}"
    return "its KL outside the optima's"


__all__ = ["figure", "draw", "preset_name", "setting_name", "NORMALISATION_NAMES", "NO_KL", "beta_linestyle"]
