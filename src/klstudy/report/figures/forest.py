"""The claims forests: one figure per metric, each testable claim of the claims table in its words, its rows (one
per β) drawn as effect ± critical·se, the interval the verdict reads, coloured by the verdict."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from klstudy.claims_rule import critical_value
from klstudy.figure_plan import CLAIMS_FIGURE, testable_by_design
from klstudy.report.figures.captions import PREDICTED_WORDS, Caption, claim_beta, claim_words, finish
from klstudy.report.figures.encoding import (
    FULL_WIDTH,
    MAX_HEIGHT,
    UNTESTED_COLOUR,
    VERDICT_COLOURS,
    save,
    scale_text,
    short_number,
    study_name,
    verdict_colour,
)

CLAIM_METRIC_UNITS = {
    "final_kl": "KL(π_sampling‖π_ref) at the end of training, nats",
    "heldout": "held-out pass@1 at the last evaluation",
    "evaluation": "lm-eval mean@k, averaged over the claim's tasks",
    "forward_kl": "forward KL(π_ref‖π_θ) at the last snapshot, nats",
    "entropy": "token entropy of π_θ at the last snapshot, nats",
}
METRIC_TITLES = {
    "final_kl": "Claims on the KL to the reference at the end of training",
    "heldout": "Claims on held-out pass@1 during training",
    "evaluation": "Claims on the evaluation of the final policy",
    "forward_kl": "Claims on the forward KL to the base policy",
    "entropy": "Claims on the policy's entropy",
}
# The values a metric can take, for the range its differences can reach (candidate − baseline, the baseline's mean b
# known): a proportion lies in [0, 1], so a difference in [−b, 1 − b]; a KL or an entropy is ≥ 0, so ≥ −b.
PROPORTION_METRICS = {"heldout", "evaluation"}
NON_NEGATIVE_METRICS = {"final_kl", "forward_kl", "entropy"}
RANGE_WORDS = {
    "proportion": "a difference of two scores between 0 and 1 lies in [−b, 1 − b] for a baseline b",
    "non-negative": "a difference of two non-negative quantities is at least −b for a baseline b",
}
MARGIN_COLOUR = "0.85"  # a same claim's margin: neither a verdict's colour nor a configuration's
ROW_INCHES = 0.17  # one row at 7 pt
CAP = 40.0  # a panel spans every interval, up to this many times its largest |effect| + se (then an arrow)


def difference_range(metric: str, baseline_mean: float, trend: bool) -> tuple[float, float]:
    """The range of candidate − baseline that the metric allows (a trend's slope: unbounded)."""
    known = pd.notna(baseline_mean)
    b = float(baseline_mean) if known else 0.0
    if trend:
        return -math.inf, math.inf
    if metric in PROPORTION_METRICS:
        return (-b, 1.0 - b) if known else (-1.0, 1.0)
    if metric in NON_NEGATIVE_METRICS and known:
        return -b, math.inf
    return -math.inf, math.inf


def _is_trend(rows: pd.DataFrame) -> pd.Series:
    return rows.get("note", pd.Series("", index=rows.index)).fillna("").astype(str).str.startswith("trend")


def forest_rows(claims: pd.DataFrame, config: dict, metric: str) -> tuple[pd.DataFrame, list[str]]:
    """The metric's rows of the claims testable by design (config.testable_by_design), with each row's margin in the
    metric's units; and the words of the claims left out (one paired seed by design)."""
    rows = claims[claims.metric == metric].copy()
    specs = config.get("claims", {})
    testable = rows.claim.map(lambda c: c not in specs or testable_by_design(config, specs[c]))
    left_out = list(dict.fromkeys(claim_words(t) for t in rows[~testable].get("text", rows[~testable].claim)))
    rows = rows[testable]
    margins = {name: c.get("margin") for name, c in specs.items()}
    rows["margin"] = [(margins.get(name) or math.nan) * abs(b) if pd.notna(b) else math.nan
                      for name, b in zip(rows.claim, rows.get("baseline_mean", math.nan), strict=True)]  # fmt: skip
    # A row without a prediction has no verdict, but its spread over seeds is drawn as the others' is: the critical
    # value its seeds would have been judged with (claims_rule.critical_value), so that it looks no surer than they.
    rule = config.get("claims_rule") or {}
    unjudged = rows.critical.isna() & rows.se.notna() & (rows.get("df", pd.Series(math.nan, index=rows.index)) >= 1)
    rows["spread_critical"] = math.nan
    if unjudged.any() and {"alpha", "min_z"} <= set(rule):
        rows.loc[unjudged, "spread_critical"] = critical_value(rows.loc[unjudged, "df"], rule)
    return rows, left_out


def _entries(rows: pd.DataFrame, wrap: int = 80, studies: dict | None = None) -> list[tuple[str, str, dict | None]]:
    """The forest's lines: per claim a header (its words, its prediction and, given ``studies`` (study: its name),
    the study it reads; written across the panel, wrapped at ``wrap`` characters), then one line per row (its β on
    the axis)."""
    entries = []
    for _, claim in rows.groupby("claim", sort=False):
        records = claim.to_dict("records")
        first = records[0]
        words = claim_words(first.get("text", first["claim"]))
        predicted = PREDICTED_WORDS.get(str(first.get("predicted")), "")
        study = f"; in {studies[first['study']]}" if studies and first.get("study") in studies else ""
        entries.append(("header", textwrap.fill(f"{words} ({predicted}{study})", wrap), None))
        entries += [("row", claim_beta(r) or "", r) for r in records]
    return entries


def draw_claims_forest(claims: pd.DataFrame, config: dict, metric: str | None = None):
    """One metric's claims (``metric``: the first metric with testable claims when not given): a panel of effect ±
    critical·se per row (a row without a prediction: the same, thin and hollow, no verdict; trends over β, in their
    own units per decade of β, a panel of their own), the interval clipped to what the metric allows (a | where
    clipped), coloured by the verdict; a claim of no difference shows its margin as a grey band around 0; verdict, z
    against its critical value and the paired units on the right. The claims' headings are wrapped to lie inside the
    panel's frame (drawn again, narrower, where one would cross it).
    Returns (figure, caption)."""
    wrap = 80
    for _ in range(4):
        fig, text = _draw_claims_forest(claims, config, metric, wrap)
        overshoot = _heading_overshoot(fig)
        if overshoot <= 1.0:
            break
        plt.close(fig)
        wrap = max(20, int(wrap / overshoot) - 2)
    return fig, text


def _heading_overshoot(fig) -> float:
    """The largest width a claim's heading needs over what its panel's frame leaves it (≤ 1: every heading fits)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    worst = 0.0
    for ax in fig.axes:
        frame = ax.get_window_extent(renderer)
        for text in ax.texts:
            box = text.get_window_extent(renderer)
            worst = max(worst, (box.x1 - frame.x0) / max(frame.width, 1.0))
    return worst


def _draw_claims_forest(claims: pd.DataFrame, config: dict, metric: str | None, wrap: int):
    metric = metric or next(iter(dict.fromkeys(claims.metric)), "final_kl")
    rows, left_out = forest_rows(claims, config, metric)
    trend = _is_trend(rows)
    groups = [(key, part) for key, part in (("", rows[~trend]), (" trend", rows[trend])) if len(part)]
    # a forest of claims on several studies names each claim's (two claims can compare the same configurations)
    read = list(dict.fromkeys(rows.get("study", pd.Series(dtype=str)).dropna()))
    studies = {s: study_name(config, s) for s in read} if len(read) > 1 else None
    entries = [_entries(part, wrap, studies) for _, part in groups] or [[]]
    heights = [sum(1 + e[1].count("\n") * 0.8 for e in ent) + 1.5 for ent in entries]
    height = min(MAX_HEIGHT, ROW_INCHES * sum(heights) + 1.1)
    fig, axes = plt.subplots(len(heights), 1, figsize=(FULL_WIDTH, height), squeeze=False, height_ratios=heights,
                             layout="constrained")  # fmt: skip
    caption = Caption()
    for ax, (key, _), ent in zip(axes[:, 0], groups, entries, strict=False):
        _forest_panel(ax, metric, bool(key), ent)
    title = METRIC_TITLES.get(metric, f"Claims on {metric}")
    fig.suptitle(f"{title}: effect ± critical·se, the interval the verdict reads")
    handles = [plt.Line2D([], [], color=c, marker="o", label=v) for v, c in VERDICT_COLOURS.items()
               if v in set(rows.verdict)]  # fmt: skip
    drawn = [line for ax in axes[:, 0] for line in ax.get_lines()]
    hollow = sum(line.get_gid() == "effect" and line.get_markerfacecolor() == "white" for line in drawn)
    if hollow > sum(line.get_gid() == "unjudged interval" for line in drawn):  # some without a spread over seeds
        handles.append(plt.Line2D([], [], color=UNTESTED_COLOUR, marker="o", markerfacecolor="white", linestyle="",
                                  label="no interval (not testable, or no prediction)"))  # fmt: skip
    if any(line.get_gid() == "unjudged interval" for line in drawn):
        handles.append(plt.Line2D([], [], color=UNTESTED_COLOUR, marker="o", markerfacecolor="white", linewidth=0.9,
                                  label="no prediction: effect ± critical·se, no verdict"))  # fmt: skip
    if any(line.get_marker() == "|" for line in drawn):
        handles.append(plt.Line2D([], [], color="0.15", marker="|", markersize=8, linestyle="",
                                  label="clipped at the range the metric allows"))  # fmt: skip
    if any(line.get_marker() in ("<", ">") for line in drawn):
        handles.append(plt.Line2D([], [], color="0.3", marker=">", linestyle="", label="runs past the panel"))
    if rows.get("margin", pd.Series(dtype=float)).notna().any():
        handles.append(plt.Rectangle((0, 0), 1, 1, color=MARGIN_COLOUR, label="margin of a claim of no difference"))
    fig.legend(handles=handles, loc="outside lower center", ncols=2)
    models = rows.model.dropna().unique() if "model" in rows else []
    design = caption.design
    caption.add(
        f"**{title}.** {design(scale_text(config, models)) if len(models) else ''}",
        f"Each claim of the claims table on {CLAIM_METRIC_UNITS.get(metric, metric)}, in its words and with its "
        "prediction, then one line per β: the effect, candidate − baseline (the mean over paired seeds, or over "
        "held-out questions and seeds), with the interval effect ± critical·se that the verdict rule reads, coloured "
        "by the verdict; the interval is clipped at the range the metric allows (marked by a short upright bar: "
        + design(RANGE_WORDS["proportion" if metric in PROPORTION_METRICS else "non-negative"]) + "). "
        + (_containing_zero(axes[:, 0]) if len(rows) else ""),
        _right_words(rows, config, caption) if len(rows) else "",
        ("A claim that the KL falls as β grows is tested as a slope over the β grid, per seed: the lower panel, in "
         "units per decade of β." if trend.any() else ""),
        design("Not drawn, with one paired seed by design (the rule judges the spread between seeds, so they cannot "
               "be tested): " + "; ".join(left_out) + ".") if left_out else "",
    )  # fmt: skip
    return fig, finish(fig, caption)


def _right_words(rows: pd.DataFrame, config: dict, caption: Caption) -> str:
    """What the right-hand column prints, defined: the verdict, z (or z inside margin) beside the critical value, and
    the paired units the se is taken over; and a claim of no difference's margin, from the config."""
    same = rows.get("predicted", pd.Series(dtype=object)) == "same"
    words = ("Right of each line: its verdict; z, the effect ÷ its se signed towards the prediction (positive where "
             "the effect goes the predicted way), beside the critical value the rule compares it with")  # fmt: skip
    if same.any():
        words += ("; for a claim of no difference (predicted the same), z inside margin: how far the effect lies "
                  "inside the nearer end of its margin, in se (the smaller of the two one-sided tests' z, each end "
                  "tested seed by seed; negative: outside)")  # fmt: skip
    words += "; and the paired units its se is taken over (training seeds, or held-out questions × seeds)."
    specs = config.get("claims", {})
    margins = sorted({float(specs[c]["margin"]) for c in rows[same].claim.unique()
                      if c in specs and specs[c].get("margin") is not None})  # fmt: skip
    if margins:
        fractions = ", ".join(caption.number(m) for m in margins)
        words += (
            f" The margin of a claim of no difference, the grey band around zero, is ± {fractions} × the "
            "mean of the claim's baseline."
        )
    return words


def _containing_zero(axes) -> str:
    """What the drawn intervals say as a whole, read from them: whether every one holds 0."""
    intervals = [line for ax in axes for line in ax.get_lines() if line.get_gid() == "interval"]
    if not intervals:
        return ""
    holding = [min(line.get_xdata()) <= 0 <= max(line.get_xdata()) for line in intervals]
    if all(holding):
        return "Every interval drawn holds zero: with these seeds no difference could be shown either way."
    return ""


def _forest_panel(ax, metric: str, trend: bool, entries: list) -> None:
    """One panel: the entries top down; the verdict, z and n on the right (a twin axis' tick labels, so that the
    layout keeps room for them)."""
    data = [e[2] for e in entries if e[2] is not None]
    view = _view(data, metric, trend)
    y, ticks, labels, right = 0.0, [], [], []
    for kind, text, row in entries:
        step = 1 + text.count("\n") * 0.8
        y += step / 2
        if kind == "header":  # the claim's words across the panel, above its rows
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
    twin.set_ylim(ax.get_ylim())
    twin.set_yticks(ticks, [text for text, _ in right], fontsize=7)
    for tick, (_, colour) in zip(twin.get_yticklabels(), right, strict=True):
        tick.set_color(colour)
    twin.tick_params(axis="y", length=0)
    twin.tick_params(axis="x", which="both", bottom=False, labelbottom=False, top=False, labeltop=False)
    unit = CLAIM_METRIC_UNITS.get(metric, metric)
    ax.set_xlabel(f"{unit}: slope per decade of β, mean over seeds" if trend else f"{unit}, candidate − baseline")
    ax.grid(alpha=0.3, axis="x")


def _view(rows: list[dict], metric: str, trend: bool) -> tuple[float, float]:
    """A panel's x range: every interval (clipped to the metric's range), effect, margin and 0, up to CAP times the
    largest |effect| + se either side."""
    ends, scale = [0.0], []
    for row in rows:
        effect, se, critical = row.get("effect"), row.get("se"), row.get("critical")
        critical = critical if pd.notna(critical) else row.get("spread_critical")  # a row without a prediction's too
        if pd.isna(effect):
            continue
        scale.append(abs(effect) + (0 if pd.isna(se) else se))
        low, high = difference_range(metric, row.get("baseline_mean"), trend)
        if pd.notna(se) and pd.notna(critical):
            ends += [max(effect - critical * se, low), min(effect + critical * se, high)]
        margin = row.get("margin", math.nan)
        ends += [effect] + ([-margin, margin] if pd.notna(margin) else [])
    cap = CAP * max(scale or [1.0])
    low, high = max(min(ends), -cap), min(max(ends), cap)
    pad = 0.05 * (high - low or 1.0)
    return low - pad, high + pad


def _draw_row(ax, y: float, row: dict, metric: str, trend: bool, view: tuple[float, float]) -> None:
    """effect ± critical·se clipped to the metric's range (a | where clipped) and to the panel (an arrow where it
    runs past), coloured by the verdict; a claim of no difference's margin as a grey band; no verdict: hollow, its
    interval (a row without a prediction: as its seeds would be judged) thin."""
    colour = verdict_colour(row["verdict"])
    x, se, critical = row["effect"], row.get("se"), row.get("critical")
    judged = pd.notna(se) and pd.notna(critical)
    if pd.notna(row.get("margin")):
        ax.fill_betweenx([y - 0.4, y + 0.4], -row["margin"], row["margin"], color=MARGIN_COLOUR, linewidth=0)
    if pd.isna(x):
        return
    critical = critical if judged else row.get("spread_critical")
    if pd.notna(se) and pd.notna(critical):
        low_allowed, high_allowed = difference_range(metric, row.get("baseline_mean"), trend)
        low, high = max(x - critical * se, low_allowed), min(x + critical * se, high_allowed)
        ax.plot([max(low, view[0]), min(high, view[1])], [y, y], color=colour, linewidth=1.3 if judged else 0.9,
                gid="interval" if judged else "unjudged interval")  # fmt: skip
        for end, clipped, edge, arrow in ((low, x - critical * se < low_allowed, view[0], "<"),
                                          (high, x + critical * se > high_allowed, view[1], ">")):  # fmt: skip
            if (end < view[0] and arrow == "<") or (end > view[1] and arrow == ">"):
                ax.plot(edge, y, marker=arrow, color=colour, markersize=5)
            elif clipped:
                ax.plot(end, y, marker="|", color="0.15", markersize=8, markeredgewidth=1.4)
    if judged:
        ax.plot(x, y, "o", color=colour, markersize=4, gid="effect")
    else:
        ax.plot(min(max(x, view[0]), view[1]), y, "o", color=colour, markerfacecolor="white", markersize=4,
                gid="effect")  # fmt: skip


def _right_text(row: dict) -> tuple[str, str]:
    """'not shown · z 1.7, critical 31.8 · 2 seeds', in the verdict's colour."""
    parts = [str(row["verdict"])]
    if pd.notna(row.get("z")):
        name = "z inside margin" if row.get("predicted") == "same" else "z"
        parts.append(f"{name} {short_number(row['z']).replace('-', '−')}, critical {short_number(row['critical'], 3)}")
    parts.append(_units_text(row))
    colour = verdict_colour(row["verdict"])
    return " · ".join(parts), colour if colour != UNTESTED_COLOUR else "0.4"


def _units_text(row) -> str:
    """The paired units the se is taken over: '4 seeds', or '100 questions × 4 seeds' for a claim paired by question
    (its degrees of freedom are the seeds')."""
    seeds, units = row.get("seeds"), row.get("units", "")
    units = f"{units:g}" if isinstance(units, float) else str(units)
    if row.get("pair_by") == "questions" and pd.notna(seeds):
        return f"{units} questions × {int(seeds)} seeds"
    return f"{units} seeds" if row.get("pair_by", "seeds") == "seeds" else f"{units} paired units"


def claims_forest(claims: pd.DataFrame, config: dict, png: Path, metric: str | None = None) -> None:
    """draw_claims_forest, written to ``png`` (a PDF and the caption, <name>.md, beside it)."""
    fig, text = draw_claims_forest(claims, config, metric)
    save(fig, png, text)


def claims_forests(claims: pd.DataFrame, config: dict, out_dir: Path) -> list[Path]:
    """Every forest of config.claims_figures: figures/claims_forest_<metric>.png (and PDF, caption)."""
    from klstudy.figure_plan import claims_figures

    written = []
    for name in claims_figures(config):
        metric = Path(name).name.removeprefix(f"{CLAIMS_FIGURE}_")
        png = Path(out_dir) / f"{Path(name).name}.png"
        claims_forest(claims, config, png, metric)
        written.append(png)
    return written
