"""Training dynamics, what a researcher checks first: each study's reward, KL and gradient norm over steps."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from klstudy.figure_plan import is_result, training_reference
from klstudy.kl import NO_KL
from klstudy.report.figures import encoding
from klstudy.report.figures.captions import PIPELINE_CHECK, Caption, finish, table
from klstudy.report.figures.encoding import design_text, key_handles, kl_label, save, scale_text, step_axis, study_name
from klstudy.report.figures.panels import async_text, smoothed_series

# What is logged, on the sampling policy's batch (with several updates a batch or a lag it is not π_θ).
TRAINING_METRICS = {"task_reward": "task reward (batch mean)", "kl_k3": "KL(π_sampling‖π_ref), nats",
                    "grad_norm": "gradient norm"}  # fmt: skip


def draw_training_figure(study: str, config: dict, tables: dict):
    """A study's task reward, KL to the reference and gradient norm over steps: a row per metric (one y range per
    row, the gradient norm on a log axis), a column per β with the no-KL run; each seed's steps thin, the trailing
    mean over the study's final_steps steps thick. Returns (figure, caption)."""
    spec = config["studies"][study]
    training = tables["training"][tables["training"].study == study]
    has_kl = any(k != NO_KL for k in spec["kl"])
    betas = [float(b) for b in spec["betas"]] if has_kl else [0.0]
    window = spec.get("final_steps", 5)
    metrics = [m for m in TRAINING_METRICS if m in training] or list(TRAINING_METRICS)
    width = encoding.FULL_WIDTH if len(betas) > 1 else encoding.SINGLE_COLUMN
    fig, axes = plt.subplots(len(metrics), len(betas), figsize=(width, 1.8 * len(metrics) + 1.3), squeeze=False,
                             sharex=True, sharey="row", layout="constrained")  # fmt: skip
    caption, values = Caption(), []
    columns = [training[(training.kl == NO_KL) | np.isclose(training.beta, beta)] for beta in betas]
    each_seed = max(c.groupby(["kl", "beta"]).seed.nunique().sum() for c in columns) <= encoding.MAX_SEED_LINES
    for col, (beta, rows) in enumerate(zip(betas, columns, strict=True)):
        for row, metric in enumerate(metrics):
            ax = axes[row, col]
            for label, line, _ in smoothed_series(ax, rows, metric, window, each_seed) if metric in rows else []:
                if metric == "kl_k3":
                    values.append([label, caption.value(line, style=".2g")])
            ax.grid(alpha=0.3)
            if metric == "grad_norm" and ax.get_lines():
                ax.set_yscale("log")
            if row == 0:
                ax.set_title(f"β = {beta:g}" + (" and no KL" if NO_KL in spec["kl"] else "") if has_kl else "no KL")
            if col == 0:
                ax.set_ylabel(TRAINING_METRICS[metric])
            if row == len(metrics) - 1:
                step_axis(ax, rows.step)
    seeds = training.seed.nunique()
    reference = training_reference(config, study)
    keys = key_handles(spec["kl"], [b for b in betas if b])
    for handle in keys:  # what the others are read against: no KL, or the claims' baseline
        if reference not in (None, NO_KL) and handle.get_label() == kl_label(reference):
            handle.set_label(f"{kl_label(reference)}: the claims' baseline")
    seeds_key = ("thin: each step as logged, each seed", {"linewidth": 0.5}) if each_seed else (
        "dot: each seed's end (trailing mean)", {"marker": "o", "linestyle": "", "markersize": 3})
    encoding.legend_below(fig, keys + [plt.Line2D([], [], color="0.4", label=seeds_key[0], **seeds_key[1]), plt.Line2D(
        [], [], color="0.4", linewidth=1.6, label=f"thick: mean over seeds of the trailing {window}-step mean")])
    name = study_name(config, study)
    fig.suptitle(f"Training dynamics: {name}", wrap=True)
    caption.add("" if is_result(config, f"training_{study}") else PIPELINE_CHECK,
        f"**Training dynamics: {name}.** " + caption.design(
            f"{scale_text(config, spec['models'])} {design_text(config, study, name)}, "
            f"{seeds} seed{'s' if seeds != 1 else ''}. "
            "Rows: task reward, the K3 estimate of the KL on each batch, gradient norm before clipping (log axis); "
            "columns: β. ") + (f"Read against {'no KL' if reference == NO_KL else 'the claims baseline'}. " if reference
                               else "") + caption.design(async_text(spec["train"])),
        table(["series", f"KL at the end (trailing {caption.number(window)}-step mean)"], values) if values else "",
    )  # fmt: skip
    return fig, finish(fig, caption)


def training_figure(study: str, config: dict, tables: dict, png: Path) -> None:
    """draw_training_figure, written to ``png`` (and a PDF beside it)."""
    save(png, *draw_training_figure(study, config, tables))
