"""Every figure of a run from its tables alone (`klstudy redraw docs/embedded`): a shipped folder keeps in tables/
what its figures read (the aggregated tables, config.yaml, claims.csv, the toy model's and atlas's CSVs; figures.txt,
where present, the figures it ships), its README.md its results and pipeline checks, linking the conventions page."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import yaml

from klstudy.figure_plan import CLAIMS_FIGURE, claims_figures, is_result, lag_only, training_figures
from klstudy.report.figures.captions import conventions

README = "README.md"
CONVENTIONS_PAGE = "figures.md"  # docs/figures.md: how to read every figure, said once
TABLE_MARK = "<!-- the table -->"  # where a toy report's Markdown leaves the figure's caption for its table
EXACT = ("fig01_toy_bias_variance", "toy_fixed_points", "atlas", "atlas_grid", "atlas_length")  # always results


def readme(config: dict, drawn: list[str] | None = None, link: str | None = None) -> str:
    """A run's figures/README.md: the conventions (or, ``link``ed, a pointer to them), then its figures as results
    and as pipeline checks (``drawn``: a shipped folder's; default: all the config draws), studies with no figure."""
    if drawn is None:
        drawn = [*config.get("figures", {}), *[Path(t).name for t in training_figures(config)],
                 *[Path(t).name for t in claims_figures(config)]]  # fmt: skip
    results = [n for n in drawn if n in EXACT or is_result(config, n)]
    checks = [n for n in drawn if n not in results]
    parts = [f"# The figures of this folder\n\nHow to read them: [the conventions]({link}).\n" if link
             else conventions(config)]  # fmt: skip
    if results:
        parts.append("Results (a comparison in them can be told from noise at this scale):\n\n"
                     + "\n".join(f"- [{n}]({n}.png)" for n in results) + "\n")  # fmt: skip
    if checks:
        parts.append("Pipeline checks (drawn by every run; nothing in them is testable at this scale, their claims "
                     "pair too few seeds):\n\n" + "\n".join(f"- [{n}]({n}.png)" for n in checks) + "\n")  # fmt: skip
    lagged = [spec.get("description", s) for s, spec in config.get("studies", {}).items() if lag_only(spec["train"])]
    if lagged and any(n not in EXACT for n in drawn):
        parts.append("No training figure for " + "; ".join(lagged) + ": every batch it trained on was sampled by "
                     "the initial policy, so its KL is 0 throughout.\n")  # fmt: skip
    return "\n".join(parts)


def write_readme(config: dict, path: Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(readme(config))


def _with_table(md: Path, name: str, caption: str, table: str) -> None:
    """A toy report's Markdown: the image, the caption, then its table after TABLE_MARK."""
    md.write_text(f"![{name}]({name}.png)\n\n{caption.strip()}\n\n{TABLE_MARK}{table}")


def redraw(folder: Path, tables: Path | None = None) -> list[str]:
    """Draw into ``folder`` every figure its tables (``folder``/tables unless given) allow, or those tables/figures.txt
    lists; write its README.md and the conventions page beside it; returns the names drawn."""
    from klstudy.report import aggregate
    from klstudy.report.figures import atlas, forest, paper, toy, training
    from klstudy.report.figures.encoding import read_claims, save

    folder = Path(folder)
    tables = Path(tables) if tables else folder / "tables"
    listed = tables / "figures.txt"  # the figures the folder ships, one a line (without it: every figure)
    names = listed.read_text().splitlines() if listed.is_file() else None
    wanted = None if names is None else {n.strip() for n in names if n.strip()[:1] not in ("", "#")}
    config = yaml.safe_load((tables / "config.yaml").read_text())
    drawn = []

    want = lambda name: wanted is None or name in wanted  # a figure the folder ships
    if (tables / "cells.csv").is_file():
        read = aggregate.read_tables(tables)
        claims = read_claims(tables / "claims.csv") if (tables / "claims.csv").is_file() else None
        for name in [n for n in config.get("figures", {}) if want(n)]:
            paper.paper_figure(name, config, read, folder / f"{name}.png", claims)
            drawn.append(name)
        for name in [Path(t).name for t in training_figures(config) if want(Path(t).name)]:
            training.training_figure(name.removeprefix("training_"), config, read, folder / f"{name}.png")
            drawn.append(name)
        for name in [Path(t).name for t in claims_figures(config) if want(Path(t).name)] if claims is not None else []:
            forest.claims_forest(claims, config, folder / f"{name}.png", name.removeprefix(f"{CLAIMS_FIGURE}_"))
            drawn.append(name)
    settings = config.get("toy", {}).get("settings", {})
    if settings and all((tables / "toy" / f"{s}.csv").is_file() for s in settings) and want(EXACT[0]):
        results = pd.concat([pd.read_csv(tables / "toy" / f"{s}.csv") for s in settings], ignore_index=True)
        save(folder / f"{EXACT[0]}.png", *toy.draw_fig01(results, pd.read_csv(tables / "toy" / "unbiasedness.csv"),
                                                          settings))  # fmt: skip
        drawn.append(EXACT[0])
    if (tables / "toy_fixed_points.csv").is_file() and want("toy_fixed_points"):
        from klstudy.analysis.monte_carlo import fixed_points_markdown
        from klstudy.report.figures.encoding import config_words

        points = pd.read_csv(tables / "toy_fixed_points.csv")
        fronts = pd.concat([pd.read_csv(p) for p in sorted((tables / "toy" / "frontier").glob("*.csv"))])
        fig, text = toy.draw_toy_fixed_points(points, fronts, pd.read_csv(tables / "toy_monte_carlo.csv"),
                                              config["toy"]["fixed_points"])  # fmt: skip
        save(folder / "toy_fixed_points.png", fig)
        _with_table(folder / "toy_fixed_points.md", "toy_fixed_points", text,
                    f"\n\n{fixed_points_markdown(points, config_words)}")  # fmt: skip
        drawn.append("toy_fixed_points")
    if (tables / "atlas.csv").is_file() and want("atlas"):
        text = atlas.draw(pd.read_csv(tables / "atlas.csv"), pd.read_csv(tables / "atlas_length.csv"),
                          folder / "atlas.png", config["toy"]["atlas"])  # fmt: skip
        old = (folder / "atlas.md").read_text() if (folder / "atlas.md").is_file() else ""
        _with_table(folder / "atlas.md", "atlas", text, old.split(TABLE_MARK, 1)[1] if TABLE_MARK in old else "")
        drawn += ["atlas", atlas.GRID_FIGURE, atlas.LENGTH_FIGURE]
    for name in drawn:  # a shipped folder keeps the PNG and its caption; the PDF is the workflow's
        (folder / f"{name}.pdf").unlink(missing_ok=True)
    (folder / README).write_text(readme(config, drawn, f"../{CONVENTIONS_PAGE}"))
    (folder.parent / CONVENTIONS_PAGE).write_text(conventions(config))
    return drawn
