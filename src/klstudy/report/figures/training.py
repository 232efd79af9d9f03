"""Training dynamics, what a researcher checks first: each study's reward, KL and gradient norm over steps."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib import ticker

from klstudy.kl import NO_KL
from klstudy.report.aggregate import (
    UNCERTAINTY,
)
from klstudy.report.figures.encoding import (
    beta_linestyle,
    caption,
    footnote,
    kl_label,
    run_text,
    save,
    say_in_panel,
    say_why_empty,
    study_name,
    style_of,
)
from klstudy.report.figures.panels import (
    RAW_LINES_UP_TO,
    Drawn,
    async_text,
    coinciding,
    seeds_text,
    share_y,
    step_curves,
    too_short_for_lag,
)

# ---------------------------------------------------------------------------------------------------------
# Training dynamics: what a researcher checks first.

# Axis labels: what is logged, on which samples (the sampling policy's: with several updates per batch or an
# asynchronous lag it is not π_θ), and the smoothing drawn ({window}: the study's final_steps).
TRAINING_METRICS = {
    "task_reward": "task reward, batch mean\n(trailing {window}-step mean)",
    "kl_k3": "KL(π_sampling‖π_ref), K3, nats\n(trailing {window}-step mean)",
    "grad_norm": "gradient norm before clipping\n(trailing {window}-step mean, log)",
}


# A gradient norm spans orders of magnitude across β (0.2 without a penalty, 6 at β = 10): on a shared linear axis the
# small ones are flat lines at 0.
LOG_METRICS = {"grad_norm"}


def draw_training_figure(study: str, config: dict, tables: dict):
    """A study's training reward, KL to the reference and gradient norm over optimiser steps: one row per metric
    (one y range per row), one column per β (each with the no-KL run); per configuration × β each run's trailing mean
    over the study's final_steps steps, then the mean over seeds ± 1 se. Returns (figure, caption)."""
    spec = config["studies"][study]
    training = tables["training"]
    training = training[training.study == study]
    betas = [float(b) for b in spec["betas"]] if any(k != NO_KL for k in spec["kl"]) else [0.0]
    window = spec.get("final_steps", 5)
    metrics = [m for m in TRAINING_METRICS if m in training] or list(TRAINING_METRICS)
    width = 4.3 * len(betas) + 2.6
    fig, axes = plt.subplots(len(metrics), len(betas), figsize=(width, 2.7 * len(metrics) + 1.4), squeeze=False,
                             sharex=True, layout="constrained")  # fmt: skip
    notes = []
    for col, beta in enumerate(betas):
        rows = training[(training.kl == NO_KL) | np.isclose(training.beta, beta)]
        for row, metric in enumerate(metrics):
            ax = axes[row, col]
            seeds = step_curves(ax, rows, metric, window, dodge_width=0.3) if metric in rows else set()
            name = TRAINING_METRICS[metric].split("\n")[0].split(",")[0]
            notes += [f"{name}, β = {beta:g}: {note}." for note in coinciding(ax)]
            ax.grid(alpha=0.3)
            title = "" if row else f"β = {beta:g}" + (" (and no KL)" if NO_KL in spec["kl"] else "")
            ax.set_title("\n".join(filter(None, [title, seeds_text(seeds)])), fontsize=9)
            if not seeds:
                say_why_empty(ax, f"no run of {study} at β = {beta:g} has logged {metric} yet")
            if col == 0:
                ax.set_ylabel(TRAINING_METRICS[metric].format(window=window), fontsize=8)
            if row == len(metrics) - 1:
                ax.set_xlabel("training step")
    if too_short_for_lag(spec["train"]):
        for ax, metric in zip(axes[:, 0], metrics, strict=True):
            if metric in LAGGED_METRICS and ax.lines:
                say_in_panel(ax, LAGGED_METRICS[metric].format(**spec["train"]))
    for row in range(len(metrics)):
        if metrics[row] in LOG_METRICS:
            for ax in axes[row]:
                ax.set_yscale("log")
                ax.yaxis.set_major_locator(ticker.LogLocator(subs=(1, 2, 5)))  # plain numbers: 0.2, 0.5, 1, 2, 5
                ax.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
                ax.yaxis.set_minor_formatter(ticker.NullFormatter())
        share_y(list(axes[row]), [Drawn(metrics[row], empty=None if ax.lines else "") for ax in axes[row]])
    fig.legend(handles=_key_handles(spec["kl"], betas if any(b > 0 for b in betas) else []),
               loc="outside right center", fontsize=8, frameon=False)  # fmt: skip
    fig.suptitle(f"Training dynamics: {study_name(config, study)}", fontsize=11)
    footnote(fig, f"Thick: each run's trailing {window}-step mean, then the mean over n seeds ± 1 se (a "
             f"description, not a test); thin (panels of at most {RAW_LINES_UP_TO} lines): each step as logged."
             "\nKL: the "
             "K3 estimate on the sampling policy's own batch.")  # fmt: skip
    text = TRAINING_CAPTION.format(study=study, description=spec.get("description", study), window=window,
                                   raw=RAW_LINES_UP_TO, run=run_text(config, spec["models"]), uncertainty=UNCERTAINTY,
                                   design=_design_text(spec["train"]))  # fmt: skip
    return fig, caption(text, async_text(spec["train"]), "\n".join(f"- {n}" for n in notes))


TRAINING_CAPTION = """\
**Training dynamics of the study {study}** ({description}). {run} {design}

Rows: the task reward (the batch mean, no KL term), the K3 estimate of KL(π_sampling‖π_ref) per sequence on the batch \
the sampling policy drew (with several updates per batch or an asynchronous lag the sampling policy trails π_θ) and \
the gradient norm before clipping (a log axis: it spans orders of magnitude across β); columns: β, each with the \
no-KL run. Thick lines: each run's value at a step is the mean of its last {window} logged steps up to it (the window \
that defines the end of training, so the KL's last point is the run's final KL), then the {uncertainty}; a band is \
drawn only where n ≥ 2 seeds (one seed's error over steps is not a spread over seeds), and it is a description, not a \
test (the claims table judges differences). Thin lines, in a panel of at most {raw} lines: each step as logged, the \
mean over seeds. Lines are dodged sideways by up to 0.15 steps so that equal values do not hide each other. With \
several updates per generation batch, the reward is logged on the batch's first update only."""


def _design_text(train: dict) -> str:
    return f"{train['batch_prompts']} prompts × {train['rollouts']} completions a batch, {train['steps']} steps."


# What a metric of the sampled batch is in a run no longer than its asynchronous lag (every batch from the initial
# policy), said in the panel.
LAGGED_METRICS = {
    "task_reward": "every batch was sampled by the initial policy\n(async level {async_level}, {steps} steps): "
                   "the reference's reward",
    "kl_k3": "every batch was sampled by the initial policy\n(async level {async_level}, {steps} steps): "
             "0 by construction",
}  # fmt: skip


def _key_handles(kls: list[str], betas: list[float]) -> list:
    """A training figure's legend: one entry per configuration (its colour) and one per β (its line style), not one
    per configuration × β: the columns already say β, and a 19-entry legend is not read."""
    handles = [plt.Line2D([], [], **{**style_of(kl), "linestyle": "-"}, label=kl_label(kl)) for kl in kls]
    handles += [plt.Line2D([], [], color="0.3", linestyle=beta_linestyle(b), label=f"β = {b:g}") for b in betas]
    return handles


def training_figure(study: str, config: dict, tables: dict, png: Path) -> None:
    """draw_training_figure, written to ``png`` (and a PDF beside it)."""
    fig, text = draw_training_figure(study, config, tables)
    save(fig, png, text)
