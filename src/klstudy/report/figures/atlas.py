"""The atlas's figure: how strongly each setup practitioners run regularises, β_eff/β, from the atlas's tables
(analysis/atlas.py; figures/atlas.csv and figures/atlas_length.csv, whose columns it reads).

Per policy family: the frameworks' presets, a row each, in one panel per β asked for (β_eff/β across); then the grid
of normalisations × G for each KL configuration (normalisation and G on the x axis, the one encoding for the rest:
colour = KL configuration, marker = placement, fill = estimator, line style = β) and the length sweep against T
(β_eff/β up). β_eff/β is on one log scale in every panel, 1 (dashed) where a setup regularises as strongly as asked.
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
    # Per family two rows: the presets (one panel per β asked for, a row per preset: their names need the page's
    # width), then the grid and the length sweep.
    fig = plt.figure(figsize=(FULL_WIDTH, min(9.0, 4.0 * len(families) + 1.0)), layout="constrained")
    rows_of = fig.subfigures(2 * len(families), 1)
    caption = Caption()
    quoted, missing, preset_axes, curve_axes = [], [], [], []
    for row, family in enumerate(families):
        mine = points[points.family == family]
        top, bottom = rows_of[2 * row], rows_of[2 * row + 1]
        beta_axes = list(top.subplots(1, len(betas), sharey=True, squeeze=False)[0])
        quoted += _presets_panels(beta_axes, mine[_is_preset(mine)], presets, family, betas, caption)
        top.suptitle(f"{family} policy: framework presets", x=0.01, ha="left", fontsize=8)
        grid_ax, length_ax = bottom.subplots(1, 2, width_ratios=[2.3, 1])
        _grid_panel(grid_ax, mine[~_is_preset(mine)], family)
        grid_ax.set_ylabel(f"{family} policy\nβ_eff / β (log)")
        _length_panel(length_ax, length[length.family == family], family)
        missing += _not_drawn(mine, presets, beta_min, family)
        preset_axes += beta_axes
        curve_axes += [grid_ax, length_ax]
    _share_log_axis(curve_axes, preset_axes)
    configs = list(
        dict.fromkeys(tag_config(line) for ax in [*preset_axes, *curve_axes] for line in ax.get_lines()
                      if tag_config(line))  # fmt: skip
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
        "dashed line) means weaker regularisation than asked for, above it stronger. Two rows per policy family. "
        "Top of each family: each framework's preset (its KL term, normalisation and G, as its code ships them), "
        f"one row per preset, its β_eff/β at each β asked for (one panel per β), at T = {length_t} tokens, the "
        "row's name in its KL configuration's colour; presets that end at the same points at every β share a row, "
        "named together; a row without a point at a β has no β_eff there (listed below). Below, left: the grid, "
        "each KL configuration with each advantage normalisation (RLOO, "
        "whose expected update does not depend on G; the group mean, Dr. GRPO; ÷ the group's standard deviation, "
        "GRPO; ÷ the batch's, TRL's batch option) and G, one line per KL configuration and β over G. Right: β_eff/β "
        f"against the answer's length T, the reward at least ceil({fraction} × T) ones (the settings the config's "
        "atlas length section lists, named in the panel).",
        ("Drawn values, " + "; ".join(quoted) + ".") if quoted else "",
        caption.design("Not drawn (no β_eff): " + "; ".join(missing) + ".") if missing else "",
    )
    return fig, finish(fig, caption)


def _presets_panels(axes: list, rows: pd.DataFrame, presets: dict | None, family: str, betas: list,
                    caption: Caption) -> list[str]:  # fmt: skip
    """One panel per β asked for (``axes``), a row per group of coinciding presets (named on the left, in its KL
    configuration's colour; the largest β_eff/β at the largest β at the top), its β_eff/β a marker of its KL
    configuration; returns the caption's quotes of the values drawn at the largest β."""
    groups = [(names, _drawable(group)) for names, group in
              coinciding_groups(rows, "setting", ["beta", "beta_eff_ratio"], equal_nan=True)]  # fmt: skip
    groups = sorted([g for g in groups if len(g[1])], key=lambda g: -g[1].sort_values("beta").beta_eff_ratio.iloc[-1])
    labels = [" = ".join(setting_name(rows[rows.setting == n].iloc[0].to_dict(), presets) for n in names)
              for names, _ in groups]  # fmt: skip
    quotes = []
    for ax, beta in zip(axes, betas, strict=True):
        for y, ((_, group), label) in enumerate(zip(groups, labels, strict=True)):
            at = group[group.beta == beta]
            if at.empty:
                continue
            config = at.iloc[0].config
            line = ax.plot(at.beta_eff_ratio, [y], linestyle="", markersize=4.5, color=config_colour(config),
                           **marker_of(config))[0]  # fmt: skip
            tag(line, config, None, "marker")
            if beta == max(betas):
                name = caption.design(label)  # the preset's name and version, the config's
                quotes.append(f"{family}, {name} at β = {beta:g}: {caption.value(line, -1, '.2f', axis='x')}")
        ax.axvline(1, color="0.5", linestyle=(0, (3, 2)), linewidth=0.8, gid="reference one", zorder=1)  # under
        ax.set_gid("dots against a reference")  # each point read against 1, not against the others (the tests' rule)
        ax.set_title(f"β{NBSP}={NBSP}{beta:g}", fontsize=8)
        ax.grid(alpha=0.3)  # across: a guide along each preset's row
        ax.set_ylim(len(groups) - 0.5, -0.5)
        ax.set_xlabel("β_eff / β")
    axes[0].set_yticks(range(len(groups)), labels, fontsize=7)
    for tick, (_, group) in zip(axes[0].get_yticklabels(), groups, strict=True):
        tick.set_color(config_colour(group.iloc[0].config))
    for ax in axes[1:]:
        ax.tick_params(axis="y", left=False)
    return quotes


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


def _share_log_axis(curve_axes: list, preset_axes: list) -> None:
    """β_eff/β on a log scale, from the smallest to the largest value drawn, 1 inside: one y axis for the grid and
    length panels, one x axis for the presets' (their rows are presets; their narrower range keeps presets that
    differ by a tenth apart)."""
    for axes, axis in ((curve_axes, "y"), (preset_axes, "x")):
        values = [v for ax in axes for line in ax.get_lines()
                  for v in np.asarray(line.get_ydata() if axis == "y" else line.get_xdata(), dtype=float)]  # fmt: skip
        values = [v for v in values if np.isfinite(v) and v > 0]
        low, high = min([*values, 1.0]) / 1.3, max([*values, 1.0]) * 1.3
        for ax in axes:
            getattr(ax, f"set_{axis}scale")("log")
            getattr(ax, f"set_{axis}lim")(low, high)
            scale = ax.yaxis if axis == "y" else ax.xaxis
            scale.set_major_locator(ticker.LogLocator(subs=(1, 2, 5)))
            scale.set_major_formatter(ticker.FormatStrFormatter("%g"))
            scale.set_minor_formatter(ticker.NullFormatter())


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
