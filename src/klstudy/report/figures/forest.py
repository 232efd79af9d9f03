"""The claims forests: one figure per metric, each claim testable by design in its words, its rows (one per β) drawn
as effect ± critical·se, the interval the verdict reads, coloured by the verdict."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from klstudy.claims_rule import critical_value
from klstudy.figure_plan import CLAIMS_FIGURE, is_result, testable_by_design
from klstudy.report.figures import encoding
from klstudy.report.figures.captions import PIPELINE_CHECK, PREDICTED_WORDS, Caption, claim_beta, claim_words, finish
from klstudy.report.figures.encoding import FULL_WIDTH, MAX_HEIGHT, UNTESTED_COLOUR, save, scale_text, study_name

METRICS = {  # a metric's forest: its title, its units
    "final_kl": ("the KL to the reference at the end of training", "KL(π_sampling‖π_ref) at the end, nats"),
    "heldout": ("held-out pass@1", "held-out pass@1 at the last evaluation"),
    "evaluation": ("the evaluation of the final policy", "lm-eval mean@k over the claim's tasks"),
    "forward_kl": ("the forward KL to the base policy", "forward KL(π_ref‖π_θ) at the last snapshot, nats"),
    "entropy": ("the policy's entropy", "token entropy of π_θ at the last snapshot, nats")}
PROPORTION_METRICS = {"heldout", "evaluation"}  # a difference of two scores in [0, 1] lies in [−b, 1 − b]
NON_NEGATIVE_METRICS = {"final_kl", "forward_kl", "entropy"}  # a difference of two quantities ≥ 0 is ≥ −b
MARGIN_COLOUR = "0.85"
ROW_INCHES = 0.17
CAP = 40.0  # a panel spans every interval up to this many times its largest |effect| + se (then an arrow)


def difference_range(metric: str, baseline_mean: float, trend: bool) -> tuple[float, float]:
    """The range of candidate − baseline the metric allows (a trend's slope: unbounded)."""
    b = float(baseline_mean) if pd.notna(baseline_mean) else math.nan
    if trend:
        return -math.inf, math.inf
    if metric in PROPORTION_METRICS:
        return (-b, 1.0 - b) if pd.notna(b) else (-1.0, 1.0)
    return (-b, math.inf) if metric in NON_NEGATIVE_METRICS and pd.notna(b) else (-math.inf, math.inf)


def forest_rows(claims: pd.DataFrame, config: dict, metric: str) -> tuple[pd.DataFrame, int]:
    """The metric's rows of the claims testable by design, each with its margin in the metric's units and, without a
    prediction, the critical value its seeds would be judged with; and how many rows (a claim at one β, as a panel's
    title counts them) are left out (one seed)."""
    rows = claims[claims.metric == metric].copy()
    specs = config.get("claims", {})
    testable = rows.claim.map(lambda c: c not in specs or testable_by_design(config, specs[c]))
    left_out = int((~testable).sum())
    rows = rows[testable]
    rows["margin"] = [(specs.get(c, {}).get("margin") or math.nan) * abs(b) if pd.notna(b) else math.nan
                      for c, b in zip(rows.claim, rows.get("baseline_mean", math.nan), strict=True)]  # fmt: skip
    rule = config.get("claims_rule") or {}
    df = rows.get("df", pd.Series(math.nan, index=rows.index))
    unjudged = rows.critical.isna() & rows.se.notna() & (df >= 1)
    rows["spread_critical"] = math.nan
    if unjudged.any() and {"alpha", "min_z"} <= set(rule):
        rows.loc[unjudged, "spread_critical"] = critical_value(df[unjudged], rule)
    rows["trend"] = rows.get("note", pd.Series("", index=rows.index)).fillna("").astype(str).str.startswith("trend")
    return rows, left_out


def draw_claims_forest(claims: pd.DataFrame, config: dict, metric: str | None = None):
    """One metric's claims, per β effect ± critical·se clipped to what the metric allows (|; an arrow past the
    panel), coloured by the verdict; a margin a grey band; trends in a panel of their own. Returns (figure, caption)."""
    metric = metric or next(iter(dict.fromkeys(claims.metric)), "final_kl")
    rows, left_out = forest_rows(claims, config, metric)
    groups = [part for part in (rows[~rows.trend], rows[rows.trend]) if len(part)] or [rows]
    runs = {study: chr(ord("A") + i) for i, study in enumerate(dict.fromkeys(rows.get("study", [])))}  # named below
    entries = [_entries(part, runs) for part in groups]
    heights = [sum(1 + e[1].count("\n") * 0.8 for e in ent) + 1.5 for ent in entries]
    fig, axes = plt.subplots(len(heights), 1, figsize=(FULL_WIDTH, min(MAX_HEIGHT, ROW_INCHES * sum(heights) + 1.1)),
                             squeeze=False, height_ratios=heights, layout="constrained")  # fmt: skip
    for ax, part, ent in zip(axes[:, 0], groups, entries, strict=True):
        _forest_panel(ax, metric, bool(part.trend.any()), ent)
    words, unit = METRICS.get(metric, (metric, metric))
    title = f"Claims on {words}"
    fig.suptitle(f"{title}: effect ± critical·se")
    handles = [plt.Line2D([], [], color=c, marker="o", label=v) for v, c in encoding.VERDICT_COLOURS.items()
               if v in set(rows.verdict)]  # fmt: skip
    if rows.critical.isna().any():
        handles.append(plt.Line2D([], [], color=UNTESTED_COLOUR, marker="o", linewidth=0.9, label="no prediction"))
    if rows.margin.notna().any():
        handles.append(plt.Rectangle((0, 0), 1, 1, color=MARGIN_COLOUR, label="margin of a claim of no difference"))
    encoding.legend_below(fig, handles, 4)
    models = rows.model.dropna().unique() if "model" in rows else []
    caption = Caption()
    caption.add("" if is_result(config, f"{CLAIMS_FIGURE}_{metric}") else PIPELINE_CHECK,
        f"**{title}.** {caption.design(scale_text(config, models)) if len(models) else ''} Each claim on "
        f"{unit}, a line per β: the effect (candidate − baseline over paired seeds) "
        "and effect ± critical·se, the interval the verdict reads, clipped (|) at the range the metric allows. Right: "
        "the verdict; z, the effect ÷ its se towards the prediction, against the critical value; the paired units."
        + (" Lower panel: slopes per decade of β." if rows.trend.any() else "")
        + caption.design("".join(f" Run {r}: {study_name(config, s)}." for s, r in runs.items() if len(runs) > 1))
        + (caption.design(f" {left_out} claim{'s' * (left_out > 1)} at a β pair{'s' * (left_out == 1)} one seed by "
                          "design, left to the claims table.") if left_out else ""))  # fmt: skip
    return fig, finish(fig, caption)


def _entries(rows: pd.DataFrame, runs: dict) -> list[tuple[str, str, dict | None]]:
    """The forest's lines: per claim a header (its words, prediction and ``runs``' letter for it), a line per β."""
    entries = []
    for _, claim in rows.groupby("claim", sort=False):
        records = claim.to_dict("records")
        words = claim_words(records[0].get("text", records[0]["claim"]))
        predicted = PREDICTED_WORDS.get(str(records[0].get("predicted")), "")
        run = f"; run {runs[records[0]['study']]}" if len(runs) > 1 else ""
        entries.append(("header", textwrap.fill(f"{words} ({predicted}{run})", 60), None))
        entries += [("row", claim_beta(r) or "", r) for r in records]
    return entries


def _forest_panel(ax, metric: str, trend: bool, entries: list) -> None:
    """One panel top down; the verdict, z and units on the right (a twin axis' tick labels)."""
    view = _view([e[2] for e in entries if e[2] is not None], metric, trend)
    y, ticks, labels, right = 0.0, [], [], []
    for kind, text, row in entries:
        step = 1 + text.count("\n") * 0.8
        y += step / 2
        if kind == "header":
            ax.text(0.005, y, text, transform=ax.get_yaxis_transform(), ha="left", va="center", fontsize=7,
                    fontweight="bold", color="0.15", bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.6},
                    zorder=5)  # fmt: skip
        else:
            ticks.append(y)
            labels.append(text)
            right.append(_right_text(row))
            _draw_row(ax, y, row, metric, trend, view)
        y += step / 2
    ax.axvline(0, color="black", linewidth=0.7, gid="reference zero")
    ax.set_xlim(*view)
    ax.set_ylim(y + 0.2, -0.2)
    ax.set_yticks(ticks, labels, fontsize=7)
    twin = ax.twinx()
    twin.set(ylim=ax.get_ylim(), yticks=ticks, yticklabels=[text for text, _ in right])
    for tick, (_, colour) in zip(twin.get_yticklabels(), right, strict=True):
        tick.set_color(colour)
    twin.tick_params(axis="y", length=0, labelsize=7)
    twin.tick_params(axis="x", which="both", bottom=False, labelbottom=False, top=False, labeltop=False)
    unit = METRICS.get(metric, (metric, metric))[1]
    ax.set_xlabel(f"{unit}: slope per decade of β" if trend else f"{unit}, candidate − baseline")
    ax.grid(alpha=0.3, axis="x")


def _interval(row: dict, metric: str, trend: bool) -> tuple[float, float] | None:
    critical = row.get("critical") if pd.notna(row.get("critical")) else row.get("spread_critical")
    if pd.isna(row.get("effect")) or pd.isna(row.get("se")) or pd.isna(critical):
        return None
    low, high = difference_range(metric, row.get("baseline_mean"), trend)  # a same row: each side its margin end's se
    below, above = (row[k] if pd.notna(row.get(k)) else row["se"] for k in ("se_below", "se_above"))
    return max(row["effect"] - critical * below, low), min(row["effect"] + critical * above, high)


def _view(rows: list[dict], metric: str, trend: bool) -> tuple[float, float]:
    """A panel's x range: every interval, effect, margin and 0, up to CAP times the largest |effect| + se."""
    ends, scale = [0.0], [1e-12]
    for row in rows:
        if pd.notna(row.get("effect")):
            scale.append(abs(row["effect"]) + (row["se"] if pd.notna(row.get("se")) else 0))
            ends += [row["effect"], *(_interval(row, metric, trend) or ())]
            ends += [-row["margin"], row["margin"]] if pd.notna(row.get("margin")) else []
    low, high = max(min(ends), -CAP * max(scale)), min(max(ends), CAP * max(scale))
    pad = 0.05 * (high - low or 1.0)
    return low - pad, high + pad


def _draw_row(ax, y: float, row: dict, metric: str, trend: bool, view: tuple[float, float]) -> None:
    colour = encoding.VERDICT_COLOURS.get(str(row["verdict"]), UNTESTED_COLOUR)
    if pd.notna(row.get("margin")):
        ax.fill_betweenx([y - 0.4, y + 0.4], -row["margin"], row["margin"], color=MARGIN_COLOUR, linewidth=0)
    if pd.isna(row.get("effect")):
        return
    interval = _interval(row, metric, trend)
    if interval is not None:
        low, high = interval
        ax.plot([max(low, view[0]), min(high, view[1])], [y, y], color=colour, linewidth=1.3, gid="interval")
        allowed = difference_range(metric, row.get("baseline_mean"), trend)
        for end, edge, arrow, limit in ((low, view[0], "<", allowed[0]), (high, view[1], ">", allowed[1])):
            if (arrow == "<" and end < edge) or (arrow == ">" and end > edge):
                ax.plot(edge, y, marker=arrow, color=colour, markersize=5)
            elif end == limit:
                ax.plot(end, y, marker="|", color="0.15", markersize=8, markeredgewidth=1.4)
    ax.plot(min(max(row["effect"], view[0]), view[1]), y, "o", color=colour, markersize=4, gid="effect")


def _right_text(row: dict) -> tuple[str, str]:
    """'not shown · z 1.7, critical 31.8 · 2 seeds', in the verdict's colour."""
    parts = [str(row["verdict"])]
    if pd.notna(row.get("z")):
        name = "z inside margin" if row.get("predicted") == "same" else "z"
        parts.append(f"{name} {row['z']:.2g}, critical {row['critical']:.3g}".replace("-", "−"))
    units, seeds = row.get("units", ""), row.get("seeds")
    units = f"{units:g}" if isinstance(units, float) else str(units)
    parts.append(f"{units} questions × {int(seeds)} seeds" if row.get("pair_by") == "questions" and pd.notna(seeds)
                 else f"{units} seeds")  # fmt: skip
    colour = encoding.VERDICT_COLOURS.get(str(row["verdict"]), UNTESTED_COLOUR)
    return " · ".join(parts), colour if colour != UNTESTED_COLOUR else "0.4"


def claims_forest(claims: pd.DataFrame, config: dict, png: Path, metric: str | None = None) -> None:
    """draw_claims_forest, written to ``png`` (a PDF and the caption, <name>.md, beside it)."""
    save(png, *draw_claims_forest(claims, config, metric))
