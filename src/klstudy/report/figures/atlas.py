"""The atlas's figure: how strongly each setup practitioners run regularises (β_eff against β), and against the
answer's length, from the atlas's tables (analysis/atlas.py).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib import ticker

from klstudy.report.figures.encoding import (
    GAP_FLOOR,
    beta_linestyle,
    caption,
    coinciding_groups,
    config_colour,
    figure_legend,
    footnote,
    kl_label,
    save,
    say_why_empty,
)

FIGURE_SETTINGS = ("k3-loss/rloo/G2", "k3-loss/grpo/G8", "k3-loss/group_std/G2", "k3-loss/group_std/G8",
                   "k3-loss/batch_std/G8", "k3-loss-ratio/rloo/G2", "k1-reward/rloo/G2")  # fmt: skip

# A setting as a reader names it: its KL configuration (kl_label), its normalisation in words, its G.
NORMALISATION_NAMES = {"rloo": "RLOO", "grpo": "− group mean (Dr. GRPO)", "group_std": "÷ group std (GRPO)",
                       "batch_std": "÷ batch std (TRL batch)",
                       "loo_std": "RLOO ÷ the others' std (NeMo-RL)", "none": "no baseline",
                       "group_whiten": "− group mean, whitened (OpenRLHF REINFORCE++-baseline)",
                       "whiten": "whitened, no baseline (OpenRLHF REINFORCE++)"}  # fmt: skip
# Without colour: the marker's shape says the normalisation, its fill G (colour is the KL configuration's, as in
# every figure; line style is β's, as in every figure).
NORMALISATION_MARKERS = {"rloo": "o", "grpo": "D", "group_std": "s", "batch_std": "^", "loo_std": "v", "none": "P",
                         "group_whiten": "X", "whiten": "*"}  # fmt: skip
GROUP_FILLS = {2: "full", 4: "bottom", 5: "right", 8: "none", 16: "left"}
NBSP = "\u00a0"  # "G = 8" and "β = 1" are not broken across a legend's wrapped lines


def preset_name(name: str, preset: dict | None = None) -> str:
    """A preset by its framework: 'TRL 1.16 GRPO', 'verl GRPO', 'slime default' (a version that is not a number,
    such as 'main', is left to the caption)."""
    if not preset:
        return name
    version = str(preset.get("version", ""))
    number = ".".join(version.split(".")[:2]) if version[:1].isdigit() else ""
    framework = preset["framework"].lower()  # the key's first words name the framework ('nemo-rl-grpo')
    kind = name[len(framework) + 1 :] if name.lower().startswith(framework + "-") else name.split("-", 1)[-1]
    kind = kind.upper() if kind in ("grpo", "rloo", "ppo") else kind.replace("-", " ")
    return " ".join(part for part in (preset["framework"], number, kind) if part)


def setting_name(setting: dict | pd.Series, presets: dict | None = None) -> str:
    """'K3 in loss, ÷ group std (GRPO), G = 8'; RLOO's expected update does not depend on G: 'K3 in loss, RLOO'; a
    preset: its framework's name (preset_name)."""
    preset = setting.get("preset")
    if isinstance(preset, str) and preset:
        return preset_name(preset, (presets or {}).get(preset))
    words = f"{kl_label(setting['config'])}, {NORMALISATION_NAMES.get(setting['normalisation'])}"
    return words if setting["normalisation"] == "rloo" else f"{words}, G{NBSP}={NBSP}{int(setting['group'])}"


def setting_style(setting: dict | pd.Series, beta: float | None = None) -> dict:
    """ax.plot's keywords: the configuration's colour, the normalisation's marker shape, G's fill, β's line style."""
    fill = GROUP_FILLS.get(int(setting["group"]), "full") if setting["normalisation"] != "rloo" else "full"
    marker = {"marker": NORMALISATION_MARKERS[setting["normalisation"]], "fillstyle": fill,
              "markerfacecoloralt": "white",
              **({"markerfacecolor": "white", "fillstyle": "full"} if fill == "none" else {})}  # fmt: skip
    line = beta_linestyle(beta) if beta is not None else "-"
    return {"color": config_colour(setting["config"]), "linestyle": line, **marker}


def _groups(rows: pd.DataFrame, columns: list[str]) -> list[tuple[list[str], pd.DataFrame]]:
    """Settings whose rows (status and ``columns``) coincide, grouped: [(settings, rows)], each group drawn once."""
    return coinciding_groups(rows, "setting", [c for c in columns if c in rows], equal_nan=True)


def _group_label(names: list[str], rows: pd.DataFrame, presets: dict | None) -> str:
    first = rows.drop_duplicates("setting").set_index("setting")
    return " = ".join(setting_name(first.loc[n].to_dict() | {"setting": n}, presets) for n in names)


def draw(points: pd.DataFrame, length: pd.DataFrame, png, section: dict | None = None, *, beta_min: float) -> str:
    """figure(), written to ``png`` (a PDF beside it); returns the caption (the table's Markdown, figures/atlas.md,
    which has this figure's name, opens with it)."""
    fig, text = figure(points, length, section, beta_min=beta_min)
    save(fig, png)
    return text


def figure(points: pd.DataFrame, length: pd.DataFrame, section: dict | None = None, *, beta_min: float):
    """One column per policy family. Top: β_eff against the β asked for (the presets and FIGURE_SETTINGS; dashed:
    β_eff = β). Middle: the gap J_β(optimum) − J_β(end) of the length sweep against T; bottom: its β_eff/β. Settings
    whose points coincide are drawn once and named together; settings without a stable fixed point, or without a
    β_eff, are left out of a line and listed in the caption. One legend, outside. ``section``: config toy.atlas (its
    presets name the frameworks; its length.threshold_fraction, the caption). ``beta_min``: the smallest β at which the
    effective β is searched (the analysis's EFFECTIVE_BETA_RANGE). Returns (figure, caption)."""
    presets = (section or {}).get("presets")

    families = list(dict.fromkeys(points.family))
    fig, axes = plt.subplots(3, len(families), figsize=(6.2 * len(families), 11.5), squeeze=False,
                             layout="constrained")  # fmt: skip
    preset_ids = set(points.preset.dropna()) - {""}
    shown = points[points.setting.isin(FIGURE_SETTINGS) | points.setting.isin(preset_ids)]
    listed = []
    for col, family in enumerate(families):
        mine = shown[shown.family == family]
        ax = axes[0, col]
        for names, rows in _groups(mine, ["beta", "kl", "beta_eff"]):
            drawn = rows[(rows.status == "stable")].dropna(subset=["beta_eff"]).sort_values("beta")
            name = _group_label(names, mine, presets)
            if len(drawn):
                ax.plot(drawn.beta, drawn.beta_eff, ms=6, lw=1, label=name, **setting_style(rows.iloc[0]))
            missing = rows[~rows.beta.isin(drawn.beta)]
            if len(missing):
                why = ", ".join(f"{b:g} ({_why_not_drawn(r, beta_min)})" for b, r in zip(missing.beta,
                                                                                           missing.itertuples(),
                                                                                 strict=True))  # fmt: skip
                listed.append(f"- {family} policy, {name}: no β_eff at β {why}.")
        betas = sorted(points.beta.unique())
        grid = np.geomspace(min(betas), max(betas), 10)
        ax.plot(grid, grid, ls="--", color="0.5", lw=1, label="effective β = β asked for")
        ax.set(xscale="log", yscale="log", xlabel="β asked for", ylabel="effective β (β_eff)")
        ax.set_xticks(betas, [f"{b:g}" for b in betas])
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        ax.set_title(f"{family} policy, T = {int(points[points.family == family]['T'].iloc[0])}: β_eff against β",
                     fontsize=10)  # fmt: skip
        ax.grid(alpha=0.3, which="major")
    length_families = list(dict.fromkeys(length.family))
    for col, family in enumerate(families):
        mine = length[length.family == family]
        for row, (column, what) in enumerate(
            (("objective_gap", "J_β(optimum) − J_β(end)"), ("beta_eff_ratio", "β_eff / β")), start=1
        ):
            ax = axes[row, col]
            if family not in length_families:
                say_why_empty(ax, f"no length sweep in the {family} policy")
                continue
            for beta, at in mine.groupby("beta"):
                for names, rows in _groups(at, ["T", column]):
                    drawn = rows[rows.status == "stable"].dropna(subset=[column]).sort_values("T")
                    values = drawn[column].clip(lower=GAP_FLOOR) if row == 1 else drawn[column]
                    name = f"{_group_label(names, at, presets)}, β{NBSP}={NBSP}{beta:g}"
                    ax.plot(drawn["T"], values, ms=5, lw=1, label=name, **setting_style(rows.iloc[0], beta))
            if row == 1:
                ax.set_yscale("log")
                if (mine[mine.status == "stable"].objective_gap < GAP_FLOOR).any():
                    ax.axhline(GAP_FLOOR, color="0.6", lw=0.8, ls="-", zorder=1,
                               label="on the optimum to rounding error (drawn on this line)")  # fmt: skip
            else:
                ax.axhline(1, ls="--", color="0.5", lw=1)
            ax.set_xlabel("T, tokens per answer")
            ax.set_ylabel(f"{what}, exact")
            ax.set_title(f"{family} policy: {'gap to the optimum' if row == 1 else 'β_eff / β'} against T",
                         fontsize=10)  # fmt: skip
            ax.set_xticks(sorted(mine["T"].unique()))
            ax.grid(alpha=0.3, which="major")
    figure_legend(fig, axes.ravel(), wrap=40)
    fig.suptitle("How strongly each setup regularises, against the β asked for (toy model, exact)", fontsize=11)
    footnote(fig, "Colour: KL configuration; marker shape: advantage normalisation; marker fill: G (filled 2, "
             "lower half 4, right half 5, hollow 8, left half 16);\nline style: β (lower rows). Settings with "
             "the same points are drawn once and named together.")  # fmt: skip
    return fig, caption(_caption(points, length, section, beta_min), "\n".join(listed))


def _why_not_drawn(row, beta_min: float) -> str:
    if row.status != "stable":
        return str(row.status)
    if getattr(row, "beyond_curve", False):  # the family's own curve stops where its optimum's KL stops growing
        return f"more KL than the optimum at β = {getattr(row, 'curve_beta_min', beta_min):.2g}"
    return "its KL outside the optima's"


ATLAS_CAPTION = """\
**How strongly each setup practitioners run regularises (toy model of §3.3, exact, float64).** A setting is a KL \
configuration with an advantage normalisation (RLOO; − group mean, Dr. GRPO; ÷ the group's standard deviation, GRPO \
and TRL's default; ÷ the batch's, TRL "batch", exact as the limit of many groups) and a group size G (RLOO's expected \
update does not depend on G); a preset is what a framework ships, read from its code (the presets' list below names \
the files). Effective β (β_eff): the β whose optimum of J_β = E[R] − β·KL has the same KL to the reference as the \
setting's end point. Top: β_eff against the β asked for, β ∈ {{{betas}}}, per policy family at T = {length_t}; on the \
dashed line a setting regularises as strongly as asked, below it less. Middle and bottom: the length sweep, exact, \
for T = 1 to {max_length} (the parametric family from T = 2: at T = 1 it is the tabular one), the reward at least \
ceil({fraction:g} × T) ones: the gap J_β(optimum) − J_β(end) on a log axis (a gap below {floor:g} is on the optimum \
to rounding error and is drawn on the grey line at {floor:g}) and β_eff/β (dashed: 1). Colour = KL configuration (as \
in every figure), marker shape = advantage normalisation (○ RLOO, ◇ group mean, □ group std, △ batch std, ▽ RLOO ÷ \
the others' std), marker fill = G (filled 2, lower half 4, right half 5, hollow 8, left half 16), line style = β \
(as in every figure). Settings whose points coincide at every β (or every T) are drawn once and named together. \
A setting without \
a stable fixed point, or whose end point has more KL than the optimum at the smallest β searched ({beta_min:g}), has \
no β_eff there and is left out of the line; those are listed below. The table gives every setting's end point, gap, \
β_eff and whether its on-policy Monte Carlo runs end there."""


def _caption(points: pd.DataFrame, length: pd.DataFrame, section: dict | None, beta_min: float) -> str:
    longest = ", ".join(f"{f} {int(length[length.family == f]['T'].max())}" for f in dict.fromkeys(length.family))
    fraction = ((section or {}).get("length") or {}).get("threshold_fraction", 0.75)
    return ATLAS_CAPTION.format(betas=", ".join(f"{b:g}" for b in sorted(points.beta.unique())),
                                length_t=int(points["T"].iloc[0]), max_length=longest, fraction=fraction,
                                floor=GAP_FLOOR, beta_min=beta_min)  # fmt: skip
