"""The §3 analysis's stages as `klstudy` subcommands (stages.py's convention): the toy model's bias and variance,
Figure 1, its fixed points and Monte Carlo runs, and the atlas. Each imports what it needs inside its function."""

from __future__ import annotations

import json
import time
from pathlib import Path

from klstudy.run.devices import threads as _threads


def _toy(args):
    from klstudy.analysis import toy

    _threads(args.threads)
    section = json.loads(args.settings)
    setting = toy.ToySetting(args.setting, **section["settings"][args.setting])
    start = time.perf_counter()
    results = toy.bias_variance(
        setting, section["lengths"], section["estimators"], section["placements"], section["trials"],
        section["sequences"], section["seed"], section["baseline"], section["loss_gradients"],
    )  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    results.to_csv(args.out, index=False)
    print(f"toy setting {args.setting}: {len(results)} rows in {time.perf_counter() - start:.2f}s -> {args.out}")


def _toy_tests(args):
    import pandas as pd

    from klstudy.analysis import toy

    results = pd.concat([pd.read_csv(path) for path in args.inputs], ignore_index=True)
    tests = toy.unbiasedness_tests(results, json.loads(args.settings)["alpha"])
    tests.to_csv(args.out, index=False)
    print(tests.to_string(index=False))


def _toy_configs(section: dict) -> list[str]:
    """Table 1's configurations (the toy section's estimators × placements and loss gradients), by name."""
    from klstudy.analysis import toy

    specs = toy.config_specs(section["estimators"], section["placements"], section["loss_gradients"])
    return [spec.name for spec in specs]


def _toy_fixed_points(args):
    from klstudy.analysis import fixed_points

    _threads(args.threads)
    section = json.loads(args.settings)
    start = time.perf_counter()
    points, front = fixed_points.exact_tables(section["fixed_points"], _toy_configs(section), args.family)
    for table, out in ((points, args.out), (front, args.frontier)):
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(out, index=False)
    print(points.drop(columns="theta").to_string(index=False))
    print(f"toy fixed points, {args.family}: {len(points)} rows in {time.perf_counter() - start:.2f}s -> {args.out}")


def _toy_monte_carlo(args):
    import pandas as pd

    from klstudy.analysis import fixed_points, monte_carlo

    _threads(args.threads)
    section = json.loads(args.settings)["fixed_points"]
    carlo, family = section["monte_carlo"], fixed_points.family_of(section, args.family)
    start = time.perf_counter()
    runs = pd.concat(
        monte_carlo.train_monte_carlo(family, section["reward"], config, carlo["betas"], carlo, args.mode)
        for config in carlo["configs"]
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    runs.to_csv(args.out, index=False)
    print(f"toy Monte Carlo, {args.family} {args.mode}: {len(runs)} runs in {time.perf_counter() - start:.2f}s")


def _toy_fixed_points_report(args):
    import pandas as pd

    from klstudy.analysis import effective_beta, monte_carlo
    from klstudy.report.figures.encoding import config_words
    from klstudy.report.figures.toy import toy_fixed_points_figure

    config = json.loads(args.settings)
    section = config["toy"]["fixed_points"]
    points = pd.concat([pd.read_csv(path) for path in args.points], ignore_index=True)
    fronts = pd.concat([pd.read_csv(path) for path in args.frontiers], ignore_index=True)
    end_points = pd.concat([pd.read_csv(path) for path in args.monte_carlo], ignore_index=True)
    points = points.assign(below_frontier=effective_beta.below_frontier(points, section))
    agreed = monte_carlo.agreement(end_points, points)
    claims = monte_carlo.toy_claims(end_points, points, section["claims"], config["claims_rule"], section["tolerance"])
    out = Path(args.png)
    text = toy_fixed_points_figure(points, fronts, agreed, section, out)
    monte_carlo.write_tables(points, agreed, claims, out.parent, name=config_words)
    _caption_before_table(out, text)
    print(claims.to_string(index=False))


def _toy_atlas(args):
    from klstudy.analysis import atlas, fixed_points

    _threads(args.threads)
    toy = json.loads(args.settings)
    section, fixed = toy["atlas"], toy["fixed_points"]
    atlas_section = dict(section, reference=fixed["reference"])
    start = time.perf_counter()
    if args.family == "length":
        table = atlas.length_sweep(atlas_section, fixed["flow"])
    else:
        family = fixed_points.family_of(fixed, args.family)
        settings = atlas.grid_settings(atlas_section)
        table = atlas.end_points(family, fixed["reward"], settings, section["betas"], fixed["flow"])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out, index=False)
    print(f"toy atlas, {args.family}: {len(table)} rows in {time.perf_counter() - start:.2f}s -> {args.out}")


def _toy_atlas_report(args):
    import pandas as pd

    from klstudy.analysis import atlas, effective_beta, fixed_points
    from klstudy.report.figures import atlas as atlas_figures

    _threads(args.threads)
    config = json.loads(args.settings)
    fixed, section = config["toy"]["fixed_points"], config["toy"]["atlas"]
    start = time.perf_counter()
    points = pd.concat([pd.read_csv(path) for path in args.points], ignore_index=True)
    points = atlas.with_clamp_binding(points, fixed["reference"])
    length = pd.read_csv(args.length)
    carlo = dict(fixed["monte_carlo"], **section["monte_carlo"])
    atlas_section = dict(section, reference=fixed["reference"], monte_carlo=carlo)
    runs = pd.concat(
        atlas.monte_carlo(atlas_section, fixed["reward"], fixed_points.family_of(fixed, family))
        for family in carlo["families"]
    )
    judged = atlas.claims(runs, points, section, config["claims_rule"], fixed["tolerance"])
    out = Path(args.png)
    text = atlas_figures.draw(points, length, out, section, beta_min=effective_beta.EFFECTIVE_BETA_RANGE[0])
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


def _fig01(args):
    import pandas as pd

    from klstudy.report.figures.toy import fig01_toy_bias_variance

    results = pd.concat([pd.read_csv(path) for path in args.inputs], ignore_index=True)
    settings = json.loads(args.settings) if args.settings else None
    fig01_toy_bias_variance(results, pd.read_csv(args.tests), Path(args.out), settings)


def add_commands(commands) -> None:
    """The toy's subcommands on ``commands`` (an argparse subparsers action)."""
    toy = commands.add_parser("toy", help="§3.3 Monte Carlo bias and variance for one (a, b, a_ref, b_ref) setting")
    toy.add_argument("--setting", required=True, help="a name under the toy section's settings")
    toy.add_argument("--settings", required=True, help="the config's toy section, as JSON")
    toy.add_argument("--threads", type=int, help="torch CPU threads")
    toy.add_argument("--out", required=True, help="bias and variance per configuration and T (CSV)")
    toy.set_defaults(run=_toy)

    tests = commands.add_parser("toy-tests", help="per-configuration test of 'the gradient is unbiased'")
    tests.add_argument("--inputs", nargs="+", required=True, help="the toy jobs' CSV files, one per setting")
    tests.add_argument("--settings", required=True, help="the config's toy section, as JSON (its alpha)")
    tests.add_argument("--out", required=True, help="one row per configuration: unbiased or not (CSV)")
    tests.set_defaults(run=_toy_tests)

    points = commands.add_parser("toy-fixed-points", help="exact fixed points and frontier of one toy policy family")
    points.add_argument("--family", required=True, help="tabular or parametric")
    points.add_argument("--settings", required=True, help="the config's toy section, as JSON")
    points.add_argument("--threads", type=int, help="torch CPU threads")
    points.add_argument("--out", required=True, help="the fixed points (CSV)")
    points.add_argument("--frontier", required=True, help="the family's reward-KL frontier (CSV)")
    points.set_defaults(run=_toy_fixed_points)

    carlo = commands.add_parser("toy-monte-carlo", help="toy training by sampled updates, every seed and β at once")
    carlo.add_argument("--family", required=True, help="tabular or parametric")
    carlo.add_argument("--mode", required=True, choices=["on-policy", "off-policy"], help="how the runs update")
    carlo.add_argument("--settings", required=True, help="the config's toy section, as JSON")
    carlo.add_argument("--threads", type=int, help="torch CPU threads")
    carlo.add_argument("--out", required=True, help="every run's end point (CSV)")
    carlo.set_defaults(run=_toy_monte_carlo)

    report = commands.add_parser("toy-fixed-points-report", help="the fixed-point figure, tables and toy claims")
    report.add_argument("--points", nargs="+", required=True, help="each family's fixed points (CSV)")
    report.add_argument("--frontiers", nargs="+", required=True, help="each family's frontier (CSV)")
    report.add_argument("--monte-carlo", nargs="+", required=True, help="the Monte Carlo runs' end points (CSV)")
    report.add_argument("--settings", required=True, help="the config's toy section and claims_rule, as JSON")
    report.add_argument("--png", required=True, help="the figure (a PDF is written beside it)")
    report.set_defaults(run=_toy_fixed_points_report)

    atlas = commands.add_parser("toy-atlas", help="the atlas's exact end points for one family, or the length sweep")
    atlas.add_argument("--family", required=True, help="tabular, parametric, or length (the sweep over T)")
    atlas.add_argument("--settings", required=True, help="the config's toy section, as JSON")
    atlas.add_argument("--threads", type=int, help="torch CPU threads")
    atlas.add_argument("--out", required=True, help="the end points, or the sweep (CSV)")
    atlas.set_defaults(run=_toy_atlas)

    atlas_report = commands.add_parser("toy-atlas-report", help="the atlas's Monte Carlo runs, claims, figure, tables")
    atlas_report.add_argument("--points", nargs="+", required=True, help="each family's atlas end points (CSV)")
    atlas_report.add_argument("--length", required=True, help="the length sweep (CSV)")
    atlas_report.add_argument("--settings", required=True, help="the config's toy section and claims_rule, as JSON")
    atlas_report.add_argument("--threads", type=int, help="torch CPU threads")
    atlas_report.add_argument("--png", required=True, help="the figure (a PDF is written beside it)")
    atlas_report.set_defaults(run=_toy_atlas_report)

    fig01 = commands.add_parser("fig01", help="Figure 1 (PNG, and PDF beside it)")
    fig01.add_argument("--inputs", nargs="+", required=True, help="the toy jobs' CSV files, one per setting")
    fig01.add_argument("--tests", required=True, help="toy-tests' CSV (which configurations are unbiased)")
    fig01.add_argument("--settings", help="config toy.settings as JSON: the caption defines each setting")
    fig01.add_argument("--out", required=True, help="PNG path (a PDF is written beside it)")
    fig01.set_defaults(run=_fig01)
