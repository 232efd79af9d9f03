"""The paper's figures and tables, drawn from tidy result tables (never from typed-in numbers)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from klstudy import kl  # noqa: E402

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
    hollow marker is a bias consistent with zero, whose plotted size is Monte Carlo noise.
    """
    results = results[results.placement != "none"]
    critical = tests.set_index(["estimator", "placement"])["z_critical"]
    settings = list(dict.fromkeys(results.setting))
    panels = [("squared_bias", "a"), ("squared_bias", "b"), ("variance", "a"), ("variance", "b")]
    fig, axes = plt.subplots(len(settings), 4, figsize=(15, 3.2 * len(settings)), squeeze=False)
    for row, setting in enumerate(settings):
        for col, (metric, param) in enumerate(panels):
            ax = axes[row, col]
            for (estimator, placement), line in results[
                (results.setting == setting) & (results.param == param)
            ].groupby(["estimator", "placement"], sort=False):
                line = line.sort_values("T")
                colour = ESTIMATOR_COLOURS.get(estimator, "black")
                ax.plot(
                    line["T"],
                    line[metric],
                    PLACEMENT_STYLES.get(placement, "-."),
                    color=colour,
                    label=f"{estimator.upper()} in {placement}",
                )
                significant = line["z"].abs() > critical[(estimator, placement)]
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


def table1(tests: pd.DataFrame) -> pd.DataFrame:
    """Table 1: estimator, expression, placement, and the measured verdict on the gradient's bias.

    "Behaviour" (§4.1) comes from training runs, which this table does not yet read.
    """
    rows = tests[tests.placement != "none"]
    return pd.DataFrame(
        {
            "estimator": rows.estimator.str.upper(),
            "expression": rows.estimator.map(kl.EXPRESSIONS),
            "placement": rows.placement,
            "unbiased_gradient": rows.unbiased.map({True: "yes", False: "no"}),
            "max_abs_z": rows.max_abs_z.round(1),
            "z_critical": rows.z_critical.round(2),
            "worst_case": rows.worst_case,
            "behaviour": "not yet measured (training study)",
        }
    ).sort_values(["estimator", "placement"], key=lambda c: c.map(_placement_order) if c.name == "placement" else c)


def _placement_order(placement: str) -> int:
    return kl.PLACEMENTS.index(placement)


def write_table(table: pd.DataFrame, md: Path, csv: Path, caption: str) -> None:
    Path(md).parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(csv, index=False)
    header = "| " + " | ".join(table.columns) + " |"
    rule = "| " + " | ".join("---" for _ in table.columns) + " |"
    body = ["| " + " | ".join(str(v) for v in row) + " |" for row in table.itertuples(index=False)]
    Path(md).write_text("\n".join([caption, "", header, rule, *body, ""]))
