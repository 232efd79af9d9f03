"""The encoding every figure shares: colour, marker, line style and hatch, names, saving, captions.

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
from pathlib import Path

import matplotlib.colors as mcolors
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from klstudy.kl import NO_KL, PATHWISE, KLSpec

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
    "k1-advantage": "#3A2A8C",
    "k3-advantage": "#B35806",
    "k2-advantage": "#9970AB",
}
BASE_COLOUR = "0.6"  # the base model (no RL)
# A framework's per-token loss gradient: its pathwise configuration's colour, darkened by this much (0: the same).
LOSS_GRADIENT_SHADES = {PATHWISE: 0.0, "ratio": 0.35, "score": 0.55, "st": -0.35, "isst": -0.55}
# Without colour: the marker's shape says the placement, its fill the estimator (K1 filled, K3 hollow, K2 half).
PLACEMENT_MARKERS = {"reward": "o", "loss": "s", "both": "^", "advantage": "v", "none": "D"}
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
    where = {"both": "reward and loss", "advantage": "advantage (per token)"}.get(spec.placement, spec.placement)
    label = f"{spec.estimator.upper()} in {where}"
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


def say_in_panel(ax, text: str) -> None:
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


# J_β(optimum) − J_β(end) below this (toy model, float64): on the optimum to rounding error (toy and atlas figures).
GAP_FLOOR = 1e-12  # J_β(optimum) − J_β(end) below this: on the optimum to rounding error


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


DODGED = "Series at the same x are dodged sideways a little, so that none hides another (x: their shared step or β)."


def dodge(index: int, count: int, width: float) -> float:
    """The x offset of the index-th of count series, so that points at the same x do not hide each other."""
    return (index - (count - 1) / 2) * width / max(count, 1)


def se_band(ax, stats: pd.DataFrame, x, colour, alpha: float = 0.18) -> None:
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


def short_number(value, digits: int = 2) -> str:
    return "n/a" if pd.isna(value) else f"{float(value):.{digits}g}"


def claim_line(row) -> str:
    """One claim's verdict as the claims table states it: name, β, verdict, effect ± se, z against its critical."""
    beta = row.get("beta")
    where = "" if pd.isna(beta) or float(beta) == 0 else f", β = {float(beta):g}"
    if str(row.get("note", "")).startswith("trend"):
        where = ", trend over β"
    numbers = [] if pd.isna(row["effect"]) else [f"effect {short_number(row['effect'], 3)}"]
    if pd.notna(row["se"]):
        numbers[-1:] = [f"{numbers[-1]} ± {short_number(row['se'])}"] if numbers else []
    if pd.notna(row["z"]):
        numbers.append(f"z = {short_number(row['z'])}, needs {short_number(row['critical'], 3)}")
    return f"{row['claim']}{where}: {row['verdict']}" + (f" ({', '.join(numbers)})" if numbers else "")
