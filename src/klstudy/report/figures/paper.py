"""The figures of the config's ``figures`` section: panels (panels.py) laid out with the claims' verdicts on them."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from klstudy.report.aggregate import UNCERTAINTY
from klstudy.report.figures.encoding import (
    CLAIM_COLUMNS,
    DODGED,
    VERDICT_COLOURS,
    caption,
    claim_line,
    figure_legend,
    footnote,
    run_text,
    save,
    say_why_empty,
    study_name,
)
from klstudy.report.figures.panels import PANELS, coinciding, seeds_text, share_y

# A panel kind's metric in the claims table (divergence panels: the panel's own metric).
PANEL_METRICS = {"curves": "heldout", "bars": "evaluation", "kl_vs_beta": "final_kl", "kl_curves": "final_kl"}


def panel_claims(claims: pd.DataFrame | None, panel: dict, config: dict) -> pd.DataFrame:
    """The claims table's rows about what a panel draws: its study, model and metric, a candidate it draws."""
    if claims is None or claims.empty:
        return pd.DataFrame(columns=CLAIM_COLUMNS)
    metric = panel.get("metric") if panel["kind"] == "divergence" else PANEL_METRICS.get(panel["kind"])
    spec = config["studies"][panel["study"]]
    kls, betas = panel.get("kl", spec["kl"]), [float(b) for b in panel.get("betas", spec["betas"])]
    rows = claims[(claims.study == panel["study"]) & (claims.metric == metric) & claims.candidate.isin(kls)]
    beta = pd.to_numeric(rows.beta, errors="coerce")
    rows = rows[beta.isna() | (beta == 0) | beta.isin(betas)]  # a panel of one β: that β's claims (and trends)
    return rows[rows.model == panel["model"]] if "model" in rows else rows


def verdicts_text(rows: pd.DataFrame) -> str:
    """A panel's title line from the claims table's verdicts on it, 'claims: 0 of 4 shown', so that a difference the
    eye sees between bars or points is read beside what the rule says of it (each claim's z: the caption)."""
    if rows.empty:
        return ""
    judged = rows[rows.verdict.isin(VERDICT_COLOURS)]  # shown, not shown, contradicted: the rows with a test
    if judged.empty:
        return f"claims: none of {len(rows)} testable here"
    contradicted = (judged.verdict == "contradicted").sum()
    counts = f"{(judged.verdict == 'shown').sum()} of {len(judged)} shown"
    return f"claims: {counts}" + (f", {contradicted} contradicted" if contradicted else "")


def _grid_shape(count: int) -> tuple[int, int]:
    """Rows and columns for a figure's panels: at most three across, four as two by two."""
    columns = 2 if count == 4 else min(count, 3)
    return math.ceil(count / columns), columns


def draw_panels(fig, axes, panels: list[dict], config: dict, tables: dict, claims) -> list[str]:
    """Draw each panel (given the claims table, each panel function sees its rows as tables["claims"]); titles carry
    the panel's n and a count of its claims' verdicts; returns the caption's lines about claims and panels."""
    about = [panel_claims(claims, panel, config) for panel in panels]  # empty without a claims table
    drawn = [PANELS[panel["kind"]](ax, panel, config, {**tables, "claims": rows if claims is not None else None})
             for ax, panel, rows in zip(axes, panels, about, strict=True)]  # fmt: skip
    share_y(axes, drawn)
    lines, listed, notes = [], set(), []
    for ax, panel, d, rows in zip(axes, panels, drawn, about, strict=True):
        title = panel.get("title", study_name(config, panel["study"]))
        if ax.get_title():
            title = f"{title}: {ax.get_title()}"
        verdicts = "" if claims is None or d.empty else verdicts_text(rows)
        ax.set_title("\n".join(filter(None, [title, d.n_text or seeds_text(d.seeds, d.unit), verdicts])), fontsize=9)
        if d.empty:
            say_why_empty(ax, d.empty)
        else:
            new = [f"- {title}: {note}." for note in [*d.notes, *coinciding(ax)]]
            notes += [note for note in dict.fromkeys(new) if note not in notes]
        for row in rows.to_dict("records"):
            line = claim_line(row)
            if line not in listed:
                listed.add(line)
                lines.append(line)
    if claims is not None:
        lines = (
            ["The claims table's verdicts on what these panels show (figures/claims.csv; a difference is a finding "
             "only where it says shown):", "", *[f"- {line}" for line in lines]]
            if lines else ["No claim of the claims table tests what these panels show."]
        )  # fmt: skip
    return notes + lines


SERIES_SE = (
    "Lines, points and bars are the mean over n training seeds (n in each panel's title) with ± 1 standard error: a "
    "description of the runs' spread, not a test. The claims rule reads effect ± critical·se, with critical the larger "
    "of min_z and Student's t at seeds − 1 degrees of freedom{widths}: a gap between two ± 1 se bands is no finding "
    "unless the claims table says shown (the claims figure draws that interval). A series of one seed has no band: "
    "its own error over steps or questions is not a spread over seeds."
)


def series_se_text(claims: pd.DataFrame | None) -> str:
    """SERIES_SE with the critical values the claims table used at each number of seeds (none without a table)."""
    if claims is None or "seeds" not in claims or claims.critical.isna().all():
        return SERIES_SE.format(widths="")
    used = claims.dropna(subset=["critical", "seeds"]).groupby("seeds").critical.min()
    return SERIES_SE.format(widths=" (" + ", ".join(f"{c:.3g} at {int(n)} seeds" for n, c in used.items()) + ")")


IN_IMAGE_SE = (
    "Mean over n seeds (panel titles) ± 1 se; a bar's se includes lm-eval's error over questions (one seed: that "
    "alone).\n"
    "A description, not a test: which differences are findings, the claims figure and this figure's caption say."
)


def draw_paper_figure(name: str, config: dict, tables: dict, claims: pd.DataFrame | None = None):
    """A figure of the config's ``figures`` section: its panels, at most three across, one legend beside them, a
    two-line footnote; returns (figure, caption): the caption holds the run, the uncertainty convention, the panels'
    notes and (given the claims table) the verdicts of the claims about its panels."""
    spec = config["figures"][name]
    panels = spec["panels"]
    rows, columns = _grid_shape(len(panels))
    width = 4.6 * columns + 2.6
    fig, axes = plt.subplots(rows, columns, figsize=(width, 3.6 * rows + 1.0), squeeze=False, layout="constrained")
    axes = axes.ravel()
    for ax in axes[len(panels) :]:
        ax.remove()
    axes = list(axes[: len(panels)])
    lines = draw_panels(fig, axes, panels, config, tables, claims)
    figure_legend(fig, axes, wrap=30)
    fig.suptitle(spec["title"], fontsize=11)
    footnote(fig, IN_IMAGE_SE)
    dodged = DODGED if any(panel["kind"] != "bars" for panel in panels) else ""
    convention = f"{series_se_text(claims)} {UNCERTAINTY[0].upper()}{UNCERTAINTY[1:]}. {dodged}"
    text = caption(f"**{spec['title']}** ({name}). {run_text(config, [p['model'] for p in panels])}", convention,
                   "\n".join(lines))  # fmt: skip
    return fig, text


def paper_figure(name: str, config: dict, tables: dict, png: Path, claims: pd.DataFrame | None = None) -> None:
    """draw_paper_figure, written to ``png`` (a PDF and the caption, <name>.md, beside it)."""
    fig, text = draw_paper_figure(name, config, tables, claims)
    save(fig, png, text)
