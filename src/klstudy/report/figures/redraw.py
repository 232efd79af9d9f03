"""Every figure of a run from its tables alone (no training): the workflow's figure rules draw from the same tables,
and a shipped folder (docs/embedded, docs/separation, docs/smollm2, docs/toy) keeps them in tables/ so that a change
of figure code redraws it with

    python -m klstudy redraw docs/embedded

tables/ holds what the figures read: the aggregated tables (cells, training, heldout, evaluations, divergence; the
held-out per-question scores left out), config.yaml (the run's validated config), claims.csv, and for the toy model
its CSVs (toy/<setting>.csv, toy/unbiasedness.csv, toy_fixed_points.csv, toy_monte_carlo.csv,
toy/frontier/<family>.csv; atlas.csv, atlas_length.csv). tables/figures.txt, where present, lists the figures the
folder ships (one name a line); without it every figure the tables allow is drawn. Also figures/README.md. The
folder keeps each PNG and its caption (the workflow writes a PDF too).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import yaml

from klstudy.figure_plan import (
    CLAIMS_FIGURE,
    claims_figures,
    lag_only,
    testable_by_design,
    training_figures,
    training_reference,
)
from klstudy.report.figures.captions import conventions, verdict_lines

README = "README.md"
# Where a toy report's Markdown leaves the figure's caption for its table (stages.py writes it between them).
TABLE_MARK = "<!-- the table -->"


def readme(config: dict) -> str:
    """figures/README.md: the conventions every figure shares, then what this run's figures leave out and why."""
    left = []
    for study, spec in config["studies"].items():
        if lag_only(spec["train"]):
            train = spec["train"]
            left.append(f"- No training figure for the study “{spec.get('description', study)}”: its "
                        f"{train['steps']} steps are no more than its asynchronous lag of {train['async_level']} steps "
                        "plus one, so every batch it trained on was sampled by the initial policy; its KL to the "
                        "reference is 0 and its reward the reference's at every step, by construction.")  # fmt: skip
        elif not training_reference(config, study):
            shown = [f"“{figure['title']}”" for figure in config.get("figures", {}).values()
                     if any(study in (p["study"], *p.get("with", [])) for p in figure["panels"])]  # fmt: skip
            where = f"its held-out curves are drawn in {', '.join(shown)}" if shown else "no figure draws it"
            left.append(f"- No training figure for the study “{spec.get('description', study)}”: it has no no-KL "
                        "run, and no claim compares its configurations with one another, so its curves have nothing "
                        f"drawn to be read against; {where}.")  # fmt: skip
    untestable = [name for name, claim in config.get("claims", {}).items() if not testable_by_design(config, claim)]
    if untestable:
        words = verdict_lines([{"claim": n, "text": config["claims"][n]["text"], "verdict": "not testable"}
                               for n in untestable])  # fmt: skip
        left.append("- Claims that pair one seed by design are in the claims table as not testable and in no claims "
                    "forest (a forest of untestable points would show nothing): " + "; ".join(
                        w.removesuffix(": not testable") for w in words) + ".")  # fmt: skip
    run = ("\n\nThis run\n--------\n\n" + "\n".join(left) + "\n") if left else ""
    return conventions(config) + run


def write_readme(config: dict, path: Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(readme(config))


def _wanted(tables: Path) -> set[str] | None:
    listed = tables / "figures.txt"
    if not listed.is_file():
        return None
    return {line.strip() for line in listed.read_text().splitlines() if line.strip() and not line.startswith("#")}


def _keep_table(md: Path, caption: str, name: str) -> None:
    """A toy report's Markdown: the image, the new caption, then its table as it was (after TABLE_MARK)."""
    old = md.read_text() if md.is_file() else ""
    table = old.split(TABLE_MARK, 1)[1] if TABLE_MARK in old else ""
    md.write_text(f"![{name}]({name}.png)\n\n{caption.strip()}\n\n{TABLE_MARK}{table}")


def redraw(folder: Path, tables: Path | None = None) -> list[str]:
    """Draw into ``folder`` every figure its tables (``folder``/tables unless given) allow, or those tables/figures.txt
    lists; returns the names drawn."""
    from klstudy.report import aggregate
    from klstudy.report.figures import atlas, atlas_length, forest, paper, toy, training
    from klstudy.report.figures.encoding import read_claims

    folder = Path(folder)
    tables = Path(tables) if tables else folder / "tables"
    wanted = _wanted(tables)
    config = yaml.safe_load((tables / "config.yaml").read_text())
    drawn = []

    def want(name: str) -> bool:
        return wanted is None or name in wanted

    if (tables / "cells.csv").is_file():
        read = aggregate.read_tables(tables)
        claims = read_claims(tables / "claims.csv") if (tables / "claims.csv").is_file() else None
        for name in config.get("figures", {}):
            if want(name):
                paper.paper_figure(name, config, read, folder / f"{name}.png", claims)
                drawn.append(name)
        for target in training_figures(config):
            name = Path(target).name
            if want(name):
                training.training_figure(name.removeprefix("training_"), config, read, folder / f"{name}.png")
                drawn.append(name)
        for target in claims_figures(config) if claims is not None else []:
            name = Path(target).name
            if want(name):
                forest.claims_forest(claims, config, folder / f"{name}.png", name.removeprefix(f"{CLAIMS_FIGURE}_"))
                drawn.append(name)
        write_readme(config, folder / README)
    settings = config.get("toy", {}).get("settings", {})
    if settings and all((tables / "toy" / f"{s}.csv").is_file() for s in settings) and want("fig01_toy_bias_variance"):
        results = pd.concat([pd.read_csv(tables / "toy" / f"{s}.csv") for s in settings], ignore_index=True)
        toy.fig01_toy_bias_variance(results, pd.read_csv(tables / "toy" / "unbiasedness.csv"),
                                    folder / "fig01_toy_bias_variance.png", config["toy"].get("settings"))  # fmt: skip
        drawn.append("fig01_toy_bias_variance")
    if (tables / "toy_fixed_points.csv").is_file() and want("toy_fixed_points"):
        fronts = pd.concat([pd.read_csv(p) for p in sorted((tables / "toy" / "frontier").glob("*.csv"))])
        text = toy.toy_fixed_points_figure(pd.read_csv(tables / "toy_fixed_points.csv"), fronts,
                                           pd.read_csv(tables / "toy_monte_carlo.csv"), config["toy"]["fixed_points"],
                                           folder / "toy_fixed_points.png")  # fmt: skip
        from klstudy.analysis.monte_carlo import fixed_points_markdown  # the table written again, in words
        from klstudy.report.figures.encoding import config_words

        table = fixed_points_markdown(pd.read_csv(tables / "toy_fixed_points.csv"), config_words)
        (folder / "toy_fixed_points.md").write_text(
            f"![toy_fixed_points](toy_fixed_points.png)\n\n{text.strip()}\n\n{TABLE_MARK}\n\n{table}"
        )
        drawn.append("toy_fixed_points")
    if (tables / "atlas.csv").is_file() and want("atlas"):
        from klstudy.analysis.effective_beta import EFFECTIVE_BETA_RANGE

        text = atlas_length.draw(pd.read_csv(tables / "atlas.csv"), pd.read_csv(tables / "atlas_length.csv"),
                          folder / "atlas.png", config["toy"]["atlas"], beta_min=EFFECTIVE_BETA_RANGE[0])  # fmt: skip
        _keep_table(folder / "atlas.md", text, "atlas")
        drawn += ["atlas", atlas.LENGTH_FIGURE]  # its caption written beside it
    for name in drawn:  # a shipped folder keeps the PNG and its caption; the PDF is the workflow's
        (folder / f"{name}.pdf").unlink(missing_ok=True)
    return drawn
