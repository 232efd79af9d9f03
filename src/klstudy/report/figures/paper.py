"""The figures of the config's ``figures`` section: their panels (panels.py) two across, one legend under them, the
claims' verdicts in each panel's title; the caption a few sentences and a table of the values it reads from the
drawn artists."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from klstudy import figure_plan
from klstudy.figure_plan import is_result
from klstudy.kl import NO_KL
from klstudy.report.figures import encoding
from klstudy.report.figures.captions import PIPELINE_CHECK, Caption, finish, table
from klstudy.report.figures.encoding import beta_hatch, design_text, key_handles, name_data, scale_text, study_name
from klstudy.report.figures.panels import MULTIPLE_CHOICE_PREFIX, PANELS, SEEDS_WITHOUT_BAND, share_y

LETTERS = "abcdefgh"


def panel_claims(claims: pd.DataFrame | None, panel: dict, config: dict) -> pd.DataFrame:
    """The claims table's rows about what a panel draws (figure_plan.panel_claims), at its model and a β it draws."""
    if claims is None or claims.empty:
        return pd.DataFrame(columns=encoding.CLAIM_COLUMNS)
    betas = [float(b) for b in panel.get("betas", config["studies"][panel["study"]]["betas"])]
    rows = claims[claims.claim.isin(figure_plan.panel_claims(config, panel))]
    beta = pd.to_numeric(rows.beta, errors="coerce")
    return rows[(beta.isna() | (beta == 0) | beta.isin(betas)) & (rows.get("model", panel["model"]) == panel["model"])]


def verdicts_text(rows: pd.DataFrame) -> str:
    """A panel's title line: 'claims: 0 of 4 shown'."""
    judged = rows[rows.verdict.isin(encoding.VERDICT_COLOURS)]
    if rows.empty:
        return ""
    if judged.empty:
        return f"claims: none of {len(rows)} testable"
    contradicted = (judged.verdict == "contradicted").sum()
    return (f"claims: {(judged.verdict == 'shown').sum()} of {len(judged)} shown"
            + (f", {contradicted} contradicted" if contradicted else ""))  # fmt: skip


def panel_description(panel: dict, config: dict) -> str:
    """What a panel plots, in the caption's words."""
    study = config["studies"][panel["study"]]
    kind = panel["kind"]
    if kind == "curves":
        return f"held-out pass@1 on {encoding.task_name(config, study['heldout_data'])}"
    if kind == "bars":
        base = " (and, starred, without its chat template)" if panel.get("base_without_template") else ""
        return f"lm-eval mean@{config['evaluation']['k']} of the final policy per task, beside the base model{base}"
    if kind in ("kl_vs_beta", "kl_curves"):
        return "KL(π_sampling‖π_ref), the K3 estimate on the sampled batches" + (
            f", the mean of the last {study.get('final_steps', 5)} steps" if kind == "kl_vs_beta" else "")
    what = "forward KL(π_ref‖π_θ)" if panel["metric"] == "forward_kl" else "token entropy of π_θ"
    return f"{what}, {encoding.task_name(config, panel['task'])}"


def noise_text(seeds: set[int]) -> str:
    """A panel's title line on its n: 'one seed', '2 seeds, each drawn', '5 seeds, mean ± 1 se'."""
    seeds = sorted({s for s in seeds if s})
    if not seeds or seeds[-1] == 1:
        return "one seed" if seeds else ""
    kind = ", each drawn" if seeds[-1] <= SEEDS_WITHOUT_BAND else ", mean ± 1 se"
    return f"{'–'.join(map(str, sorted({seeds[0], seeds[-1]})))} seeds{kind}"


def panel_title(panel: dict, config: dict) -> str:
    if "title" in panel:
        return name_data(config, panel["title"])
    if panel["kind"] == "divergence":
        return "forward KL" if panel["metric"] == "forward_kl" else "entropy"
    return study_name(config, panel["study"])


def draw_paper_figure(name: str, config: dict, tables: dict, claims: pd.DataFrame | None = None):
    """A figure of the config's ``figures`` section at print size: its panels two across (one a row where a panel
    has bars), one legend under them; a panel with nothing to show is dropped and said. Returns (figure, caption)."""
    spec = config["figures"][name]
    panels = spec["panels"]
    columns = 1 if len(panels) == 1 or any(p["kind"] == "bars" for p in panels) else 2
    rows = math.ceil(len(panels) / columns)
    width = encoding.FULL_WIDTH
    fig, axes = plt.subplots(rows, columns, figsize=(width, 2.4 * rows + 1.2), squeeze=False, layout="constrained")
    axes = list(axes.ravel())
    for ax in axes[len(panels) :]:
        ax.remove()
    about = [panel_claims(claims, p, config) for p in panels]
    drawn = [PANELS[p["kind"]](ax, p, config, {**tables, "claims": r if claims is not None else None})
             for ax, p, r in zip(axes, panels, about, strict=False)]  # fmt: skip
    share_y(axes[: len(panels)], drawn)
    kept = [(ax, p, d, r) for ax, p, d, r in zip(axes, panels, drawn, about, strict=False) if d.empty is None]
    for ax in [ax for ax, d in zip(axes, drawn, strict=False) if d.empty]:
        ax.remove()
    if len(kept) < len(panels) and kept:
        fig.set_size_inches(width, 2.4 * math.ceil(len(kept) / columns) + 1.2)
    title = name_data(config, spec["title"])
    fig.suptitle(title, wrap=True)
    caption = Caption()
    lines, values, verdict_rows = [], [], []
    for i, (ax, panel, d, rows_about) in enumerate(kept):
        letter = f"({LETTERS[i]}) " if len(kept) > 1 else ""
        head = [letter + panel_title(panel, config), noise_text(d.seeds)]
        head += [verdicts_text(rows_about)] if claims is not None else []
        ax.set_title("\n".join(filter(None, [ax.get_title() if panel["kind"] == "divergence" else "", *head])))
        lines.append(caption.design(panel_description(panel, config)))
        values += [[f"{letter}{label}", caption.value(artist, style=d.quote_style)] for label, artist in d.quoted]
        verdict_rows += rows_about.to_dict("records")
    names = [" beside ".join(study_name(config, s) for s in [p["study"], *p.get("with", [])]) for _, p, _, _ in kept]
    designs = list(dict.fromkeys(caption.design(", ".join(filter(None, [n, design_text(config, p["study"], n)])))
                                 for n, (_, p, _, _) in zip(names, kept, strict=True)))  # fmt: skip
    checks = [f"({LETTERS[i]})" for i, (_, _, d, _) in enumerate(kept) if d.seeds == {1} and len(kept) > 1]
    encoding.legend_below(fig, _legend(kept, config))
    dropped = [f"{panel_title(p, config)}: {d.empty}" for p, d in zip(panels, drawn, strict=True) if d.empty]
    summary = [verdicts_text(pd.DataFrame(verdict_rows))] if verdict_rows else []
    judged = [r for r in verdict_rows if r["verdict"] in encoding.VERDICT_COLOURS]
    trends = sum(str(r.get("note")).startswith("trend") for r in judged)  # slopes over β: drawn in a forest only
    lines = [f"({LETTERS[i]}) {line}" for i, line in enumerate(lines)] if len(set(lines)) > 1 else lines[:1]
    caption.add("" if is_result(config, name) else PIPELINE_CHECK,
        (f"{' and '.join(checks)}: a pipeline check, one seed, nothing testable in it. " if checks and
         is_result(config, name) else "")
        + f"**{title}.** {caption.design(scale_text(config, [p['model'] for p in panels]))} "
        + "; ".join(lines)[:1].upper() + "; ".join(lines)[1:]
        + ". " + (" ".join(f"({LETTERS[i]}) {d}." for i, d in enumerate(designs)) if 1 < len(designs) == len(kept)
                  else "; ".join(designs)[:1].upper() + "; ".join(designs)[1:] + ".")
        + (" Answers are sampled and read from the text, one that cannot be read counting as wrong: a "
           "multiple-choice task can score below chance (its line)." if any(
               p["kind"] == "bars" for _, p, _, _ in kept) and any(t.startswith(MULTIPLE_CHOICE_PREFIX)
                                                                    for t in config["evaluation"]["tasks"]) else "")
        + (" Not drawn: " + caption.design("; ".join(dropped)) + "." if dropped else "")
        + (caption.design(f" The claims table: {summary[0].removeprefix('claims: ')} (the claims forests" + (
            f"; {trends} of the {len(judged)} are slopes over β, drawn there only" if trends else "") + ").")
           if summary else ""), table(["series", "last value drawn"], values) if values else "")  # fmt: skip
    return fig, finish(fig, caption)


def _legend(kept, config: dict) -> list:
    """Each configuration (colour, marker) and β (line style, hatching) once, then base, chance, seeds, rings."""
    kls, betas, labelled = [], [], {}
    for ax, panel, _, _ in kept:
        spec = config["studies"][panel["study"]]
        beside = [kl for other in panel.get("with", []) for kl in config["studies"][other]["kl"]]
        kls += [kl for kl in [*panel.get("kl", spec["kl"]), *beside] if kl not in kls]
        betas += [float(b) for b in panel.get("betas", spec["betas"]) if panel["kind"] != "kl_vs_beta"]
        labelled.update(zip(*reversed(ax.get_legend_handles_labels()), strict=True))
    betas = sorted(set(betas)) if any(k != NO_KL for k in kls) else []
    handles = key_handles(kls, [] if all(p["kind"] == "bars" for _, p, _, _ in kept) else betas)  # no β line drawn
    if any(panel["kind"] == "bars" for _, panel, _, _ in kept):
        handles += [plt.Rectangle((0, 0), 1, 1, facecolor="white", edgecolor="0.2", hatch=beta_hatch(b),
                                  label=f"bars: β = {b:g}") for b in betas]  # fmt: skip
    extra = ("base model", "chance", "ring:", "one seed", "collapsed", "diverged")
    return handles + [h for label, h in labelled.items() if label.startswith(extra)]


def paper_figure(name: str, config: dict, tables: dict, png: Path, claims: pd.DataFrame | None = None) -> None:
    """draw_paper_figure, written to ``png`` (a PDF and the caption, <name>.md, beside it)."""
    encoding.save(png, *draw_paper_figure(name, config, tables, claims))
