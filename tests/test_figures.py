"""The figures' rules, each a test that can fail: every number of a caption read from what is drawn, one style table
for every artist, labels that name the data the run used, short captions, a figure that shows nothing saying so
first. Every figure of a synthetic run (tests/figure_study.py), of the toy model and of the atlas is drawn once, in
memory; each check runs on all of them, and each check is shown to fail once on a figure broken on purpose."""

import io
import re
from pathlib import Path

import matplotlib.colors as mcolors
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import yaml
from docutils.core import publish_parts
from figure_checks import (
    every_problem,
    identifier_problems,
    image_texts,
    ink_problems,
    panel_problems,
    size_problems,
    style_problems,
)
from figure_study import claims_table, study_config, study_tables

from klstudy import figure_plan, kl
from klstudy.analysis import atlas
from klstudy.analysis import fixed_points as fp
from klstudy.report import aggregate
from klstudy.report.figures import atlas as atlas_figures
from klstudy.report.figures import captions, encoding, forest, panels, paper, redraw, training
from klstudy.report.figures import toy as toy_figures

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ["embedded", "separation", "smollm2", "toy", "atlas"]
PAPER_DATA = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())["data"]


def run_figures(config, tables, claims) -> list[tuple[str, object, str]]:
    """Every figure the workflow draws for this config: (name, figure, caption)."""
    drawn = [(name, *paper.draw_paper_figure(name, config, tables, claims)) for name in config["figures"]]
    for target in figure_plan.training_figures(config):
        study = Path(target).name.removeprefix("training_")
        drawn.append((Path(target).name, *training.draw_training_figure(study, config, tables)))
    for target in figure_plan.claims_figures(config):
        metric = Path(target).name.removeprefix(f"{figure_plan.CLAIMS_FIGURE}_")
        drawn.append((Path(target).name, *forest.draw_claims_forest(claims, config, metric)))
    return drawn


def toy_results() -> tuple[pd.DataFrame, pd.DataFrame]:
    """fig01's inputs, small: two settings, T = 1, 2, 4; K1 in the reward exactly unbiased, K3 in the loss with K1 in
    the loss's bias (drawn once)."""
    rows = []
    for setting in ("close", "apart"):
        for length in (1, 2, 4):
            for config, exact in (("k1-reward", 0.0), ("k3-reward", 0.01 * length), ("k3-loss", 0.02 * length),
                                  ("k1-loss", 0.02 * length)):  # fmt: skip
                for param in ("a", "b"):
                    estimator, _, placement = config.partition("-")
                    rows.append(dict(setting=setting, T=length, param=param, config=config, estimator=estimator,
                                     placement=placement, loss_gradient="pathwise", true_grad=0.5, exact_bias=exact,
                                     std_error=0.003, variance=0.1 * length * (1 + 0.3 * (config == "k1-loss")),
                                     trials=200, sequences=1000))  # fmt: skip
    tests = pd.DataFrame({"config": ["k1-reward", "k3-reward", "k3-loss", "k1-loss"],
                          "exact_unbiased": [True, False, False, False]})  # fmt: skip
    return pd.DataFrame(rows), tests


def toy_end_points():
    section = {"length": 4, "reward": {"threshold": 3}, "betas": [0.3, 1.0, 3.0], "monte_carlo": {"seeds": 20}}
    on = {0.3: (0.9, 1.2), 1.0: (0.7, 0.6), 3.0: (0.35, 0.1)}
    rows = [dict(family="tabular", config=c, beta=b, status="stable", reward=r, kl=k, objective_gap=0.0)
            for c in ("k1-reward", "k3-both") for b, (r, k) in on.items()]  # fmt: skip
    rows += [dict(family="tabular", config="k3-loss", beta=b, status="stable", reward=r - 0.1, kl=k,
                  objective_gap=0.01 / b) for b, (r, k) in on.items()]  # fmt: skip
    rows += [dict(family="tabular", config=c, beta=b, status="drifts", reward=1.0, kl=2.74, objective_gap=np.nan)
             for c in ("none", "k1-loss") for b in on]  # fmt: skip
    fronts = pd.DataFrame({"family": "tabular", "kl": [0.0, 0.3, 2.5], "reward": [0.2, 0.5, 1.0]})
    agreed = pd.DataFrame({"family": "tabular", "mode": "on-policy", "config": ["k3-loss"] * 2 + ["k1-loss"] * 2,
                           "beta": [1.0, 3.0] * 2, "mc_kl": [0.61, 0.098, 2.4, 2.3], "mc_kl_se": 0.01,
                           "kl": [0.6, 0.1, 2.74, 2.74], "status": ["stable"] * 2 + ["drifts"] * 2})  # fmt: skip
    return pd.DataFrame(rows), fronts, agreed, section


ATLAS = {"configs": ["k3-loss"], "normalisations": ["rloo", "group_std"], "group_sizes": [2],
         "reference": {"a_ref": -0.5, "b_ref": 0.1}, "presets": [], "betas": [0.3, 1.0],
         "extra_presets": {"trl-grpo": {"framework": "TRL", "version": "1.16.0", "source": "trl",
                                        "kl": "k3-loss-ratio", "normalisation": "group_std", "group": 4,
                                        "default_beta": 0.0}},
         "length": {"settings": ["k3-loss/rloo/G2", "trl-grpo"], "betas": [1.0], "threshold_fraction": 0.75,
                    "max_length": {"tabular": 2, "parametric": 3}}}  # fmt: skip


FLOW = {"step": 0.25, "steps": 200, "newton_every": 25}


def toy_figures_drawn() -> list[tuple[str, object, str]]:
    """Figure 1, the fixed points and the atlas's three figures, from small tables."""
    flow, one = FLOW, {"kind": "ones_at_least", "threshold": 1}
    points = pd.concat([atlas.end_points(fp.Family(name, 2, -0.5, 0.1), one, atlas.grid_settings(ATLAS), [0.3, 1.0],
                                         flow) for name in fp.FAMILIES], ignore_index=True)  # fmt: skip
    return [("fig01_toy_bias_variance", *toy_figures.draw_fig01(*toy_results())),
            ("toy_fixed_points", *toy_figures.draw_toy_fixed_points(*toy_end_points())),
            ("atlas", *atlas_figures.figure(points, ATLAS)), ("atlas_grid", *atlas_figures.grid_figure(points, ATLAS)),
            ("atlas_length", *atlas_figures.length_figure(atlas.length_sweep(ATLAS, flow), ATLAS))]


def test_the_length_figure_says_where_two_beta_lines_of_a_setting_coincide():
    """β_eff/β equal at every T for two β (K1 in reward with RLOO: 1 at each) draws one line over the other: the
    legend names those β, found from the values; a β whose line differs is not named."""
    swept = atlas.length_sweep(ATLAS, FLOW)
    assert np.isfinite(swept.beta_eff_ratio).any()
    length = pd.concat([swept, swept.assign(beta=0.3), swept.assign(beta=3.0, beta_eff_ratio=swept.beta_eff_ratio * 2)])
    fig, _ = atlas_figures.length_figure(length, dict(ATLAS, length=dict(ATLAS["length"], betas=[0.3, 1.0, 3.0])))
    legend = " ".join(t.get_text() for t in fig.legends[0].get_texts())
    assert set(re.findall(r"β = ([\d.]+(?: and [\d.]+)*) coincide", legend)) == {"0.3 and 1"}
    fig, _ = atlas_figures.length_figure(swept, ATLAS)
    assert "coincide" not in " ".join(t.get_text() for t in fig.legends[0].get_texts())
    plt.close("all")


def test_the_atlas_legends_key_only_the_marks_drawn_and_the_presets_figure_marks_where_a_clamp_binds():
    """On the shipped atlas table: each legend keys a mark besides β_eff (arrow, ▶ ✚ ×, †) exactly where a panel draws
    it, with the marker drawn (← on the presets' horizontal axes); a † is drawn only where atlas.csv's clamp_binds is
    above 0 (the table's †): none once no clamp binds."""
    tables = ROOT / "docs/atlas/tables"
    points, section = pd.read_csv(tables / "atlas.csv"), yaml.safe_load((tables / "config.yaml").read_text())
    section = section["toy"]["atlas"]
    marks, words = ("_bound", "_stop", "_clamp"), set(atlas_figures.MARK_WORDS.values())
    for draw, other in ((atlas_figures.figure, "y"), (atlas_figures.grid_figure, "x")):
        fig, _ = draw(points, section)
        drawn = {ln.get_marker() for ax in fig.axes for ln in ax.lines if ln.get_label() in marks}
        keyed = [h.get_marker() for h in fig.legends[0].legend_handles if h.get_label() in words]
        assert drawn and sorted(keyed) == sorted(drawn) and atlas_figures.BOUND_MARKERS[other] not in keyed
    fig, _ = atlas_figures.figure(points, section)
    assert any(ln.get_label() == "_clamp" for ax in fig.axes for ln in ax.lines)
    fig, _ = atlas_figures.figure(points.assign(clamp_binds=0.0), section)
    assert not any(ln.get_label() == "_clamp" for ax in fig.axes for ln in ax.lines)
    plt.close("all")


@pytest.fixture(scope="module")
def run():
    """A synthetic run of config.yaml: the on-policy study with two seeds, the others with one."""
    config = study_config(2)
    return config, study_tables(config), claims_table(config)


@pytest.fixture(scope="module")
def figures(run):
    drawn = run_figures(*run) + toy_figures_drawn()
    yield drawn
    for _, fig, _ in drawn:
        plt.close(fig)


def test_every_figure_passes_every_check(run, figures):
    """Style table, every caption number read from the ink, no identifiers, no empty panel, print size and fonts:
    every figure of a run, of the toy model and of the atlas."""
    assert len(figures) >= 18
    found = [f"{name}: {problem}" for name, fig, caption in figures for problem in every_problem(fig, caption, run[0])]
    assert found == [], "\n".join(found)
    tables = ROOT / "docs" / "separation" / "tables"  # a claim of no difference: its z read from the band drawn
    settings = yaml.safe_load((tables / "config.yaml").read_text())
    fig, caption = forest.draw_claims_forest(encoding.read_claims(tables / "claims.csv"), settings, "final_kl")
    assert "z inside margin" in " ".join(t.get_text() for ax in fig.axes for t in ax.get_yticklabels())
    assert every_problem(fig, caption, settings) == []
    plt.close(fig)


def test_every_caption_is_a_few_sentences_and_a_table(figures):
    """At most about 600 characters of prose; many numbers go in a table; reStructuredText too (the report's)."""
    for name, _, caption in figures:
        prose = "\n\n".join(p for p in str(caption).split("\n\n") if not p.startswith("|"))
        assert len(prose) <= 700, (name, len(prose))
        assert len(captions.numbers_in(prose)) <= 12, (name, captions.numbers_in(prose))
        errors = io.StringIO()
        publish_parts(str(caption), writer="html", settings_overrides={"warning_stream": errors})
        assert errors.getvalue() == "", (name, errors.getvalue())


def texts_naming(figures, names: set[str]) -> list[str]:
    """The image texts and captions of ``figures`` that name one of ``names`` other than as a stand-in's role."""
    found = []
    for name, fig, caption in figures:
        for text in [*image_texts(fig), str(caption)]:
            text = re.sub(r"[\w ²]+'s role", "", " ".join(text.split()))
            found += [f"{name}: {text[:80]!r}" for role in names if re.search(rf"(?<![\w]){re.escape(role)}", text)]
    return found


def test_labels_name_the_data_the_run_used(run, figures):
    """A run on procedural stand-ins never names the paper's datasets but as the role a stand-in plays; a run on the
    paper's data names them."""
    roles = {spec["role"] for spec in run[0]["data"].values() if spec and spec.get("role")} | {"MATH", "MMLU"}
    roles -= {"Countdown train", "Countdown test"}  # the paper's own generator, the same data
    assert texts_naming(figures, roles) == []
    hub = {**run[0], "data": {**run[0]["data"], **PAPER_DATA}}
    drawn = [(n, *paper.draw_paper_figure(n, hub, run[1], run[2]))
             for n in ("fig07_async", "fig05_eval_k1_reward_vs_k3_loss")]
    named = " ".join(t for _, fig, _ in drawn for t in image_texts(fig))
    assert "MATH500" in named and "MMLU college physics" in named and "role" not in named
    for _, fig, _ in drawn:
        plt.close(fig)


def test_a_figure_that_can_show_nothing_says_first_that_it_checks_the_pipeline():
    """Two paired seeds (critical 31.8): fig13 is a pipeline check; four: a result."""
    for seeds, result in ((2, False), (4, True)):
        config = study_config(seeds)
        fig, caption = paper.draw_paper_figure("fig13_regularisation", config, study_tables(config),
                                               claims_table(config))  # fmt: skip
        assert figure_plan.is_result(config, "fig13_regularisation") == result
        assert str(caption).startswith("Pipeline check") != result, seeds
        plt.close(fig)


# ---------------------------------------------------------------------------------------------------------
# Each check fails on a figure broken on purpose.


def test_the_style_check_catches_an_artist_drawn_off_the_table():
    fig, ax = plt.subplots(figsize=(3.5, 2))
    encoding.tag(ax.plot([0, 1], [0, 1], **encoding.style_of("k1-reward", 0.1))[0], "k1-reward", 0.1)
    assert style_problems(fig) == []
    encoding.tag(ax.plot([0, 1], [1, 0], **{**encoding.style_of("k1-reward", 0.1), "linestyle": ":"})[0], "k1-reward",
                 0.1)  # fmt: skip
    encoding.tag(ax.plot([0, 1], [1, 1], **{**encoding.style_of("k3-loss", 1.0), "color": "red"})[0], "k3-loss", 1.0)
    encoding.tag(ax.plot([0, 1], [0, 0], **{**encoding.style_of("k3-loss", 1.0), "marker": "o"})[0], "k3-loss", 1.0)
    found = " | ".join(style_problems(fig))
    assert "dashes" in found and "colour #ff0000" in found and "marker o" in found
    plt.close(fig)


def test_the_ink_check_catches_a_number_from_elsewhere():
    fig, ax = plt.subplots(figsize=(3.5, 2))
    line = ax.plot([0, 15], [0.31, 0.35], label="no KL")[0]
    caption = captions.Caption()
    caption.add(f"No KL ends at {caption.value(line)}.")
    assert ink_problems(fig, caption.text()) == []
    caption.add("The off-policy run reads −0.07.")
    assert ink_problems(fig, caption.text()) == ["-0.07: in the caption, neither drawn, shown nor declared"]
    other, ax2 = plt.subplots()
    elsewhere = captions.Caption()
    elsewhere.add(f"{elsewhere.value(ax2.plot([0], [0.5])[0])}")
    assert "not drawn in this figure" in " ".join(ink_problems(fig, elsewhere.text()))
    line.set_ydata([0.31, 0.45])  # the drawing changed after the caption read it
    assert "the artist draws 0.45" in " ".join(ink_problems(fig, caption.text()))
    plt.close(fig), plt.close(other)


def test_the_identifier_panel_and_size_checks_catch_what_they_name(run):
    fig, axes = plt.subplots(1, 3, figsize=(12, 2))
    axes[0].plot([0, 5, 10], [0.0, 0.0, 0.0])
    axes[1].plot([1], [0.3], "o")
    axes[2].set_title("tiny", fontsize=5)
    for text in ("k1_reward_regularises: shown", "see figures/claims.csv", "study onpolicy", "k1-reward at β 1"):
        assert identifier_problems(fig, text, run[0]), text
    found = " | ".join(panel_problems(fig, "A caption with no claim.") + size_problems(fig))
    for words in ("constant data", "1 point", "no claim about the figure", "print size 12.00", "font too small"):
        assert words in found
    plt.close(fig)


# ---------------------------------------------------------------------------------------------------------
# One encoding.


def test_one_colour_per_configuration_none_reused_none_a_verdicts():
    """Every configuration of the estimators the figures know (K1, K2, K3) has its own colour in the one table: toy,
    atlas and runs alike. An estimator added later is grey until it is given colours (docs/studies.md)."""
    estimators = ("k1", "k2", "k3")
    names = [kl.NO_KL] + [f"{e}-{p}" for e in estimators for p in ("reward", "loss", "both", "advantage")]
    names += [f"{e}-loss-{g}" for e in estimators for g in kl.LOSS_GRADIENTS[1:]]
    colours = [mcolors.to_hex(encoding.config_colour(name)) for name in names]
    assert len(set(colours)) == len(names) and set(names) == set(encoding.CONFIG_COLOURS)
    reserved = {mcolors.to_hex(c) for c in [*encoding.VERDICT_COLOURS.values(), encoding.UNTESTED_COLOUR,
                                           encoding.BASE_COLOUR, encoding.UNLISTED_COLOUR]}  # fmt: skip
    assert not reserved & set(colours)
    words = [word for _, word in encoding.CONFIG_COLOURS.values()]
    assert len(set(words)) == len(words)


def test_beta_is_line_style_by_its_value_and_markers_read_without_colour():
    styles = [str(encoding.beta_linestyle(b)) for b in encoding.BETA_STYLES]
    hatches = [encoding.beta_hatch(b) for b in encoding.BETA_STYLES]
    assert "-" not in styles and "" not in hatches and encoding.beta_linestyle(0.0) == "-"
    assert len(set(styles)) == len(styles) and len(set(hatches)) == len(hatches)
    configs = [n for n in encoding.CONFIG_COLOURS if n.count("-") < 2]
    markers = {tuple(sorted(encoding.marker_of(k).items())) for k in configs}
    assert len(markers) == len(configs)


def test_the_conventions_page_is_said_once_and_every_shipped_folder_links_it():
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    assert (ROOT / "docs" / redraw.CONVENTIONS_PAGE).read_text() == captions.conventions(config)
    assert not re.search(r"#[0-9A-Fa-f]{6}", captions.conventions(config))  # colours in words
    for folder in SHIPPED:
        assert f"](../{redraw.CONVENTIONS_PAGE})" in (ROOT / "docs" / folder / redraw.README).read_text(), folder


# ---------------------------------------------------------------------------------------------------------
# What the figures draw.


@pytest.mark.parametrize(("seeds", "band", "thin"), [(1, True, False), (2, False, True), (5, True, False)])
def test_one_seed_carries_its_own_error_few_seeds_are_drawn_each_and_many_get_a_band(seeds, band, thin):
    config = study_config(seeds)
    fig, ax = plt.subplots()
    drawn = panels.curves_panel(ax, {"kind": "curves", "study": "onpolicy", "model": "tiny", "kl": ["none", "k1-loss"]},
                                config, study_tables(config))  # fmt: skip
    bands = [c for c in ax.collections if type(c).__name__ != "PathCollection" and c.get_gid()]
    assert any(c.get_gid().endswith(";band") for c in bands) == band
    assert any(line.get_label() == "_seed" for line in ax.lines) == thin
    assert drawn.seeds == {seeds}
    plt.close(fig)


def test_past_a_dozen_seed_lines_a_panel_draws_the_means_and_each_seed_s_end():
    """28 thin seed lines in a panel cannot be told apart: past MAX_SEED_LINES a held-out panel and a training
    figure draw no seed line, and each series' seeds as dots at its end."""
    config = study_config(4)
    tables = study_tables(config)
    heldout = tables["heldout"][tables["heldout"].study == "onpolicy"]
    assert heldout.groupby(["kl", "beta"]).seed.nunique().sum() > encoding.MAX_SEED_LINES  # the case under test
    fig, ax = plt.subplots()
    panels.curves_panel(ax, {"kind": "curves", "study": "onpolicy", "model": "tiny"}, config, tables)
    ends = [c for c in ax.collections if c.get_label() == "_seed ends"]
    assert not [line for line in ax.lines if line.get_label() == "_seed"]
    assert len(ends) == heldout.groupby(["kl", "beta"]).ngroups and all(len(c.get_offsets()) == 4 for c in ends)
    plt.close(fig)
    fig, _ = training.draw_training_figure("onpolicy", config, tables)
    assert not [line for ax in fig.axes for line in ax.lines if line.get_label() == "_raw"]
    assert any(c.get_label() == "_seed ends" for ax in fig.axes for c in ax.collections)
    plt.close(fig)


def test_a_forest_that_mixes_runs_names_each_claim_s_run(run):
    """The same comparison from two runs gives two effects: each claim's header names its run, the caption each run;
    a forest of one run names none."""
    config, _, claims = run
    rows, _ = forest.forest_rows(claims, config, "final_kl")
    assert rows.study.nunique() == 1 and len(rows)  # the case under test: one run, then two
    again = claims[claims.claim.isin(rows.claim)].assign(claim=lambda c: c.claim + "_again", study="async_math")
    for table, mixed in ((claims, False), (pd.concat([claims, again], ignore_index=True), True)):
        fig, caption = forest.draw_claims_forest(table, config, "final_kl")
        headers = [" ".join(t.get_text().split()) for t in fig.findobj(plt.Text) if "predicted" in t.get_text()]
        assert headers and all(("; run " in h) == mixed for h in headers)
        assert ("Run A: " in caption and "Run B: " in caption) == mixed
        plt.close(fig)


def test_coinciding_toy_lines_are_drawn_once_their_markers_alternating():
    """Figure 1: lines within COINCIDE draw one line, its markers alternating between the configurations, each named
    once in the legend; the end points: one line named for all, the same in every panel."""
    fig, caption = toy_figures.draw_fig01(*toy_results())
    lines = fig.axes[0].lines
    members = {encoding.GID.match(line.get_gid())["kl"]: len(line.get_xdata()) for line in lines
               if line.get_label() == "_member"}  # fmt: skip
    assert sum(line.get_label() == "_group" for line in lines) == 2
    assert members == {"k3-reward": 3, "k3-loss": 2, "k1-loss": 1}
    assert not [t for t in fig.legends[0].get_texts() if "=" in t.get_text()]
    assert "Exactly unbiased, not drawn on the log axis: K1 in reward." in caption
    plt.close(fig)
    fig, _ = toy_figures.draw_toy_fixed_points(*toy_end_points())
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "K1 in reward = K3 in reward and loss" in labels and "K1 in reward" not in labels
    members = [encoding.GID.match(line.get_gid())["kl"] for line in fig.axes[0].lines if line.get_label() == "_member"]
    assert sorted(members) == ["k1-reward", "k3-both", "k3-loss"]  # the shared line's markers alternate, as Figure 1's
    plt.close(fig)


def test_a_preset_is_named_by_its_framework_without_identifiers():
    assert atlas_figures.preset_name("nemo-rl-grpo", {"framework": "NeMo-RL", "version": "0.6.0"}) == "NeMo-RL 0.6 GRPO"
    assert atlas_figures.preset_name("slime-default", {"framework": "slime", "version": "main"}) == "slime default"
    shipped = {name: atlas_figures.preset_name(name, row) for name, row in atlas.presets_of(
        {"presets": ["trl-1.9", "verl-0.7-kl-loss", "skyrl-k2-proposal"]}).items()}  # fmt: skip
    assert shipped == {"trl-1.9": "TRL 0.26–1.9", "verl-0.7-kl-loss": "verl 0.7 KL loss",
                       "skyrl-k2-proposal": "SkyRL 0.3 K2 proposal"}  # fmt: skip
    assert set(kl.ADVANTAGES) <= set(atlas_figures.AXIS_NAMES)


# ---------------------------------------------------------------------------------------------------------
# The shipped folders.


@pytest.mark.parametrize("folder", SHIPPED)
def test_no_shipped_caption_names_a_file_or_an_identifier(folder):
    shipped = ROOT / "docs" / folder
    config = yaml.safe_load((shipped / "tables" / "config.yaml").read_text())
    fig = plt.figure()
    for png in sorted(shipped.glob("*.png")):
        text = png.with_suffix(".md").read_text().split(redraw.TABLE_MARK)[0]
        assert identifier_problems(fig, text, config) == [], png.name
    plt.close(fig)


def test_a_committed_figure_redraws_from_its_committed_tables():
    """docs/embedded/tables holds what its figures read: fig13 redrawn from it is the committed one."""
    tables = ROOT / "docs" / "embedded" / "tables"
    settings = yaml.safe_load((tables / "config.yaml").read_text())
    fig, caption = paper.draw_paper_figure("fig13_regularisation", settings, aggregate.read_tables(tables),
                                           encoding.read_claims(tables / "claims.csv"))  # fmt: skip
    assert every_problem(fig, caption, settings) == []
    committed = (ROOT / "docs" / "embedded" / "fig13_regularisation.md").read_text()
    assert committed == f"![fig13_regularisation](fig13_regularisation.png)\n\n{str(caption).strip()}\n"
    plt.close(fig)


def test_a_bars_panel_draws_the_base_model_without_its_template_where_it_asks():
    """Figs. 5 and 10 draw the paper's Baseline (No-CT) beside Baseline (CT): a panel with base_without_template draws
    the base model's evaluation without its chat template as its own bars (grey, starred), and its caption says so."""
    config = study_config()
    name = next(n for n, f in config["figures"].items() if any(p["kind"] == "bars" for p in f["panels"]))
    tables = study_tables(config)
    for asked in (False, True):
        for panel in config["figures"][name]["panels"]:
            panel["base_without_template"] = asked
        fig, caption = paper.draw_paper_figure(name, config, tables)
        starred = [p for ax in fig.axes for p in ax.patches if (p.get_gid() or "").endswith(";bar_no_template")]
        panels = sum(p["kind"] == "bars" for p in config["figures"][name]["panels"])
        assert len(starred) == (panels * len(config["evaluation"]["tasks"]) if asked else 0)
        assert all(p.get_hatch() == encoding.NO_TEMPLATE_HATCH for p in starred)
        assert ("starred, without its chat template" in caption) == asked
        plt.close(fig)


def test_the_base_model_s_se_does_not_shrink_with_its_evaluations_of_the_same_questions():
    """Four step-0 evaluations of one model on the same 100 questions: the questions' spread stays, so the se is one
    evaluation's (√(Σ se²)/n, as if independent, would halve it); without per-question scores, their mean se."""
    scores = [float(q % 3 == 0) for q in range(100)]
    one_se = float(np.std(scores, ddof=1) / 10)
    rows = pd.DataFrame({"study": "s", "model": "m", "step": 0, "seed": range(4), "pass_at_1": np.mean(scores),
                         "stderr": one_se, "per_prompt": [str(scores)] * 4})  # fmt: skip
    config = {"studies": {"s": {"heldout_data": "d", "models": ["m"]}}}
    assert panels.base_heldout(rows, config, "m", "d") == pytest.approx((np.mean(scores), one_se))
    without = rows.drop(columns="per_prompt").assign(stderr=[0.04, 0.05, 0.04, 0.05])
    assert panels.base_heldout(without, config, "m", "d")[1] == pytest.approx(0.045)
