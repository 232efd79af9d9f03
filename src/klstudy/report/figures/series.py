"""One series drawn as its noise is (draw_series: one seed with its own error, a few seeds each, many with a band)
and the base model's one measurement, the same in every panel that shows it (panels.py's panel kinds use both)."""

from __future__ import annotations

import math

import matplotlib.colors as mcolors
import numpy as np
import pandas as pd

from klstudy.kl import NO_KL
from klstudy.report.aggregate import mean_and_se
from klstudy.report.figures.encoding import BASE_COLOUR, MEAN_LINEWIDTH, config_colour, style_of, tag

SEEDS_WITHOUT_BAND = 4  # up to this many seeds, each is drawn and no ±1 se band is (a band of few seeds looks sure)
MOST_BANDS = 2  # more one-seed curves in a panel than this: each point's ±1 se as a bar (bands would cover each other)
RAW_SEED_LINES_UP_TO = 12  # more seed lines in a panel than this read as one tangle: each seed's end a dot instead


# ---------------------------------------------------------------------------------------------------------
# One series: a configuration × β over x, its seeds drawn as the noise is.


def draw_series(ax, runs: pd.DataFrame, kl_config: str, beta, label: str, offset: float = 0.0, marker: bool = True,
                error: str = "band", bars_after: float = -math.inf, seed_ends: float | None = None):  # fmt: skip
    """``runs``: columns seed, x, value, se (each seed's own error; NaN unknown). One seed: the line and ±1 se of its
    own error, as a band (``error`` 'band') or as a bar at each point ('bars': where many curves share a panel). Two
    to SEEDS_WITHOUT_BAND seeds: each seed a thin line, the mean over seeds a thicker one, no band. More: the mean with
    a ±1 se band (aggregate.mean_and_se). Bars only at x > ``bars_after`` (a point drawn with its own error, the base
    model's, gets none). ``seed_ends`` (a crowded panel): two to SEEDS_WITHOUT_BAND seeds are drawn as each seed's
    last value, a dot at that x, not as lines. Returns (the mean line, seeds, how the error was drawn: 'band', 'bars'
    or None)."""
    style = style_of(kl_config, beta)
    if not marker:
        style = {**style, "marker": ""}
    seeds = runs.seed.nunique()
    stats = pd.DataFrame([(x, *mean_and_se(g.value, g.se)) for x, g in runs.groupby("x", sort=True)],
                         columns=["x", "mean", "se", "n"])  # fmt: skip
    # A point at x <= bars_after is the base model's, drawn once in grey (draw_base_point): every line leaves from it,
    # undodged, without a marker or a band of its own there.
    at_base = (stats.x <= bars_after).to_numpy()
    x = np.where(at_base, stats.x.to_numpy(dtype=float), stats.x.to_numpy(dtype=float) + offset)
    drawn_error = None
    if 1 < seeds <= SEEDS_WITHOUT_BAND and seed_ends is not None:
        ends = [run.sort_values("x").value.iloc[-1] for _, run in runs.groupby("seed")]
        draw_seed_ends(ax, ends, seed_ends, TIE_STEP * (ax.get_xlim()[1] - ax.get_xlim()[0]), kl_config, beta)
    elif 1 < seeds <= SEEDS_WITHOUT_BAND:
        for _, run in runs.groupby("seed"):
            run = run.sort_values("x")
            run_x = np.where(run.x <= bars_after, run.x, run.x + offset)  # from the base point, as the mean
            tag(ax.plot(run_x, run.value, color=style["color"], linestyle=style["linestyle"], linewidth=0.6,
                        alpha=0.55, label="_seed")[0], kl_config, beta, "seed")  # fmt: skip
    elif stats.se.notna().any():
        low, high = stats["mean"] - stats.se, stats["mean"] + stats.se
        drawn_error = "bars" if seeds == 1 and error == "bars" else "band"
        if drawn_error == "bars":
            at = (stats.x > bars_after).to_numpy()
            artist = ax.vlines(x[at], low[at], high[at], colors=[style["color"]], linewidth=0.9, alpha=0.8,
                               label="_error")  # fmt: skip
        else:  # a light fill, its edge in β's line style: two bands of one configuration at two β stay apart
            low, high = low.where(~at_base), high.where(~at_base)  # the base point carries its own error
            artist = ax.fill_between(x, low, high, facecolor=mcolors.to_rgba(style["color"], 0.12), linewidth=0.6,
                                     edgecolor=mcolors.to_rgba(style["color"], 0.6), linestyle=style["linestyle"],
                                     label="_band")  # fmt: skip
        tag(artist, kl_config, beta, "band")
    line = ax.plot(x, stats["mean"], label=label, linewidth=MEAN_LINEWIDTH if seeds > 1 else 1.2,
                   markevery=list(np.flatnonzero(~at_base)), **style)[0]  # fmt: skip
    return tag(line, kl_config, None if kl_config == NO_KL else beta), seeds, drawn_error


TIE_STEP = 0.008  # of the x range: seeds with the same value side by side, not one on another (pass@1 ties often)


def tied_apart(values: list, x: float, step: float) -> list[float]:
    """x for each value, those equal to another spread side by side around x, ``step`` apart."""
    xs = []
    for i, value in enumerate(values):
        same = [j for j, other in enumerate(values) if np.isclose(other, value)]
        xs.append(x + (same.index(i) - (len(same) - 1) / 2) * step)
    return xs


def draw_seed_ends(ax, ends: list, x: float, step: float, kl_config: str, beta, ties: list | None = None):
    """Each seed's last value a dot at ``x`` in its configuration's colour (a crowded panel's seeds); dots that tie
    (equal ``ties``: the values themselves unless given) side by side, ``step`` apart."""
    xs = tied_apart(ends if ties is None else ties, x, step)
    return tag(ax.scatter(xs, ends, s=5, color=config_colour(kl_config), linewidth=0, zorder=4, label="_seed ends"),
               kl_config, beta, "band")


def error_drawing(lines: list) -> str:
    """How a panel of ``lines`` series draws one seed's error: bands for up to MOST_BANDS curves, else bars."""
    return "band" if len(lines) <= MOST_BANDS else "bars"


# ---------------------------------------------------------------------------------------------------------
# The base model: one evaluation, drawn the same in every figure that shows it.


def base_heldout(heldout: pd.DataFrame, config: dict, model: str, data: str) -> tuple[float, float, int]:
    """The base model on a held-out set: its step-0 evaluations (every run of every study on that set evaluates it
    before training; runs of one seed repeat one evaluation), one per distinct evaluation, pooled: (mean, se, n)."""
    studies = [s for s, spec in config["studies"].items() if spec["heldout_data"] == data and model in spec["models"]]
    rows = heldout[heldout.study.isin(studies) & (heldout.model == model) & (heldout.step == 0)]
    distinct = rows.drop_duplicates(["seed", "pass_at_1"])
    if distinct.empty:
        return math.nan, math.nan, 0
    mean = float(distinct.pass_at_1.mean())
    errors = distinct.stderr.astype(float) if "stderr" in distinct else pd.Series(math.nan, index=distinct.index)
    se = float(np.sqrt((errors**2).sum()) / len(distinct)) if errors.notna().all() else math.nan
    return mean, se, len(distinct)


def draw_base_point(ax, mean: float, se: float, n: int, x: float = 0.0):
    """The base model's held-out score at step 0: a grey diamond with its ±1 se."""
    label = "base model (step 0)"
    bars = ax.errorbar([x], [mean], yerr=[[se], [se]] if np.isfinite(se) else None, fmt="D", color=BASE_COLOUR,
                       markersize=5, capsize=2, zorder=5, label=label)  # fmt: skip
    bars.lines[0].set_gid("reference base")
    return bars.lines[0]


def base_divergence(rows: pd.DataFrame, metric: str) -> tuple[float, float] | None:
    """The base model's (value, se) when every run's step-0 measurement is the same one (the policy at step 0 is the
    reference: measured once, a copy scores the same); None when they differ or there is no step 0."""
    zero = rows[rows.step == 0]
    if zero.empty or np.ptp(zero[metric].to_numpy(dtype=float)) > 1e-12:
        return None
    return float(zero[metric].iloc[0]), float(zero[f"{metric}_stderr"].iloc[0])


def from_base(runs: pd.DataFrame, value: float, se: float) -> pd.DataFrame:
    """``runs`` (columns seed, step, x, value, se) with each seed's step 0 replaced by the base model's one
    measurement: every run starts from it, and it is drawn once."""
    return pd.concat([runs[runs.step > 0], runs[["seed"]].drop_duplicates().assign(x=0, value=value, se=se)])
