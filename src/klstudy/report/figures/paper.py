"""The figures of the config's ``figures`` section: panels (panels.py) laid out at print size, with the claims'
verdicts on them; the caption says what is particular to the figure, its numbers read from the drawn artists."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from klstudy.kl import NO_KL
from klstudy.report.figures.captions import Caption, finish, verdict_lines
from klstudy.report.figures.encoding import (
    CLAIM_COLUMNS,
    FULL_WIDTH,
    SINGLE_COLUMN,
    VERDICT_COLOURS,
    beta_hatch,
    design_parts,
    design_text,
    handles_of,
    key_handles,
    legend_below,
    save,
    scale_text,
    study_name,
    task_name,
    wrap,
)
from klstudy.report.figures.panels import (
    PANELS,
    SEED_END_KEY,
    SEEDS_WITHOUT_BAND,
    coinciding,
    near,
    seeds_text,
    share_y,
)

# A panel kind's metric in the claims table (divergence panels: the panel's own metric).
PANEL_METRICS = {"curves": "heldout", "bars": "evaluation", "kl_vs_beta": "final_kl", "kl_curves": "final_kl"}
LETTERS = "abcdefgh"


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
    eye sees is read beside what the rule says of it."""
    if rows.empty:
        return ""
    judged = rows[rows.verdict.isin(VERDICT_COLOURS)]  # shown, not shown, contradicted: the rows with a test
    if judged.empty:
        return f"claims: none of {len(rows)} testable"
    contradicted = (judged.verdict == "contradicted").sum()
    counts = f"{(judged.verdict == 'shown').sum()} of {len(judged)} shown"
    return f"claims: {counts}" + (f", {contradicted} contradicted" if contradicted else "")


def _grid_shape(panels: list[dict], config: dict) -> tuple[int, int]:
    """Rows and columns for a figure's panels: at most two across (a 7-inch page), four as two by two; one a row
    where a bars panel holds more than CROWDED_BARS bars a task (half a page leaves their labels no room)."""
    count = len(panels)
    columns = 1 if count == 1 or any(_bar_groups(p, config) > CROWDED_BARS for p in panels) else 2
    return math.ceil(count / columns), columns


CROWDED_BARS = 3


def _bar_groups(panel: dict, config: dict) -> int:
    """Bars a task in a bars panel: the base model and each configuration × β."""
    if panel["kind"] != "bars":
        return 0
    spec = config["studies"][panel["study"]]
    kls, betas = panel.get("kl", spec["kl"]), panel.get("betas", spec["betas"])
    return 1 + sum(1 if kl == NO_KL else len(betas) for kl in kls)


CROWDED_CATEGORY = 4  # configurations side by side in one β category that a column's width still keeps apart


def _width(panels: list[dict], config: dict) -> float:
    """One panel of points or curves fits a column; bars of five tasks, two panels, or a panel of more than
    CROWDED_CATEGORY configurations side by side in each β (their seeds' dots beside them) take the page's width."""
    if len(panels) != 1 or panels[0]["kind"] in ("bars", "divergence"):
        return FULL_WIDTH
    panel = panels[0]
    kls = [k for k in panel.get("kl") or config["studies"][panel["study"]]["kl"] if k != NO_KL]
    return FULL_WIDTH if panel["kind"] == "kl_vs_beta" and len(kls) > CROWDED_CATEGORY else SINGLE_COLUMN


def panel_description(panel: dict, config: dict) -> str:
    """What a panel plots, in the caption's words (particular to its kind and data)."""
    study = config["studies"][panel["study"]]
    kind = panel["kind"]
    if kind == "curves":
        every = study["train"].get("eval_every", 10)
        return (f"held-out pass@1 on {task_name(config, study['heldout_data'])} every {every} training steps, from "
                "the base model at step 0")  # fmt: skip
    if kind == "bars":
        base = "the base model with its chat template"
        if panel.get("base_without_template"):
            base += " and, starred, without it (the paper's Baseline (CT) and (No-CT))"
        return (f"lm-eval mean@{config['evaluation']['k']} accuracy of the final policy on each task (temperature 1), "
                f"beside {base}; above each bar, the share of answers from which no answer could be read")  # fmt: skip
    if kind == "kl_vs_beta":
        last = study.get("final_steps", 5)
        return (f"KL(π_sampling‖π_ref) at the end of training, the K3 estimate on the sampled batch averaged over the "
                f"last {last} steps, against β")  # fmt: skip
    if kind == "kl_curves":
        return "KL(π_sampling‖π_ref) during training, the K3 estimate on each step's sampled batch"
    divergence = config["divergence"]
    what = ("forward KL(π_ref‖π_θ), summed over each response sampled from π_ref" if panel["metric"] == "forward_kl"
            else "the mean token entropy of π_θ on its own samples")  # fmt: skip
    return (f"{what}, on the first {divergence['prompts']} prompts of {task_name(config, panel['task'])} "
            f"({divergence['samples']} responses each) at the saved steps")  # fmt: skip


def noise_text(drawn) -> str:
    """What a panel's noise drawing is, particular to its n (the convention itself: figures/README.md)."""
    seeds = {s for s in drawn.seeds if s}
    if not seeds:
        return ""
    if max(seeds) == 1:
        if drawn.unit == "bar":
            return "one seed: each bar's error bar is ±1 se of the measurement itself"
        if not (drawn.has_band or drawn.has_error_bars):  # a smoothed training curve: its raw steps show its noise
            return "one seed: no band; the thin line, each step as logged, shows its noise"
        return "one seed: the " + ("band" if drawn.has_band else "bar") + " is ±1 se of the measurement itself"
    if max(seeds) <= SEEDS_WITHOUT_BAND:
        if drawn.unit == "bar":
            return "each seed a dot on its bar, the bar the mean over seeds, no error bar"
        if drawn.seed_key == SEED_END_KEY:  # a crowded panel
            return ("each seed's last evaluation a dot right of the end (its lines would be a tangle), the mean over "
                    "seeds thick, no band")
        return "each seed thin, the mean over seeds thick, no band"
    return "the mean over seeds with ±1 se" + (" error bars" if drawn.unit == "bar" else " band")


def draw_panels(axes, panels: list[dict], config: dict, tables: dict, claims) -> list:
    """Draw each panel (given the claims table, each panel function sees its rows as tables["claims"]); returns
    [(axes, panel, Drawn, claims rows)]."""
    about = [panel_claims(claims, panel, config) for panel in panels]  # empty without a claims table
    drawn = [PANELS[panel["kind"]](ax, panel, config, {**tables, "claims": rows if claims is not None else None})
             for ax, panel, rows in zip(axes, panels, about, strict=True)]  # fmt: skip
    share_y(axes, drawn)
    return list(zip(axes, panels, drawn, about, strict=True))


def panel_title(panel: dict, config: dict) -> str:
    """The config's title of a panel, else what it draws (a divergence panel) or its study's name."""
    if "title" in panel:
        return panel["title"]
    if panel["kind"] == "divergence":
        return "forward KL" if panel["metric"] == "forward_kl" else "entropy"
    return study_name(config, panel["study"])


def differing_designs(panels: list[dict], config: dict) -> list[str]:
    """Each panel's design in the parts in which the panels differ ('16 prompts × 8 completions a step, 1 update
    per batch'); empty strings when they share one design."""
    parts = [design_parts(config, p["study"], p["model"]) for p in panels]
    differ = [key for key in parts[0] if len({p[key] for p in parts}) > 1] if parts else []
    return [", ".join(p[key] for key in differ) for p in parts]


def draw_paper_figure(name: str, config: dict, tables: dict, claims: pd.DataFrame | None = None):
    """A figure of the config's ``figures`` section at print size: its panels (two across), one legend under them;
    a panel with nothing to show (constant data, no results) is dropped and said in the caption. Panels of studies
    of different designs carry their designs in their titles and the title says so. Returns (figure, caption)."""
    spec = config["figures"][name]
    panels = spec["panels"]
    rows, columns = _grid_shape(panels, config)
    width = _width(panels, config)
    fig, axes = plt.subplots(rows, columns, figsize=(width, 2.5 * rows + 1.2), squeeze=False, layout="constrained")
    axes = list(axes.ravel())
    for ax in axes[len(panels) :]:
        ax.remove()
    results = draw_panels(axes[: len(panels)], panels, config, tables, claims)
    designs = dict(zip([id(p) for p in panels], differing_designs(panels, config), strict=True))
    kept = [r for r in results if not r[2].empty]
    for ax, _, drawn, _ in results:
        if drawn.empty:
            ax.remove()
    _relayout(fig, [k[0] for k in kept], width)
    mixed = any(designs.values())
    title = spec["title"] + (" (panels of different designs)" if mixed else "")
    fig.suptitle(wrap(title, 70 if width == FULL_WIDTH else 40))
    caption = Caption()
    lines, notes, verdict_rows = [], [], []
    for i, (ax, panel, drawn, rows_about) in enumerate(kept):
        letter = f"({LETTERS[i]}) " if len(kept) > 1 else ""
        head = letter + panel_title(panel, config)
        if ax.get_title():
            head = f"{head}: {ax.get_title()}"
        design = ", ".join(part for part in designs[id(panel)].split(", ") if part and part not in head)
        title_lines = [head, textwrap.fill(design, 48), seeds_text(drawn.seeds, drawn.unit),
                       "" if claims is None else verdicts_text(rows_about)]  # fmt: skip
        ax.set_title("\n".join(filter(None, title_lines)))
        what = caption.design(panel_description(panel, config))
        noise = noise_text(drawn)
        studies = " beside ".join(study_name(config, s) for s in [panel["study"], *panel.get("with", [])])
        design_said = ", ".join(part for part in design_text(config, panel["study"]).split(", ")
                                if part not in studies)  # a study's name may say its batch already  # fmt: skip
        line = caption.design(f"{letter}{what[0].upper()}{what[1:]}; {studies}, "
                              f"{design_said}") + (f"; {noise}." if noise else ".")  # fmt: skip
        if drawn.own_scale:
            line += (" Its y axis is its own, not the other panels' of its quantity: its values stay under a third "
                     "of theirs.")  # fmt: skip
        base = [f"{label} {caption.value(artist, style=drawn.quote_style)}" for label, artist in drawn.quoted
                if label.startswith("base model")]  # fmt: skip
        series = [(label, artist) for label, artist in drawn.quoted if not label.startswith("base model")]
        values = [f"{label} {caption.value(artist, style=drawn.quote_style)}" for label, artist in series]
        if base or values:
            line += " Drawn: " + "; ".join([*base, *(
                [f"last point{_last_x(drawn)}: " + "; ".join(values)] if values else [])]) + "."  # fmt: skip
        lines.append(line)
        notes += [caption.design(note) for note in drawn.notes] + coinciding(ax) + near(ax)
        verdict_rows += rows_about.to_dict("records")
    notes += [f"not drawn: {panel_title(r[1], config)}, {r[2].empty}" for r in results
              if r[2].empty]  # fmt: skip
    legend_below(fig, _legend(kept, config))
    notes = list(dict.fromkeys(notes))
    caption.add(f"**{title}.** {caption.design(scale_text(config, [p['model'] for p in panels]))}", " ".join(lines),
                " ".join(f"{n[0].upper()}{n[1:]}." for n in notes))  # fmt: skip
    if claims is not None:
        verdicts = [caption.design(v) for v in verdict_lines(verdict_rows)]
        caption.add("Claims about these panels (the claims table's verdicts; effects, intervals and z: the claims "
                    "forest): " + "; ".join(verdicts) + "." if verdicts else
                    "No claim of the claims table tests what these panels show.")  # fmt: skip
    return fig, finish(fig, caption)


def _last_x(drawn) -> str:
    """' (step 15)' when every quoted series ends at one step."""
    return f" (step {next(iter(drawn.last_x))})" if len(drawn.last_x) == 1 else ""


def _relayout(fig, axes, width: float) -> None:
    """After dropping panels: the figure's height for the panels left."""
    if not axes:
        return
    rows = len({round(ax.get_position().y0, 3) for ax in axes})
    fig.set_size_inches(width, 2.5 * rows + 1.2)


def _legend(kept, config: dict) -> list:
    """The legend: each configuration (colour and marker) and each β (line style; bars: hatching) once, then what
    else is drawn (base model, chance, seeds, bands, rings). A figure of bars alone names each bar group."""
    kls, betas, bars_only = [], [], all(panel["kind"] == "bars" for _, panel, _, _ in kept)
    for _, panel, _, _ in kept:
        spec = config["studies"][panel["study"]]
        beside = [kl for other in panel.get("with", []) for kl in config["studies"][other]["kl"]]
        kls += [kl for kl in [*panel.get("kl", spec["kl"]), *beside] if kl not in kls]
        if panel["kind"] != "kl_vs_beta":
            betas += [float(b) for b in panel.get("betas", spec["betas"]) if float(b) not in betas]
    labelled = handles_of([k[0] for k in kept])
    if bars_only:
        handles = [h for h in labelled if not _is_extra(h.get_label()) or h.get_label() == "base model"]
    else:
        handles = key_handles(kls, sorted(betas) if any(k != NO_KL for k in kls) else [])
        if any(panel["kind"] == "bars" for _, panel, _, _ in kept):
            handles += [plt.Rectangle((0, 0), 1, 1, facecolor="white", edgecolor="0.2", hatch=beta_hatch(b),
                                      label=f"bars: β = {b:g}") for b in sorted(betas)]  # fmt: skip
    extra = [h for h in labelled if _is_extra(h.get_label()) and h.get_label() not in [x.get_label() for x in handles]]
    if any(d.has_band for _, _, d, _ in kept):
        extra.append(plt.Rectangle((0, 0), 1, 1, color="0.6", alpha=0.3, label="band: ±1 se, one seed"))
    if any(d.has_error_bars for _, _, d, _ in kept):
        bar = plt.Line2D([], [], color="0.4", marker="|", markersize=9, linewidth=0, label="bar: ±1 se, one seed")
        extra.append(bar)
    for key in dict.fromkeys(d.seed_key for _, _, d, _ in kept if d.has_seeds and d.unit == "point"):
        dot = key.startswith(("small dot", "dot"))
        extra.append(plt.Line2D([], [], color="0.4", linewidth=0 if dot else 0.6, marker="." if dot else "",
                                label=key))  # fmt: skip
    return handles + extra


def _is_extra(label: str) -> bool:
    return label.startswith(("base model", "chance", "ring:", "one seed", "collapsed", "diverged", "missing"))


def paper_figure(name: str, config: dict, tables: dict, png: Path, claims: pd.DataFrame | None = None) -> None:
    """draw_paper_figure, written to ``png`` (a PDF and the caption, <name>.md, beside it)."""
    fig, text = draw_paper_figure(name, config, tables, claims)
    save(fig, png, text)
