"""The encoding every figure shares, in one style table (colour = KL configuration, marker shape = placement, marker
fill = estimator, line style or hatch = β by its value), the reader's names, print sizes and saving. Every artist
drawn for a configuration carries a gid naming it and its β (``tag``): a test checks each against this table."""

from __future__ import annotations

import math
import re
from pathlib import Path

import matplotlib as mpl
import matplotlib.pyplot as plt
import pandas as pd

from klstudy.kl import NO_KL, PATHWISE, KLSpec

SINGLE_COLUMN, FULL_WIDTH, MAX_HEIGHT = 3.5, 7.0, 9.0  # inches: a figure is drawn at the size it is printed
DPI = 200
FONTS = {"font.size": 8, "axes.titlesize": 8, "axes.labelsize": 8, "xtick.labelsize": 7, "ytick.labelsize": 7,
         "legend.fontsize": 7, "legend.title_fontsize": 7, "figure.titlesize": 9, "lines.linewidth": 1.2,
         "lines.markersize": 4, "axes.linewidth": 0.6, "grid.linewidth": 0.5, "legend.frameon": False,
         "legend.handlelength": 3.6,  # two periods of the longest dash pattern of BETA_STYLES
         "hatch.linewidth": 0.6}  # fmt: skip
mpl.rcParams.update(FONTS)

# One colour per KL configuration, none reused, hues far apart among the configurations drawn together (the
# on-policy grid, Figure 1's nine, the atlas's eight); marker shape and fill say placement and estimator without
# colour. Green and red are the verdicts'. Every hex has a letter: one of digits alone reads as an issue number.
CONFIG_COLOURS = {NO_KL: ("black", "black"), "k1-reward": ("#0072B2", "blue"), "k1-loss": ("#56B4E9", "sky blue"),
    "k1-both": ("#AA4499", "purple"), "k1-advantage": ("#33228A", "indigo"), "k3-reward": ("#E69F00", "orange"),
    "k3-loss": ("#8C510A", "brown"), "k3-both": ("#99993A", "olive"), "k3-advantage": ("#D55E00", "vermilion"),
    "k2-reward": ("#CC6677", "rose"), "k2-loss": ("#88225A", "wine"), "k2-both": ("#44AA99", "teal"),
    "k2-advantage": ("#DDCC77", "sand"), "k1-loss-ratio": ("#77AADD", "light blue"),
    "k1-loss-score": ("#00448A", "dark blue"), "k1-loss-st": ("#99DDFF", "pale cyan"),
    "k1-loss-isst": ("#BBCC33", "pear"), "k3-loss-ratio": ("#EE3377", "magenta"), "k3-loss-score": ("#33BBEE", "cyan"),
    "k3-loss-st": ("#66333A", "maroon"), "k3-loss-isst": ("#EE8866", "salmon"), "k2-loss-ratio": ("#9988CC", "lilac"),
    "k2-loss-score": ("#FFAABB", "light pink"), "k2-loss-st": ("#22555A", "dark teal"),
    "k2-loss-isst": ("#99445A", "dark rose")}  # fmt: skip
BASE_COLOUR = "0.55"  # the base model (no RL)
UNLISTED_COLOUR = "0.4"  # a configuration CONFIG_COLOURS does not list
# Without colour: the marker's shape says the placement, its fill the estimator (K1 filled, K3 hollow, K2 half).
PLACEMENT_MARKERS = {"reward": "o", "loss": "s", "both": "^", "none": "D", "advantage": "v"}
ESTIMATOR_FILLS = {"k1": "full", "k3": "none", "k2": "bottom"}
# β by its value, the same β drawn the same way in every figure of every run (not by its rank in one run's grid):
# (line style, hatch). Dash lengths are in line widths; every period fits twice in a legend's sample (FONTS).
BETA_STYLES = {0.005: ((0, (1, 3)), "oo"), 0.01: ((0, (2, 3)), "++"), 0.05: ((0, (4, 1.2, 1, 1.2)), "||"),
               0.1: ((0, (3, 1.5)), "//"), 0.3: ((0, (2.5, 1, 0.8, 1, 0.8, 1)), "\\\\"),
               1.0: ((0, (1, 1.5)), "OO"),  # not dots: a bar's seeds are black dots
               3.0: ((0, (2.2, 0.8, 2.2, 2.5)), "xx"), 10.0: ((0, (6, 1.5)), "--")}  # fmt: skip
BETA_STYLE_WORDS = {0.005: "sparse dots, small rings", 0.01: "sparse dashes, crosses", 0.05: "dash-dot, upright lines",
                    0.1: "dashed, rising diagonals", 0.3: "dash-dot-dot, falling diagonals", 1.0: "dotted, large rings",
                    3.0: "paired dashes, diagonal crosses", 10.0: "long dashes, level lines"}  # fmt: skip
NO_KL_STYLE = ("-", "")  # β = 0: solid, unhatched
NO_TEMPLATE_HATCH = "**"  # the base model's bars without its chat template (Figs. 5, 10): a hatch no β uses
UNSETTLED_MARKERS = {"drifts": ">", "still moving": "P"}  # the toy model and atlas: no fixed point where it stopped
VERDICT_COLOURS = {"shown": "#009E73", "contradicted": "#CC3311", "not shown": "0.45"}
UNTESTED_COLOUR = "0.7"  # "no prediction": an interval without a verdict


def config_colour(kl_config: str) -> str:
    """The colour of a KL configuration in every figure ("base": the base model)."""
    return BASE_COLOUR if kl_config == "base" else CONFIG_COLOURS.get(kl_config, (UNLISTED_COLOUR, ""))[0]


def _beta_style(beta) -> tuple:
    """(line style, hatch) of the β of BETA_STYLES nearest to ``beta`` on a log scale; β = 0 or none: no KL's."""
    if beta is None or pd.isna(beta) or float(beta) <= 0:
        return NO_KL_STYLE
    return BETA_STYLES[min(BETA_STYLES, key=lambda b: abs(math.log(b) - math.log(float(beta))))]


beta_linestyle = lambda beta: _beta_style(beta)[0]  # β's line style (BETA_STYLES)
beta_hatch = lambda beta: _beta_style(beta)[1]  # β's hatch on bars


def marker_of(kl_config: str) -> dict:
    """The marker of a configuration: shape = placement, fill = estimator (a hollow marker keeps a white face)."""
    spec = None if kl_config in (NO_KL, "base") else KLSpec.from_name(kl_config)
    placement, estimator = (spec.placement, spec.estimator) if spec else ("none", "k1")
    fill = ESTIMATOR_FILLS.get(estimator, "full")
    if fill == "none":
        return {"marker": PLACEMENT_MARKERS[placement], "fillstyle": "full", "markerfacecolor": "white"}
    return {"marker": PLACEMENT_MARKERS[placement], "fillstyle": fill, "markerfacecoloralt": "white"}


def style_of(kl_config: str, beta=None) -> dict:
    """Keyword arguments for ax.plot: the configuration's colour and marker, β's line style."""
    return {"color": config_colour(kl_config), "linestyle": beta_linestyle(beta), **marker_of(kl_config)}


GID = re.compile(r"^style kl=(?P<kl>[^;]+);beta=(?P<beta>[^;]*)(;(?P<part>\w+))?$")


def tag(artist, kl_config: str, beta=None, part: str = "line"):
    """Name on an artist the configuration and β it is drawn for; part: 'line' (colour, marker, line style),
    'marker' (colour, marker), 'bar' (colour, hatch), 'band' (colour only) or 'key' (line style only)."""
    b = "" if beta is None or pd.isna(beta) else f"{float(beta):g}"
    artist.set_gid(f"style kl={kl_config};beta={b};{part}")
    return artist


LOSS_GRADIENT_NAMES = {"ratio": "ratio-weighted", "score": "score-weighted", "st": "K2-gradient",
                       "isst": "weighted K2-gradient"}  # fmt: skip


def kl_label(kl_config: str, beta=None) -> str:
    """'K1 in reward, β = 0.1'; 'no KL (β = 0)'; 'base model'; 'K3 in loss, ratio-weighted'."""
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


# The data a run generates (data/procedural.py), by what it is: a figure names it so, and the paper's dataset only as
# the role it plays. Every other kind is the paper's data (the hub's) or the paper's own generator (Countdown).
STAND_INS = {"arithmetic": "procedural arithmetic", "mc_compare": "procedural choice of the largest number",
             "mc_length": "procedural choice of a word's length",
             "mc_next": "procedural choice of the next letter"}  # fmt: skip


def task_name(config: dict, task: str, short: bool = False) -> str:
    """A task as the run used it: 'procedural arithmetic, MATH500's role' for a stand-in (``short``, a tick label:
    'arithmetic' over '(MATH500's role)'), the paper's name ('MATH500') only where the run used the paper's data."""
    spec = config.get("data", {}).get(task) or {}
    role, stand_in = spec.get("role") or task.replace("_", " "), STAND_INS.get(spec.get("kind"))
    if stand_in and short:
        return f"{stand_in.split()[-1]}\n({role.replace('MMLU college ', 'MMLU ')}'s role)"
    return f"{stand_in}, {role}'s role" if stand_in else role


def name_data(config: dict, text: str) -> str:
    """A config's text (a title) with each stand-in's role named as the stand-in (task_name)."""
    roles = {spec["role"]: task for task, spec in config.get("data", {}).items()
             if spec and spec.get("role") and spec.get("kind") in STAND_INS}  # fmt: skip
    for role in sorted(roles, key=len, reverse=True):
        text = re.sub(rf"(?<![\w']){re.escape(role)}(?!['\w²])", task_name(config, roles[role]), text)
    return text


def study_name(config: dict, study: str) -> str:
    """A study as its description names it, without the paper's figure numbers or notes: 'on-policy grid'."""
    text = config["studies"][study].get("description", study)
    return re.sub(r"\s*\(Fig[^)]*\)|;.*$", "", text).replace(" x ", " × ")


def design_text(config: dict, study: str, said: str = "") -> str:
    """'8 prompts × 4 completions a step, 15 steps' (and the updates per batch, the lag, where not 1 and 0), less
    the parts whose count and noun ('16 prompts', '4 updates') the text ``said`` already gives."""
    train = config["studies"][study]["train"]
    updates = train["batch_prompts"] // max(train.get("minibatch_prompts", train["batch_prompts"]), 1)
    parts = [f"{train['batch_prompts']} prompts × {train['rollouts']} completions a step", f"{train['steps']} steps"]
    parts += [f"{updates} updates per batch"] if updates > 1 else []
    parts += [f"asynchronous, a lag of {train['async_level']} steps"] if train.get("async_level") else []
    return ", ".join(p for p in parts if " ".join(p.split()[:2]) not in said.replace(" x ", " × "))


def scale_text(config: dict, models) -> str:
    """The caption's words on the run: its models (the hub id; a GGUF copy by its model's name, 'SmolLM2-135M-Instruct,
    a 4-bit GGUF copy'; or the tiny one) and whether its data are the paper's."""
    names = []
    for model in dict.fromkeys(models):
        spec = config["models"].get(model, {})
        gguf = spec.get("gguf")
        bits = re.search(r"Q(\d+)", Path(gguf).stem) if gguf else None
        copy = f"{Path(gguf).stem.split('.')[0]}, a {bits.group(1) if bits else ''}-bit GGUF copy" if gguf else None
        names.append(spec.get("hub_id") or copy or "the tiny model built locally")
    procedural = any((spec or {}).get("kind") in STAND_INS for spec in config.get("data", {}).values())
    names, data = ", ".join(names), "procedural stand-ins for the paper's" if procedural else "the paper's"
    return f"{names[0].upper()}{names[1:]}, {data} data."


def save(png: Path, fig, caption: str | None = None) -> None:
    """Write ``png`` (DPI) and its PDF at the figure's print size and, given its caption, <name>.md beside them."""
    width, height = fig.get_size_inches()
    if round(width, 3) not in (SINGLE_COLUMN, FULL_WIDTH) or height > MAX_HEIGHT + 1e-9:
        raise ValueError(f"a figure of {width:.2f} × {height:.2f} in: print sizes are {SINGLE_COLUMN} or "
                         f"{FULL_WIDTH} in wide and at most {MAX_HEIGHT} in tall")  # fmt: skip
    png = Path(png)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=DPI)
    fig.savefig(png.with_suffix(".pdf"))
    plt.close(fig)
    if caption is not None:
        png.with_suffix(".md").write_text(f"![{png.stem}]({png.name})\n\n{caption.strip()}\n")


def key_handles(kls: list[str], betas: list[float]) -> list:
    """A legend keying colour and line style apart: an entry per configuration (colour, marker) and per β (grey)."""
    handles = [tag(plt.Line2D([], [], **{**style_of(kl), "linestyle": "-"}, label=kl_label(kl)), kl, None, "marker")
               for kl in kls]  # fmt: skip
    handles += [tag(plt.Line2D([], [], color="0.3", linestyle=beta_linestyle(b), label=f"β = {b:g}"), NO_KL, b, "key")
                for b in betas if b]  # fmt: skip
    return handles


def drawn_configs(fig) -> list[str]:
    """The configurations a figure's tagged artists are drawn for, in the order drawn."""
    tagged = [GID.match(line.get_gid() or "") for ax in fig.axes for line in ax.get_lines()]
    return list(dict.fromkeys(match["kl"] for match in tagged if match))


def legend_below(fig, handles: list, columns: int | None = None) -> None:
    """One legend for the figure, under its panels."""
    if handles:
        wide = fig.get_size_inches()[0] >= FULL_WIDTH
        fig.legend(handles=handles, loc="outside lower center", ncols=columns or min(len(handles), 3 if wide else 1))


def step_axis(ax, steps) -> None:
    """Training steps on x, ticks only at the steps given (where a run was evaluated), at most eight of them."""
    ax.set_xlabel("training step")
    steps = sorted({int(s) for s in steps})
    if steps:
        ax.set_xticks(steps[::-1][:: math.ceil(len(steps) / 8)][::-1])  # the last step always, every'th before it


MAX_SEED_LINES = 12  # past this many seed lines a panel cannot be read: the mean lines, each seed's end a dot
COINCIDE = 0.02  # lines this close (relative) at every point print as one line: drawn once, named together
GAP_FLOOR = 1e-12  # J_β(optimum) − J_β(end) below this (float64): on the optimum to rounding error


def dodge(index: int, count: int, width: float) -> float:
    """The x offset of the index-th of count series, so that points at the same x do not hide each other."""
    return (index - (count - 1) / 2) * width / max(count, 1)


CLAIM_COLUMNS = ("claim", "effect", "se", "z", "critical", "verdict")


def read_claims(path: Path) -> pd.DataFrame:
    """figures/claims.csv, checked for the columns a figure reads."""
    claims = pd.read_csv(path)
    missing = [c for c in CLAIM_COLUMNS if c not in claims]
    if missing:
        raise ValueError(f"{path}: the claims table has no column {', '.join(missing)}")
    return claims
