"""The paper's figures, drawn from tidy result tables (never from typed-in numbers); its tables are tables.py's."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from klstudy.kl import PATHWISE, KLSpec  # noqa: E402

ESTIMATOR_COLOURS = {"k1": "tab:blue", "k2": "tab:green", "k3": "tab:red"}
PLACEMENT_STYLES = {"reward": "-", "loss": "--", "both": ":"}
PLACEMENT_MARKERS = {"reward": "o", "loss": "s", "both": "^"}


def save(fig, png: Path) -> None:
    """Write the figure as PNG and as a PDF beside it."""
    png = Path(png)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=150, bbox_inches="tight")
    fig.savefig(png.with_suffix(".pdf"), bbox_inches="tight")
    plt.close(fig)


def fig01_toy_bias_variance(results: pd.DataFrame, tests: pd.DataFrame, png: Path) -> None:
    """Figure 1: squared bias and variance of each configuration's gradient estimate against T.

    One row per setting; columns ∂/∂a and ∂/∂b for squared bias, then for variance; log scale; one
    line per estimator × placement ("none" has no spread and is left out). A filled marker is a bias
    significantly different from zero at its pointwise Bonferroni level (the one Table 1 uses); a
    hollow marker is a bias consistent with zero, whose plotted size is Monte Carlo noise. The frameworks'
    per-token loss corrections (kl.LOSS_GRADIENTS) are in Table 1, not here: this is the paper's figure.
    """
    results = results[(results.placement != "none") & (results.get("loss_gradient", PATHWISE) == PATHWISE)]
    critical = tests.set_index("config")["z_critical"]
    settings = list(dict.fromkeys(results.setting))
    panels = [("squared_bias", "a"), ("squared_bias", "b"), ("variance", "a"), ("variance", "b")]
    fig, axes = plt.subplots(len(settings), 4, figsize=(15, 3.2 * len(settings)), squeeze=False)
    for row, setting in enumerate(settings):
        for col, (metric, param) in enumerate(panels):
            ax = axes[row, col]
            for (config, estimator, placement), line in results[
                (results.setting == setting) & (results.param == param)
            ].groupby(["config", "estimator", "placement"], sort=False):
                line = line.sort_values("T")
                colour = ESTIMATOR_COLOURS.get(estimator, "black")
                ax.plot(
                    line["T"],
                    line[metric],
                    PLACEMENT_STYLES.get(placement, "-."),
                    color=colour,
                    label=f"{estimator.upper()} in {placement}",
                )
                significant = line["z"].abs() > critical[config]
                marker = PLACEMENT_MARKERS.get(placement, "o")
                for mask, face in ((significant, colour), (~significant, "white")):
                    if metric == "variance":
                        face = colour
                    ax.scatter(
                        line["T"][mask],
                        line[metric][mask],
                        marker=marker,
                        color=colour,
                        facecolors=face,
                        zorder=3,
                        s=22,
                    )
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length T")
            what = "squared bias" if metric == "squared_bias" else "variance"
            ax.set_title(f"{setting}: {what}, ∂/∂{param}", fontsize=10)
            ax.grid(alpha=0.3, which="both")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 9), frameon=False)
    fig.suptitle("Bias and variance of KL-gradient estimates in the parametric autoregressive model (§3.3)")
    fig.tight_layout(rect=(0, 0.05, 1, 0.97))
    save(fig, png)


# ---------------------------------------------------------------------------------------------------------
# §4: figures 2-12, from the aggregated tables (klstudy.aggregate).

KL_COLOURS = {
    "none": "black",
    "k1-reward": "tab:blue",
    "k1-loss": "tab:orange",
    "k3-reward": "tab:red",
    "k3-loss": "tab:green",
    "k1-both": "tab:purple",
    "k3-both": "tab:brown",
    "k2-reward": "tab:pink",
    "k2-loss": "tab:olive",
    "k2-both": "tab:cyan",
}
NOT_OK = {"collapsed": "x", "diverged": "X", "missing": "."}


def kl_label(kl_config: str) -> str:
    if kl_config == "base":
        return "base"
    spec = KLSpec.from_name(kl_config)
    if spec.placement == "none":
        return "no KL (β = 0)"
    label = f"{spec.estimator.upper()} in {'reward and loss' if spec.placement == 'both' else spec.placement}"
    return label if spec.loss_gradient == PATHWISE else f"{label} ({spec.loss_gradient})"


def select(table: pd.DataFrame, panel: dict, config: dict) -> pd.DataFrame:
    """The rows of a panel's cells: its study and model, its KL configurations and β (β = 0 for "none")."""
    spec = config["studies"][panel["study"]]
    kls, betas = panel.get("kl", spec["kl"]), [float(b) for b in panel.get("betas", spec["betas"])]
    rows = table[(table.study == panel["study"]) & (table.model == panel["model"]) & table.kl.isin(kls)]
    return rows[(rows.kl == "none") | rows.beta.isin(betas)]


def _line_style(kl_config: str, beta: float, betas: list[float], by_beta: bool) -> dict:
    """Colour by β when a panel shows one KL configuration (plus the β = 0 baseline), else by configuration."""
    if kl_config == "none":
        return {"color": "black", "linestyle": "--"}
    if by_beta:
        shade = (betas.index(beta) + 1) / (len(betas) + 1)
        return {"color": plt.cm.viridis(1 - shade), "linestyle": "-"}
    return {
        "color": KL_COLOURS.get(kl_config, "grey"),
        "linestyle": ["-", ":", "-.", (0, (5, 1))][betas.index(beta) % 4],
    }


def curves_panel(ax, panel: dict, config: dict, tables: dict) -> None:
    """Held-out pass@1 against training step: the mean over seeds (thick) and every seed (thin); a run that
    stopped early (collapsed or diverged) ends in a cross at its last evaluation."""
    heldout, cells = select(tables["heldout"], panel, config), select(tables["cells"], panel, config)
    betas = sorted({float(b) for b in cells.beta if b > 0})
    by_beta = len(set(cells.kl) - {"none"}) == 1
    for (kl_config, beta), group in cells.groupby(["kl", "beta"], sort=False):
        style = _line_style(kl_config, float(beta), betas or [0.0], by_beta)
        runs = heldout[(heldout.kl == kl_config) & (heldout.beta == beta)]
        statuses = group.status.value_counts().to_dict()
        label = kl_label(kl_config) + ("" if kl_config == "none" else f", β = {beta:g}")
        bad = {s: n for s, n in statuses.items() if s != "ok"}
        if bad:
            label += " (" + ", ".join(f"{n}/{len(group)} {s}" for s, n in bad.items()) + ")"
        if runs.empty:
            ax.plot([], [], label=label + " - no data", **style)
            continue
        for seed, run in runs.groupby("seed"):
            ax.plot(run.step, run.pass_at_1, alpha=0.3, linewidth=0.8, **style)
            status = group[group.seed == seed].status.iloc[0]
            if status in NOT_OK:
                ax.scatter(
                    run.step.iloc[-1],
                    run.pass_at_1.iloc[-1],
                    marker=NOT_OK[status],
                    s=60,
                    zorder=4,
                    color=style["color"],
                )
        mean = runs.groupby("step").pass_at_1.mean()
        ax.plot(mean.index, mean.values, linewidth=2, label=label, **style)
    ax.set_xlabel("training step")
    ax.set_ylabel(f"pass@1 on {config['studies'][panel['study']]['heldout_data']}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def seed_spread(rows: pd.DataFrame, value: str, stderr: str | None = None) -> pd.Series:
    """Mean over seeds, the standard deviation over seeds, the number of seeds, and the error bar drawn: the
    spread over seeds when there are several, else the estimate's own standard error."""
    values = rows[value].dropna()
    spread = values.std(ddof=1) if len(values) > 1 else float("nan")
    own = rows[stderr].dropna().mean() if stderr and len(values) == 1 else float("nan")
    return pd.Series(
        {
            "mean": values.mean() if len(values) else float("nan"),
            "seed_std": spread,
            "seeds": len(values),
            "error": spread if len(values) > 1 else own,
        }
    )


def bars_panel(ax, panel: dict, config: dict, tables: dict) -> None:
    """lm-eval mean@k per task: the base model with (CT) and without (No-CT) its chat template, then each KL
    configuration × β (mean over seeds; error bars: standard deviation over seeds, or lm-eval's standard
    error with one seed). Hatched: some seed's run collapsed or diverged. "n/a": not evaluated."""
    evaluations = tables["evaluations"]
    tasks = config["evaluation"]["tasks"]
    base = evaluations[(evaluations.study == "base") & (evaluations.model == panel["model"])]
    groups = [
        (
            f"base ({'CT' if t == 'on' else 'No-CT'})",
            base[base.chat_template == t],
            "lightgrey" if t == "on" else "white",
        )
        for t in sorted(set(base.chat_template), reverse=True)
    ]
    cells = select(evaluations[evaluations.study != "base"], panel, config)
    for (kl_config, beta), rows in cells.groupby(["kl", "beta"], sort=False):
        groups.append((f"{kl_label(kl_config)}, β = {beta:g}", rows, KL_COLOURS.get(kl_config, "grey")))
    width = 0.8 / max(len(groups), 1)
    for g, (label, rows, colour) in enumerate(groups):
        stats = [seed_spread(rows[rows.task == task], "mean_at_k", "stderr") for task in tasks]
        x = [t + (g - (len(groups) - 1) / 2) * width for t in range(len(tasks))]
        unhealthy = (~rows.cell_status.isin(["ok", "base"])).any()
        ax.bar(
            x,
            [st["mean"] for st in stats],
            width,
            yerr=[st["error"] for st in stats],
            color=colour,
            edgecolor="black",
            linewidth=0.5,
            hatch="//" if unhealthy else None,
            capsize=2,
            label=label + (" (collapsed/diverged seeds)" if unhealthy else ""),
        )
        for xi, st in zip(x, stats, strict=True):
            if pd.isna(st["mean"]):
                ax.text(xi, 0.01, "n/a", rotation=90, ha="center", va="bottom", fontsize=6)
    ax.set_xticks(range(len(tasks)), [t.replace("mmlu_college_", "MMLU ") for t in tasks], rotation=20, fontsize=8)
    ax.set_ylabel(f"mean@{config['evaluation']['k']} accuracy")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7)


def divergence_panel(ax, panel: dict, config: dict, tables: dict) -> None:
    """Forward KL(π_ref‖π_θ) (on samples from π_ref) or π_θ's token entropy against training step, with the
    standard error over prompts; one line per cell."""
    rows = select(tables["divergence"], panel, config)
    rows = rows[rows.task == panel["task"]]
    metric = panel["metric"]
    for (kl_config, beta, seed), run in rows.groupby(["kl", "beta", "seed"], sort=False):
        run = run.sort_values("step")
        ax.errorbar(
            run.step,
            run[metric],
            yerr=run[f"{metric}_stderr"],
            marker="o",
            capsize=2,
            color=KL_COLOURS.get(kl_config, "grey"),
            label=f"{kl_label(kl_config)}, β = {beta:g}, seed {seed}",
        )
    ax.set_xlabel("training step")
    ax.set_ylabel("forward KL(π_ref‖π_θ) (nats)" if metric == "forward_kl" else "token entropy of π_θ (nats)")
    ax.set_title(panel["task"], fontsize=9)
    ax.grid(alpha=0.3)
    if not rows.empty:
        ax.legend(fontsize=7)


def kl_vs_beta_panel(ax, panel: dict, config: dict, tables: dict) -> None:
    """KL(π_θ‖π_ref) at the end of training (aggregate.final_values: the last final_steps steps' mean) against β,
    one line per KL configuration from the no-KL run at β = 0: the mean over seeds with the standard deviation over
    seeds as error bars, and each seed as a dot. The legend says whether the end KL is below the no-KL run's at
    every β and falls as β grows (means over seeds)."""
    from klstudy.aggregate import final_values

    final = select(final_values(tables["training"], config), panel, config)
    none = final[final.kl == "none"].kl_k3
    none_mean = none.mean() if len(none) else float("nan")
    for kl_config, rows in final[final.kl != "none"].groupby("kl", sort=False):
        stats = rows.groupby("beta").kl_k3.agg(["mean", "std"]).sort_index()
        x = [0.0, *stats.index]
        y = [none_mean, *stats["mean"]]
        errors = [none.std() if len(none) > 1 else 0.0, *stats["std"].fillna(0.0)]
        falls = (stats["mean"].diff().dropna() < 0).all() and (stats["mean"] < none_mean).all()
        colour = KL_COLOURS.get(kl_config, "grey")
        label = f"{kl_label(kl_config)}: {'falls with β' if falls else 'does not fall with β'}"
        ax.errorbar(x, y, yerr=errors, marker="o", capsize=3, color=colour, label=label)
        ax.scatter(rows.beta, rows.kl_k3, s=10, alpha=0.5, color=colour)
    if len(none):
        ax.scatter([0.0] * len(none), none, s=10, alpha=0.5, color="black", label="no KL (β = 0), each seed")
    ax.set_xscale("symlog", linthresh=min([b for b in final.beta if b > 0], default=0.1))
    ax.set_xlabel("β (0: the no-KL run)")
    last = config["studies"][panel["study"]].get("final_steps", 5)
    ax.set_ylabel(f"KL(π_θ‖π_ref), mean of the last {last} steps (nats)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def kl_curves_panel(ax, panel: dict, config: dict, tables: dict) -> None:
    """KL(π_θ‖π_ref) (the K3 estimate logged each step) against training step: the mean over seeds (thick) and
    every seed (thin), one colour per configuration, one line style per β."""
    training = select(tables["training"], panel, config)
    betas = sorted({float(b) for b in training.beta if b > 0}) or [0.0]
    for (kl_config, beta), runs in training.groupby(["kl", "beta"], sort=False):
        style = _line_style(kl_config, float(beta), betas, by_beta=False)
        for _, run in runs.groupby("seed"):
            ax.plot(run.step, run.kl_k3, alpha=0.3, linewidth=0.8, **style)
        mean = runs.groupby("step").kl_k3.mean()
        label = kl_label(kl_config) + ("" if kl_config == "none" else f", β = {beta:g}")
        ax.plot(mean.index, mean.values, linewidth=2, label=label, **style)
    ax.set_xlabel("training step")
    ax.set_ylabel("KL(π_θ‖π_ref), K3 estimate (nats)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)


PANELS = {
    "curves": curves_panel,
    "bars": bars_panel,
    "divergence": divergence_panel,
    "kl_vs_beta": kl_vs_beta_panel,
    "kl_curves": kl_curves_panel,
}


def paper_figure(name: str, config: dict, tables: dict, png: Path) -> None:
    """A figure of the config's ``figures`` section: its panels side by side."""
    spec = config["figures"][name]
    panels = spec["panels"]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        PANELS[panel["kind"]](ax, panel, config, tables)
        title = panel.get("title", f"{panel['study']} / {panel['model']}")
        ax.set_title(f"{title}\n{ax.get_title()}" if ax.get_title() else title, fontsize=9)
    fig.suptitle(f"{spec['title']} ({config['scale']} scale)")
    fig.tight_layout()
    save(fig, png)
