"""The §3 analysis's stages as `klstudy` subcommands (stages.py's convention): the toy model's bias and variance,
Figure 1, its fixed points and Monte Carlo runs, and the atlas. Each imports what it needs inside its function."""

from __future__ import annotations

import functools
import time
from pathlib import Path

from klstudy.run.devices import threads as _threads
from klstudy.run.subcommands import JSON, PNG, THREADS, as_json, command, opt, req

STAGES: dict[str, tuple] = {}  # subcommand: (its function, its help, its options), the first of stages.STAGES
stage = functools.partial(command, STAGES)

FAMILY = {"family": req("tabular or parametric")}
TOY = {"settings": as_json("the config's toy section")}
REPORT = {"settings": as_json("the config's toy section and claims_rule")}


def _read_csvs(paths: list[str]):
    import pandas as pd

    return pd.concat([pd.read_csv(path) for path in paths], ignore_index=True)


def _to_csv(table, out: str, what: str, start: float) -> None:
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(out, index=False)
    print(f"{what}: {len(table)} rows in {time.perf_counter() - start:.2f}s -> {out}")


@stage("toy", "§3.3 Monte Carlo bias and variance for one (a, b, a_ref, b_ref) setting",
       setting=req("a name under the toy section's settings"), **TOY, **THREADS,
       out=req("bias and variance per configuration and T (CSV)"))  # fmt: skip
def _toy(args):
    from klstudy.analysis import toy

    _threads(args.threads)
    section, start = args.settings, time.perf_counter()
    setting = toy.ToySetting(args.setting, **section["settings"][args.setting])
    results = toy.bias_variance(
        setting, section["lengths"], section["estimators"], section["placements"], section["trials"],
        section["sequences"], section["seed"], section["baseline"], section["loss_gradients"],
    )  # fmt: skip
    _to_csv(results, args.out, f"toy setting {args.setting}", start)


@stage("toy-tests", "per-configuration test of 'the gradient is unbiased'",
       inputs=req("the toy jobs' CSV files, one per setting", nargs="+"),
       settings=as_json("the config's toy section (its alpha)"),
       out=req("one row per configuration: unbiased or not (CSV)"))  # fmt: skip
def _toy_tests(args):
    from klstudy.analysis import toy

    tests = toy.unbiasedness_tests(_read_csvs(args.inputs), args.settings["alpha"])
    tests.to_csv(args.out, index=False)
    print(tests.to_string(index=False))


@stage("toy-fixed-points", "exact fixed points and frontier of one toy policy family", **FAMILY, **TOY, **THREADS,
       out=req("the fixed points (CSV)"), frontier=req("the family's reward-KL frontier (CSV)"))  # fmt: skip
def _toy_fixed_points(args):
    from klstudy.analysis import fixed_points, toy

    _threads(args.threads)
    section, start = args.settings, time.perf_counter()
    # Table 1's configurations: the toy section's estimators × placements and loss gradients.
    configs = [spec.name for spec in toy.config_specs(section["estimators"], section["placements"],
                                                      section["loss_gradients"])]  # fmt: skip
    points, front = fixed_points.exact_tables(section["fixed_points"], configs, args.family)
    print(points.drop(columns="theta").to_string(index=False))
    _to_csv(front, args.frontier, f"toy frontier, {args.family}", start)
    _to_csv(points, args.out, f"toy fixed points, {args.family}", start)


@stage("toy-monte-carlo", "toy training by sampled updates, every seed and β at once", **FAMILY,
       mode=req("how the runs update", choices=["on-policy", "off-policy"]), **TOY, **THREADS,
       out=req("every run's end point (CSV)"))  # fmt: skip
def _toy_monte_carlo(args):
    import pandas as pd

    from klstudy.analysis import fixed_points, monte_carlo

    _threads(args.threads)
    section, start = args.settings["fixed_points"], time.perf_counter()
    carlo, family = section["monte_carlo"], fixed_points.family_of(section, args.family)
    runs = pd.concat(
        monte_carlo.train_monte_carlo(family, section["reward"], config, carlo["betas"], carlo, args.mode)
        for config in carlo["configs"]
    )
    _to_csv(runs, args.out, f"toy Monte Carlo, {args.family} {args.mode}", start)


@stage("toy-fixed-points-report", "the fixed-point figure, tables and toy claims",
       points=req("each family's fixed points (CSV)", nargs="+"),
       frontiers=req("each family's frontier (CSV)", nargs="+"),
       monte_carlo=req("the Monte Carlo runs' end points (CSV)", nargs="+"), **REPORT,
       png=req("the figure (a PDF is written beside it)"))  # fmt: skip
def _toy_fixed_points_report(args):
    from klstudy.analysis import effective_beta, monte_carlo
    from klstudy.report.figures.encoding import config_words, save
    from klstudy.report.figures.toy import draw_toy_fixed_points

    config = args.settings
    section = config["toy"]["fixed_points"]
    points, end_points = _read_csvs(args.points), _read_csvs(args.monte_carlo)
    points = points.assign(below_frontier=effective_beta.below_frontier(points, section))
    agreed = monte_carlo.agreement(end_points, points)
    claims = monte_carlo.toy_claims(end_points, points, section["claims"], config["claims_rule"], section["tolerance"])
    out = Path(args.png)
    fig, text = draw_toy_fixed_points(points, _read_csvs(args.frontiers), agreed, section)
    save(out, fig)
    monte_carlo.write_tables(points, agreed, claims, out.parent, name=config_words)
    _caption_before_table(out, text)
    print(claims.to_string(index=False))


@stage("toy-atlas", "the atlas's exact end points for one family, or the length sweep",
       family=req("tabular, parametric, or length (the sweep over T)"), **TOY, **THREADS,
       out=req("the end points, or the sweep (CSV)"))  # fmt: skip
def _toy_atlas(args):
    from klstudy.analysis import atlas, fixed_points

    _threads(args.threads)
    section, fixed, start = args.settings["atlas"], args.settings["fixed_points"], time.perf_counter()
    atlas_section = dict(section, reference=fixed["reference"])
    if args.family == "length":
        table = atlas.length_sweep(atlas_section, fixed["flow"])
    else:
        family = fixed_points.family_of(fixed, args.family)
        settings = atlas.grid_settings(atlas_section)
        table = atlas.end_points(family, fixed["reward"], settings, section["betas"], fixed["flow"])
    _to_csv(table, args.out, f"toy atlas, {args.family}", start)


@stage("toy-atlas-report", "the atlas's Monte Carlo runs, claims, figure, tables",
       points=req("each family's atlas end points (CSV)", nargs="+"), length=req("the length sweep (CSV)"),
       **REPORT, **THREADS, png=req("the figure (a PDF is written beside it)"))  # fmt: skip
def _toy_atlas_report(args):
    import pandas as pd

    from klstudy.analysis import atlas, fixed_points
    from klstudy.report.figures import atlas as atlas_figures

    _threads(args.threads)
    config, start = args.settings, time.perf_counter()
    fixed, section = config["toy"]["fixed_points"], config["toy"]["atlas"]
    points = atlas.with_clamp_binding(_read_csvs(args.points), fixed["reference"])
    length = pd.read_csv(args.length)
    carlo = dict(fixed["monte_carlo"], **section["monte_carlo"])
    atlas_section = dict(section, reference=fixed["reference"], monte_carlo=carlo)
    runs = pd.concat(
        atlas.monte_carlo(atlas_section, fixed["reward"], fixed_points.family_of(fixed, family))
        for family in carlo["families"]
    )
    judged = atlas.claims(runs, points, section, config["claims_rule"], fixed["tolerance"])
    out = Path(args.png)
    text = atlas_figures.draw(points, length, out, section)
    atlas.write_tables(points, length, runs, judged, section, out.parent)
    _caption_before_table(out, text)
    print(judged.to_string(index=False))
    print(f"toy atlas report in {time.perf_counter() - start:.2f}s")


def _caption_before_table(png: Path, caption: str) -> None:
    """The figure's caption opens its table's Markdown (which has the figure's name), a mark between them so that the
    report's caption and a redraw take the caption alone (figures/redraw.py)."""
    from klstudy.report.figures.redraw import TABLE_MARK

    table = png.with_suffix(".md")
    table.write_text(f"![{png.stem}]({png.name})\n\n{caption}\n\n{TABLE_MARK}\n\n{table.read_text()}")


@stage("fig01", "Figure 1 (PNG, and PDF beside it)", inputs=req("the toy jobs' CSV files, one per setting", nargs="+"),
       tests=req("toy-tests' CSV (which configurations are unbiased)"), **PNG,
       settings=opt("config toy.settings as JSON: the caption defines each setting", type=JSON))  # fmt: skip
def _fig01(args):
    import pandas as pd

    from klstudy.report.figures.encoding import save
    from klstudy.report.figures.toy import draw_fig01

    save(Path(args.out), *draw_fig01(_read_csvs(args.inputs), pd.read_csv(args.tests), args.settings))
