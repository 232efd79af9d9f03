"""Training dynamics, what a researcher checks first: each study's reward, KL and gradient norm over steps."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib import ticker

from klstudy.figure_plan import training_reference
from klstudy.kl import NO_KL
from klstudy.report.figures.captions import Caption, finish
from klstudy.report.figures.encoding import (
    FULL_WIDTH,
    SINGLE_COLUMN,
    design_text,
    key_handles,
    kl_label,
    legend_below,
    save,
    say_in_panel,
    scale_text,
    step_axis,
    study_name,
    wrap,
)
from klstudy.report.figures.panels import async_text, coinciding, near, smoothed_series, too_short_for_lag
from klstudy.report.figures.series import RAW_SEED_LINES_UP_TO

# Axis labels: what is logged, on which samples (the sampling policy's: with several updates per batch or an
# asynchronous lag it is not π_θ), and the smoothing drawn ({window}: the study's final_steps).
TRAINING_METRICS = {
    "task_reward": "task reward (batch mean)",
    "kl_k3": "KL(π_sampling‖π_ref), nats",
    "grad_norm": "gradient norm",
}
SMOOTHING = "thick: trailing {window}-step mean"
# A metric is drawn on a log axis only where its drawn values span more than this factor (a norm of 0.2 beside one
# of 6 is a flat line at 0 on a linear axis); less, and a log axis only hides how little it moves.
LOG_SPAN = 10.0
# Up to this many thin lines a panel draws every seed's raw steps; more, each series' raw steps averaged over seeds.


def draw_training_figure(study: str, config: dict, tables: dict):
    """A study's training reward, KL to the reference and gradient norm over optimiser steps: one row per metric
    (one y range per row), one column per β (each with the no-KL run, where the study has one); per configuration ×
    β each step as logged (thin) and the trailing mean over the study's final_steps steps (thick), averaged over
    seeds. Returns (figure, caption)."""
    spec = config["studies"][study]
    training = tables["training"]
    training = training[training.study == study]
    has_kl = any(k != NO_KL for k in spec["kl"])
    betas = [float(b) for b in spec["betas"]] if has_kl else [0.0]
    window = spec.get("final_steps", 5)
    reference = training_reference(config, study) or NO_KL
    metrics = [m for m in TRAINING_METRICS if m in training] or list(TRAINING_METRICS)
    width = FULL_WIDTH if len(betas) > 1 else SINGLE_COLUMN
    fig, axes = plt.subplots(len(metrics), len(betas), figsize=(width, 1.9 * len(metrics) + 1.3), squeeze=False,
                             sharex=True, layout="constrained")  # fmt: skip
    caption, notes = Caption(), []
    seeds = training.seed.nunique()
    for col, beta in enumerate(betas):
        rows = training[(training.kl == NO_KL) | np.isclose(training.beta, beta)]
        crowded = rows.groupby(["kl", "beta"]).ngroups * max(seeds, 1) > RAW_SEED_LINES_UP_TO
        for row, metric in enumerate(metrics):
            ax = axes[row, col]
            drawn = smoothed_series(ax, rows, metric, window, crowded, reference) if metric in rows else []
            notes += [f"{TRAINING_METRICS[metric].split(' (')[0]}, β = {beta:g}: {note}" for note in coinciding(ax)]
            ax.grid(alpha=0.3)
            if row == 0:
                with_none = " and no KL" if NO_KL in spec["kl"] and has_kl else ""
                ax.set_title(f"β = {beta:g}{with_none}" if has_kl else "no KL")
            if not drawn:
                say_in_panel(ax, f"no run at β = {beta:g} has logged this yet", y=0.5)
            if col == 0:
                ax.set_ylabel(f"{TRAINING_METRICS[metric]}\n{SMOOTHING.format(window=window)}")
            if row == len(metrics) - 1:
                step_axis(ax, rows.step)
    spans = _scale_rows(axes, metrics, caption)
    for col, beta in enumerate(betas):  # on the axes as scaled: a log axis reads closeness in decades
        for row, metric in enumerate(metrics):
            notes += [
                f"{TRAINING_METRICS[metric].split(',')[0]}, β = {beta:g}: {note}" for note in near(axes[row, col])
            ]
    legend_below(fig, _legend(spec["kl"], betas if has_kl else [], seeds, crowded_any(training, betas, seeds),
                              reference))  # fmt: skip
    fig.suptitle(wrap(f"Training dynamics: {study_name(config, study)}", 40 if width < FULL_WIDTH else 80))
    design = caption.design
    caption.add(
        f"**Training dynamics: {study_name(config, study)}.** "
        + design(f"{scale_text(config, spec['models'])} {design_text(config, study)}, {seeds} seed"
                 f"{'s' if seeds != 1 else ''}."),
        "Rows: the task reward (the batch's mean, no KL term), the K3 estimate of KL(π_sampling‖π_ref) on the batch "
        "the sampling policy drew, and the gradient norm before clipping; columns: β"
        f"{', each with the no-KL run' if NO_KL in spec['kl'] and has_kl else ''}. Thin lines: each step as logged"
        + (design(f" (the mean over seeds in a panel that would hold more than {RAW_SEED_LINES_UP_TO} thin lines, "
                  "each seed's final value then a dot right of the last step, the configurations side by side in "
                  "the order of the legend)")
           if seeds > 1 and crowded_any(training, betas, seeds) else "")
        + design(f"; thick: the trailing mean of the last {window} logged steps up to each step (the window that "
                 "defines the end of training), averaged over seeds. ") + spans,
        design(async_text(spec["train"])) if spec["train"].get("async_level") else "",
        ("The claims on this study are judged on each run's final values (the thick lines' last points), not in this "
         "figure: their verdicts are in the claims table and its forests.")
        if any(c.get("study") == study for c in (config.get("claims") or {}).values()) else "",
        " ".join(f"{n[0].upper()}{n[1:]}." for n in dict.fromkeys(design(n) for n in notes)),
    )  # fmt: skip
    return fig, finish(fig, caption)


def crowded_any(training, betas, seeds) -> bool:
    return any(training[(training.kl == NO_KL) | np.isclose(training.beta, b)].groupby(["kl", "beta"]).ngroups
               * max(seeds, 1) > RAW_SEED_LINES_UP_TO for b in betas)  # fmt: skip


def _scale_rows(axes, metrics: list[str], caption: Caption) -> str:
    """One y range per row; a row whose drawn thick lines span more than LOG_SPAN is drawn on a log axis, and the
    caption says the span it read from them."""
    texts = []
    for row, metric in enumerate(metrics):
        lines = [line for ax in axes[row] for line in ax.get_lines() if not line.get_label().startswith("_")]
        values = [(line, i) for line in lines for i, y in enumerate(line.get_ydata()) if np.isfinite(y) and y > 0]
        low, high = min(ax.get_ylim()[0] for ax in axes[row]), max(ax.get_ylim()[1] for ax in axes[row])
        if values and metric == "grad_norm":
            smallest = min(values, key=lambda v: v[0].get_ydata()[v[1]])
            largest = max(values, key=lambda v: v[0].get_ydata()[v[1]])
            ratio = largest[0].get_ydata()[largest[1]] / smallest[0].get_ydata()[smallest[1]]
            low_text, high_text = (
                caption.value(smallest[0], smallest[1], ".2g"),
                caption.value(largest[0], largest[1], ".2g"),
            )
            span = f"{low_text} to {high_text}"
            if ratio > LOG_SPAN:
                texts.append(f"The gradient norms drawn thick span {span}: a log axis.")
                for ax in axes[row]:
                    ax.set_yscale("log")
                    ax.yaxis.set_major_locator(ticker.LogLocator(subs=(1, 2, 5)))
                    ax.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
                    ax.yaxis.set_minor_formatter(ticker.NullFormatter())
                low, high = min(ax.get_ylim()[0] for ax in axes[row]), max(ax.get_ylim()[1] for ax in axes[row])
            else:
                texts.append(f"The gradient norms drawn thick span {span}: a linear axis.")
        for ax in axes[row]:
            ax.set_ylim(max(low, -0.03 * high) if ax.get_yscale() == "linear" else low, high)
    return " ".join(texts)


def _legend(kls: list[str], betas: list[float], seeds: int, crowded: bool, reference: str) -> list:
    """One entry per configuration (its colour) and one per β (its line style), then the thin lines' meaning; a
    reference other than no KL is named as the claims' baseline."""
    handles = key_handles(kls, [b for b in betas if b])
    for handle in handles:
        if reference != NO_KL and handle.get_label() == kl_label(reference):
            handle.set_label(f"{kl_label(reference)}: the claims' baseline")
            handle.set_linewidth(2.4)
    raw = "thin: each step as logged" + (", each seed" if seeds > 1 and not crowded else "")
    raw += ", the mean over seeds where crowded" if seeds > 1 and crowded else ""
    handles.append(plt.Line2D([], [], color="0.4", linewidth=0.5, label=raw))
    if seeds > 1 and crowded:
        handles.append(plt.Line2D([], [], color="0.4", linestyle="", marker="o", markersize=2.5,
                                  label="dots right of the end: each seed's final value"))  # fmt: skip
    return handles


def training_figure(study: str, config: dict, tables: dict, png: Path) -> None:
    """draw_training_figure, written to ``png`` (and a PDF beside it)."""
    fig, text = draw_training_figure(study, config, tables)
    save(fig, png, text)


__all__ = ["draw_training_figure", "training_figure", "too_short_for_lag"]
