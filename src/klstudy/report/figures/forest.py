"""The claims figure: every claim of the claims table, effect ± critical·se, coloured by its verdict."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.patches as mpatches
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from klstudy.report.figures.encoding import (
    UNTESTED_COLOUR,
    VERDICT_COLOURS,
    caption,
    footnote,
    run_text,
    save,
    say_why_empty,
    short_number,
    verdict_colour,
)

# ---------------------------------------------------------------------------------------------------------
# The claims figure: every claim of the claims table, effect ± critical·se, coloured by verdict.

CLAIM_METRIC_UNITS = {
    "final_kl": "KL(π_sampling‖π_ref) at the end of training (nats)",
    "heldout": "held-out pass@1 at the last evaluation",
    "evaluation": "lm-eval mean@k, mean over the claim's tasks",
    "forward_kl": "forward KL(π_ref‖π_θ) at the last snapshot (nats)",
    "entropy": "token entropy of π_θ at the last snapshot (nats)",
}


def _claim_groups(claims: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The forest's panels: one per metric (trends over β apart: their unit is per decade of β), in table order."""
    trend = claims.get("note", pd.Series("", index=claims.index)).fillna("").astype(str).str.startswith("trend")
    keys = claims.metric.astype(str) + np.where(trend, " trend", "")
    return [(key, claims[keys == key]) for key in dict.fromkeys(keys)]


# The values a metric can take, for the range its differences can reach (candidate − baseline, the baseline's mean b
# known): a proportion lies in [0, 1], so a difference in [−b, 1 − b]; a KL or an entropy is ≥ 0, so ≥ −b.
PROPORTION_METRICS = {"heldout", "evaluation"}
NON_NEGATIVE_METRICS = {"final_kl", "forward_kl", "entropy"}
PREDICTED_MARKERS = {"higher": "▶", "lower": "◀"}  # after a claim's name on the axis: the direction predicted
MARGIN_COLOUR = "0.82"  # a same claim's margin: neither a verdict's colour nor a configuration's


def difference_range(metric: str, baseline_mean: float, trend: bool) -> tuple[float, float]:
    """The range of candidate − baseline that the metric allows (a trend's slope: unbounded)."""
    b = 0.0 if pd.isna(baseline_mean) else float(baseline_mean)
    if trend:
        return -math.inf, math.inf
    if metric in PROPORTION_METRICS:
        return -b if pd.notna(baseline_mean) else -1.0, 1.0 - b if pd.notna(baseline_mean) else 1.0
    if metric in NON_NEGATIVE_METRICS and pd.notna(baseline_mean):
        return -b, math.inf
    return -math.inf, math.inf


def draw_claims_forest(claims: pd.DataFrame, config: dict):
    """Every row of the claims table: its effect (candidate − baseline, in the metric's own sign and units) ±
    critical·se, the interval the verdict rule reads, clipped to what the metric allows (the clip marked), coloured by
    the verdict; one panel per metric; the predicted direction as a triangle after the claim's name. A claim of
    no difference ("same") shows its margin as a band around zero. Returns (figure, caption)."""
    claims = claims.copy()
    margins = {name: c.get("margin") for name, c in config.get("claims", {}).items()}
    baseline = claims.get("baseline_mean", pd.Series(math.nan, index=claims.index))
    claims["margin"] = [(margins.get(name) or math.nan) * abs(b) if pd.notna(b) else math.nan
                        for name, b in zip(claims.claim, baseline, strict=True)]  # fmt: skip
    groups = _claim_groups(claims) if len(claims) else []
    heights = [len(rows) + 1.4 for _, rows in groups] or [1]
    fig, axes = plt.subplots(len(heights), 1, figsize=(12, 0.3 * sum(heights) + 1.4), squeeze=False,
                             height_ratios=heights, layout="constrained")  # fmt: skip
    past = pd.concat([_forest_panel(ax, key, rows) for ax, (key, rows) in zip(axes[:, 0], groups, strict=False)]
                     or [claims.iloc[:0]])  # no claims: one empty panel, said below  # fmt: skip
    if not groups:
        say_why_empty(axes[0, 0], "the config names no claims")
    fig.legend(handles=_forest_handles(claims.get("verdict", [])), loc="outside right upper", fontsize=8,
               frameon=False)  # fmt: skip
    fig.suptitle("Every claim: effect ± critical·se, the interval its verdict reads", fontsize=11)
    footnote(fig, "Effect: candidate − baseline in the metric's units; ▶/◀ after a claim's name: the direction "
             "predicted.\n"
             "|: clipped at the metric's possible range; arrow: the interval runs past the panel.")  # fmt: skip
    models = claims.model.dropna().unique() if "model" in claims else []
    return fig, caption(FOREST_CAPTION, run_text(config, models) if len(models) else "", clipped_text(past))


FOREST_CAPTION = """\
**Every claim, at a glance.** One row per row of the claims table (figures/claims.csv): the effect, candidate − \
baseline (the mean over paired units: training seeds, or held-out questions), in the metric's own sign and units, \
with the interval effect ± critical·se that the verdict rule reads, coloured by the verdict (green shown, red \
contradicted, grey not shown; a hollow grey point: no interval, such as a claim that cannot be tested). A triangle \
after the claim's name points the way the paper or Table 1 predicts (▶ higher, ◀ lower); a claim of no difference has \
none and shows its margin as a grey band around 0: shown when the effect lies inside it by critical standard errors \
at both ends, each end tested seed by seed so that the margin's own noise (a fraction of the estimated baseline) is \
in its error; its z ("margin z") is the smaller of the two. An interval is clipped at the range the metric allows (a \
pass@1 or accuracy difference lies in [−b, 1 − b] for a baseline b; a KL or entropy difference is at least −b), \
marked |; one wider than its panel (which spans every effect ± 3 se) ends in an arrow. Right: verdict, z against its \
critical value, and n, the paired units. One panel per metric; a claim that a configuration's KL falls as β grows, \
tested as a slope over the β grid, has its own panel (per decade of β)."""


def _forest_handles(verdicts) -> list:
    """The legend: the verdicts that occur (a key to a colour no row has would be read as a finding), then the marks."""
    present = set(verdicts)
    handles = [plt.Line2D([], [], color=c, marker="o", linestyle="-", label=v)
               for v, c in VERDICT_COLOURS.items() if v in present]  # fmt: skip
    handles.append(plt.Line2D([], [], color=UNTESTED_COLOUR, marker="o", markerfacecolor="white", linestyle="",
                              label="no interval (not testable,\nno prediction)"))  # fmt: skip
    handles.append(plt.Line2D([], [], color="0.3", marker="|", markersize=10, linestyle="",
                              label="clipped at the metric's range"))  # fmt: skip
    handles.append(mpatches.Patch(color=MARGIN_COLOUR, label="margin of a 'same' claim"))
    return handles


def claims_forest(claims: pd.DataFrame, config: dict, png: Path) -> None:
    """draw_claims_forest, written to ``png`` (a PDF and the caption, claims_forest.md, beside it)."""
    fig, text = draw_claims_forest(claims, config)
    save(fig, png, text)


def clipped_text(clipped: pd.DataFrame) -> str:
    """The caption's line on intervals that run past their panel (arrows): how wide the rule's interval is at their
    n, so that an axis-wide line reads as what few seeds allow, not as a drawing error."""
    if clipped.empty:
        return ""
    by = "seeds" if "seeds" in clipped else "units"
    widths = "; ".join(f"{int(n)} seeds: ± {short_number(c, 3)} se" for n, c in
                       clipped.groupby(by).critical.min().items())  # fmt: skip
    return (
        "An arrow: the interval runs past the panel (which spans every effect ± 3 se). The rule's interval "
        f"is effect ± critical·se, with critical the larger of min_z and Student's t at seeds − 1 degrees of freedom "
        f"({widths}): the fewer the units, the wider it is, and only an effect that many se from 0 can be shown."
    )


def _forest_view(rows: pd.DataFrame) -> float:
    """Half the width of a panel: every effect ± 3 se and every margin, with some room."""
    spans = [*(rows.effect.abs() + 3 * rows.se.fillna(0)), *rows.margin]
    return 1.15 * max([s for s in spans if np.isfinite(s) and s > 0] or [1.0])


def _forest_panel(ax, key: str, rows: pd.DataFrame) -> pd.DataFrame:
    """One metric's claims (see draw_claims_forest); returns the rows whose interval runs past the panel."""
    metric, _, trend = key.partition(" ")
    limit = _forest_view(rows)
    past = []
    for y, row in enumerate(rows.to_dict("records")):
        colour = verdict_colour(row["verdict"])
        x, half = row["effect"], row["critical"] * row["se"]
        if pd.notna(row["margin"]):
            ax.fill_betweenx([y - 0.4, y + 0.4], -row["margin"], row["margin"], color=MARGIN_COLOUR, linewidth=0)
        if pd.notna(half) and pd.notna(x):
            if _draw_interval(ax, y, x, half, difference_range(metric, row.get("baseline_mean"), bool(trend)),
                              limit, colour):  # fmt: skip
                past.append(y)
            ax.plot(x, y, "o", color=colour)
        elif pd.notna(x):
            ax.plot(max(min(x, limit), -limit), y, "o", color=colour, markerfacecolor="white")
        z_name = "margin z" if row.get("predicted") == "same" else "z"
        numbers = f"{short_number(row['z'])} / {short_number(row['critical'], 3)}"
        score = "" if pd.isna(row["z"]) else f"   {z_name} {numbers}"
        ax.annotate(f"{row['verdict']}{score}   {_units_text(row)}", (1.02, y), xycoords=("axes fraction", "data"),
                    va="center", fontsize=7, color=colour if colour != UNTESTED_COLOUR else "0.4")  # fmt: skip
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_xlim(-limit, limit)
    ax.set_ylim(len(rows) - 0.4, -0.6)
    labels = [f"{_claim_label(row)}  {PREDICTED_MARKERS.get(row.get('predicted'), '')}".rstrip() for row in
              rows.to_dict("records")]  # fmt: skip
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    unit = CLAIM_METRIC_UNITS.get(metric, metric)
    ax.set_title(f"{unit}{': slope per decade of β' if trend else ''}, candidate − baseline", fontsize=9, loc="left")
    ax.grid(alpha=0.3, axis="x")
    return rows.iloc[sorted(set(past))]


def _draw_interval(ax, y: float, x: float, half: float, allowed: tuple[float, float], limit: float, colour) -> bool:
    """effect ± half clipped to the metric's range (a | where clipped) and to the panel (an arrow where it runs past);
    returns whether it ran past the panel."""
    low, high = max(x - half, allowed[0]), min(x + half, allowed[1])
    ax.plot([max(low, -limit), min(high, limit)], [y, y], color=colour, linewidth=1.4)
    past = False
    ends = ((low, x - half < allowed[0], -limit, "<"), (high, x + half > allowed[1], limit, ">"))
    for end, clip, edge, arrow in ends:
        if abs(end) > limit and np.sign(end) == np.sign(edge):
            ax.plot(edge, y, marker=arrow, color=colour, markersize=6)
            past = True
        elif clip:
            ax.plot(end, y, marker="|", color="0.15", markersize=10, markeredgewidth=1.6)
    return past


def _units_text(row) -> str:
    """'n 4', or 'n 100 questions × 4 seeds' for a claim paired by question (its degrees of freedom are the
    seeds')."""
    seeds = row.get("seeds")
    if pd.isna(seeds) or row.get("pair_by") != "questions":
        return f"n {row.get('units', '')}"
    return f"n {row.get('units', '')} questions × {int(seeds)} seeds"


def _claim_label(row) -> str:
    """'claim, β = 1 vs 0.1' (a claim between two β of one configuration), 'claim, β = 0.1', 'claim (over β)'."""
    if str(row.get("note", "")).startswith("trend"):
        return f"{row['claim']} (over β)"
    beta, below = pd.to_numeric(pd.Series([row.get("beta"), row.get("baseline_beta")]), errors="coerce")
    if pd.isna(beta) or beta == 0:
        return str(row["claim"])
    against = f" vs {below:g}" if pd.notna(below) and row.get("baseline") == row.get("candidate") else ""
    return f"{row['claim']}, β = {beta:g}{against}"
