"""The figures' rules, each a test that can fail: numbers in a caption read from what is drawn, noise drawn as it is,
no panel that shows nothing, words instead of identifiers, one style table for every artist, print sizes and fonts.
Every figure of a synthetic run (tests/figure_study.py) is drawn once, in memory; each check runs on all of them, and
each check is shown to fail once on a figure broken on purpose."""

from pathlib import Path

import matplotlib.colors as mcolors
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from docutils.core import publish_parts
from figure_checks import (
    caption_body,
    every_problem,
    identifier_problems,
    ink_problems,
    panel_problems,
    size_problems,
    style_problems,
)
from figure_study import claims_table, study_config, study_tables

from klstudy import config as config_module
from klstudy import figure_plan
from klstudy.report import aggregate
from klstudy.report.figures import captions, encoding, forest, panels, paper, redraw, training
from klstudy.report.figures import toy as toy_figures

ROOT = Path(__file__).resolve().parents[1]
PAPER_CONFIGS = ["none", "k1-reward", "k1-loss", "k3-reward", "k3-loss", "k1-both", "k3-both", "k2-reward", "k2-loss",
                 "k2-both"]  # fmt: skip


@pytest.fixture(scope="module")
def run():
    """A synthetic run of config.yaml: the on-policy study with two seeds, the others with one."""
    config = study_config(2)
    return config, study_tables(config), claims_table(config)


def draw_every_figure(config, tables, claims) -> list[tuple[str, object, str]]:
    """Every figure the workflow would draw for this config: (name, figure, caption)."""
    drawn = [(name, *paper.draw_paper_figure(name, config, tables, claims)) for name in config["figures"]]
    for target in config_module.training_figures(config):
        study = Path(target).name.removeprefix("training_")
        drawn.append((f"training_{study}", *training.draw_training_figure(study, config, tables)))
    for target in config_module.claims_figures(config):
        metric = Path(target).name.removeprefix(f"{figure_plan.CLAIMS_FIGURE}_")
        drawn.append((Path(target).name, *forest.draw_claims_forest(claims, config, metric)))
    return drawn


@pytest.fixture(scope="module")
def figures(run):
    drawn = draw_every_figure(*run)
    yield drawn
    for _, fig, _ in drawn:
        plt.close(fig)


def test_every_figure_of_a_run_passes_every_check(run, figures):
    """Style table, numbers from the ink, no identifiers, no empty panel, print size and fonts: every figure."""
    config = run[0]
    assert len(figures) >= 14
    found = [f"{name}: {problem}" for name, fig, caption in figures for problem in every_problem(fig, caption, config)]
    assert found == []


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
    """A caption quoting the drawn point passes; one quoting a number the figure does not draw fails, as does a
    quote read from an artist of another figure."""
    fig, ax = plt.subplots(figsize=(3.5, 2))
    line = ax.plot([0, 15], [0.31, 0.35], label="no KL")[0]
    caption = captions.Caption()
    caption.add(f"No KL ends at {caption.value(line)}.")
    assert ink_problems(fig, caption.text()) == []
    caption.add("The off-policy run reads −0.07.")  # the kind of number issue #72 found: another seed's
    assert ink_problems(fig, caption.text()) == ["-0.07: in the caption, neither drawn, shown nor declared"]
    other, ax2 = plt.subplots()
    elsewhere = captions.Caption()
    elsewhere.add(f"{elsewhere.value(ax2.plot([0], [0.5])[0])}")
    assert "not drawn in this figure" in " ".join(ink_problems(fig, elsewhere.text()))
    line.set_ydata([0.31, 0.45])  # the drawing changed after the caption read it
    assert "the artist draws 0.45" in " ".join(ink_problems(fig, caption.text()))
    plt.close(fig)
    plt.close(other)


def test_the_identifier_check_catches_ids_files_and_keys(run):
    config = run[0]
    fig, ax = plt.subplots(figsize=(3.5, 2))
    ax.set_title("held-out pass@1 (MATH test)")
    assert identifier_problems(fig, "K1 in the reward, β = 0.1: not shown.", config) == []
    for text in ("k1_reward_regularises: shown", "see figures/claims.csv", "the critical value min_z",
                 "study onpolicy", "k1-reward at β 1", "on countdown_test"):  # fmt: skip
        assert identifier_problems(fig, text, config), text
    plt.close(fig)


def test_the_panel_check_catches_constant_data_a_lone_point_and_no_reference():
    fig, axes = plt.subplots(1, 3, figsize=(7, 2))
    axes[0].plot([0, 5, 10], [0.0, 0.0, 0.0])
    axes[1].plot([1], [0.3], "o")
    axes[2].plot([0, 1], [0.2, 0.3])
    found = " | ".join(panel_problems(fig, "A caption with no claim."))
    assert "constant data" in found and "1 point" in found and "no claim about the figure" in found
    plt.close(fig)


def test_the_size_check_catches_a_wrong_print_size_and_a_small_font():
    fig, ax = plt.subplots(figsize=(12, 4))
    ax.set_title("tiny", fontsize=5)
    found = " | ".join(size_problems(fig))
    assert "print size 12.00 × 4.00 in" in found and "font too small" in found
    plt.close(fig)
    with pytest.raises(ValueError, match="print sizes"):
        encoding.save(plt.figure(figsize=(12, 4)), Path("/nonexistent/never.png"))


# ---------------------------------------------------------------------------------------------------------
# The style table.


def test_one_palette_colour_is_the_configuration_and_line_style_the_beta_by_its_value():
    low, high = encoding.style_of("k1-reward", 0.1), encoding.style_of("k1-reward", 1.0)
    assert low["color"] == high["color"] and low["linestyle"] != high["linestyle"]
    colours = {str(encoding.config_colour(k)) for k in [*PAPER_CONFIGS, "k3-loss-ratio", "base"]}
    assert len(colours) == len(PAPER_CONFIGS) + 2  # a framework's variant is told apart from its pathwise configuration
    assert encoding.beta_linestyle(0.0) == encoding.beta_linestyle(None) == "-"
    styles = [str(encoding.beta_linestyle(b)) for b in encoding.BETA_STYLES]
    hatches = [encoding.beta_hatch(b) for b in encoding.BETA_STYLES]
    assert "-" not in styles and "" not in hatches  # no β is drawn as no KL's solid line or unhatched bar
    assert len(set(styles)) == len(styles) and len(set(hatches)) == len(hatches)
    words = [encoding.BETA_STYLE_WORDS[b] for b in encoding.BETA_STYLES]  # the conventions' words, one per style
    assert len(set(words)) == len(words)
    # a dash pattern started at another of its dashes, each length within half a line width, reads as the same line
    # (β = 0.3 and 3 did): no β's pattern is one of those of another
    patterns = [np.array(encoding.beta_linestyle(b)[1]) for b in encoding.BETA_STYLES]
    for i, pattern in enumerate(patterns):
        for j, other in enumerate(patterns[:i]):
            alike = len(other) == len(pattern) and any(
                np.abs(np.roll(pattern, k) - other).max() < 0.5 for k in range(0, len(pattern), 2))  # fmt: skip
            assert not alike, (list(encoding.BETA_STYLES)[j], list(encoding.BETA_STYLES)[i])
    verdicts = {mcolors.to_hex(c) for c in [*encoding.VERDICT_COLOURS.values(), encoding.UNTESTED_COLOUR]}
    assert not verdicts & {mcolors.to_hex(encoding.config_colour(k)) for k in [*PAPER_CONFIGS, "base"]}


def test_a_legend_sample_shows_two_periods_of_its_dashes():
    """β = 10's long dash was drawn solid in a legend: every β's dash period fits twice in a legend's sample."""
    sample = plt.rcParams["legend.handlelength"] * plt.rcParams["legend.fontsize"]  # points
    width = encoding.MEAN_LINEWIDTH  # the thickest line a β's style is drawn with
    for beta, (style, _) in encoding.BETA_STYLES.items():
        period = sum(style[1]) * width
        assert 2 * period <= sample, (beta, period, sample)


def test_placement_and_estimator_read_without_colour():
    keys = {(encoding.marker_of(k)["marker"], encoding.marker_of(k)["fillstyle"], encoding.marker_of(k).get(
        "markerfacecolor")) for k in PAPER_CONFIGS}  # fmt: skip
    assert len(keys) == len(PAPER_CONFIGS)


def test_every_estimator_has_a_marker_fill_of_its_own():
    from klstudy import kl

    fills = [encoding.ESTIMATOR_FILLS.get(estimator) for estimator in kl.ESTIMATORS]
    assert None not in fills and len(set(fills)) == len(fills), dict(zip(kl.ESTIMATORS, fills, strict=True))


def test_the_palette_is_colour_blind_safe_for_the_papers_contrasts():
    def lightness(kl):
        r, g, b = mcolors.to_rgb(encoding.config_colour(kl))
        return 0.2126 * r + 0.7152 * g + 0.0722 * b

    def blue_yellow(kl):
        r, g, b = mcolors.to_rgb(encoding.config_colour(kl))
        return b - (r + g) / 2

    for a, b in [("k3-reward", "k3-loss"), ("k1-reward", "k1-loss")]:
        assert abs(lightness(a) - lightness(b)) > 0.15, (a, b)
    assert blue_yellow("k1-reward") > 0 > blue_yellow("k3-loss")


# ---------------------------------------------------------------------------------------------------------
# Noise drawn as it is.


def _curves(config, tables, kls=("none", "k1-loss")):
    fig, ax = plt.subplots()
    drawn = panels.curves_panel(ax, {"kind": "curves", "study": "onpolicy", "model": "tiny", "kl": list(kls)}, config,
                                tables)  # fmt: skip
    return fig, ax, drawn


@pytest.mark.parametrize(("seeds", "band", "thin"), [(1, True, False), (2, False, True), (4, False, True),
                                                     (5, True, False)])  # fmt: skip
def test_one_seed_carries_its_own_error_few_seeds_are_drawn_each_and_many_get_a_band(seeds, band, thin):
    config = study_config(seeds)
    fig, ax, drawn = _curves(config, study_tables(config))
    gids = [artist.get_gid() or "" for artist in [*ax.lines, *ax.collections]]
    assert any(g.endswith(";band") for g in gids) == band
    assert any(g.endswith(";seed") for g in gids) == thin
    assert drawn.seeds == {seeds}
    plt.close(fig)


def test_many_one_seed_curves_carry_their_error_as_bars_not_bands():
    """Up to two one-seed curves: each a band; more: each point's ±1 se a bar of its colour (bands would cover each
    other), the bar as long as the band would be."""
    config = study_config(1)
    tables = study_tables(config)
    kls = ("none", "k1-reward", "k1-loss", "k3-loss")
    fig, ax, drawn = _curves(config, tables, kls)
    bars = [c for c in ax.collections if (c.get_gid() or "").endswith(";band")]
    assert bars and all(type(c).__name__ == "LineCollection" for c in bars) and drawn.has_error_bars
    assert not drawn.has_band and not style_problems(fig)
    two, ax_two = plt.subplots()
    first_beta = config["studies"]["onpolicy"]["betas"][0]
    drawn_two = panels.curves_panel(ax_two, {"kind": "curves", "study": "onpolicy", "model": "tiny",
                                             "kl": list(kls[:2]), "betas": [first_beta]}, config, tables)  # fmt: skip
    bands = [c for c in ax_two.collections if (c.get_gid() or "").endswith(";band")]
    assert bands and not any(type(c).__name__ == "LineCollection" for c in bands) and not drawn_two.has_error_bars
    heldout = tables["heldout"]
    for bar in bars:
        gid = encoding.GID.match(bar.get_gid())
        rows = heldout[(heldout.study == "onpolicy") & (heldout.kl == gid["kl"]) & (heldout.step > 0)
                       & np.isclose(heldout.beta, float(gid["beta"] or 0))]  # fmt: skip
        # none at step 0: the base model's point carries its own
        drawn_errors = sorted(round(float(seg[1, 1] - seg[0, 1]) / 2, 9) for seg in bar.get_segments())
        assert drawn_errors == sorted(round(float(e), 9) for e in rows.stderr), bar.get_gid()
    plt.close(fig), plt.close(two)


def test_the_base_model_is_one_point_the_same_in_every_figure(run, figures):
    """Every held-out panel on one task starts from the same base point, the mean of its distinct evaluations."""
    config, tables, _ = run
    points = {(ax.get_ylabel(), line.get_ydata()[0]) for _, fig, _ in figures for ax in fig.axes for line in ax.lines
              if line.get_gid() == "reference base"}  # fmt: skip
    by_task = {}
    for label, y in points:
        by_task.setdefault(label.split("\n")[0], set()).add(round(float(y), 12))
    assert by_task and all(len(values) == 1 for values in by_task.values()), by_task
    math_test = [s for s, spec in config["studies"].items() if spec["heldout_data"] == "math_test"]
    rows = tables["heldout"][tables["heldout"].study.isin(math_test) & (tables["heldout"].step == 0)]
    expected = rows.drop_duplicates(["seed", "pass_at_1"]).pass_at_1.mean()
    assert by_task["held-out pass@1, MATH test"] == {round(expected, 12)}


def test_every_curve_leaves_from_the_base_point_with_no_marker_or_band_of_its_own_there(run, figures):
    """Where a panel draws the base model's point, every configuration's line starts at it (step 0, not dodged)
    without a marker there, and no band or bar covers step 0: the base model is drawn once."""
    checked = 0
    for name, fig, _ in figures:
        for ax in fig.axes:
            base = [line for line in ax.lines if line.get_gid() == "reference base"]
            if not base:
                continue
            x0, y0 = float(base[0].get_xdata()[0]), float(base[0].get_ydata()[0])
            for line in ax.lines:
                xs, ys = np.asarray(line.get_xdata(), dtype=float), np.asarray(line.get_ydata(), dtype=float)
                if (line.get_gid() or "").endswith(";seed"):  # each seed's thin line leaves from it too
                    assert (xs[0], ys[0]) == pytest.approx((x0, y0)), (name, line.get_gid())
                if not (line.get_gid() or "").startswith("style kl=") or line.get_label().startswith("_"):
                    continue
                assert (xs[0], ys[0]) == pytest.approx((x0, y0)), (name, line.get_label())
                marked = line.get_markevery()
                assert marked is not None and 0 not in list(marked), (name, line.get_label(), marked)
                checked += 1
            for band in ax.collections:
                if (band.get_gid() or "").endswith(";band"):
                    covered = [v[:, 0] for v in (p.vertices for p in band.get_paths()) if len(v)]
                    starts = [np.nanmin(c) for c in covered if np.isfinite(c).any()]
                    assert all(start > x0 + 1e-9 for start in starts), (name, band.get_gid())
    assert checked


def test_an_entropy_axis_keeps_a_span_that_shows_its_noise(run):
    config, tables, _ = run
    fig, ax = plt.subplots()
    panel = {"kind": "divergence", "metric": "entropy", "task": "math_test", "study": "onpolicy", "model": "tiny",
             "kl": ["k1-reward", "k3-loss"], "betas": [0.1]}  # fmt: skip
    panels.divergence_panel(ax, panel, config, tables)
    low, high = ax.get_ylim()
    assert high - low >= 8 * 0.01 - 1e-9  # ± 4 of its 0.01 standard errors
    plt.close(fig)


def test_one_beta_is_one_category_never_a_dodge_on_a_log_axis(run):
    config, tables, _ = run
    fig, ax = plt.subplots()
    panels.kl_vs_beta_panel(ax, {"kind": "kl_vs_beta", "study": "onpolicy", "model": "tiny", "betas": [0.1]}, config,
                            tables)  # fmt: skip
    assert ax.get_xscale() == "linear" and [t.get_text() for t in ax.get_xticklabels()] == ["no KL", "0.1"]
    plt.close(fig)


def test_a_gradient_norm_gets_a_log_axis_only_where_it_spans_a_decade(run):
    config, tables, _ = run
    fig, caption = training.draw_training_figure("onpolicy", config, tables)
    assert {ax.get_yscale() for ax in fig.axes} == {"linear"} and "a linear axis" in caption  # 0.8–1.3 here
    plt.close(fig)
    wide = tables["training"].assign(grad_norm=np.where(tables["training"].kl == "none", 0.2, 6.0))
    fig, caption = training.draw_training_figure("onpolicy", config, {**tables, "training": wide})
    assert "log" in {ax.get_yscale() for ax in fig.axes} and "span 0.2 to 6: a log axis" in caption
    plt.close(fig)


# ---------------------------------------------------------------------------------------------------------
# Words, designs, and what is left out.


def test_a_figure_of_panels_of_different_designs_says_so(run):
    config, tables, claims = run
    other = {**config, "studies": {**config["studies"], "onpolicy": {
        **config["studies"]["onpolicy"], "train": {**config["studies"]["onpolicy"]["train"], "batch_prompts": 16,
                                                   "minibatch_prompts": 16, "rollouts": 8}}}}  # fmt: skip
    fig, caption = paper.draw_paper_figure("fig02_k1_in_loss", other, tables, claims)
    titles = [ax.get_title().replace("\n", " ") for ax in fig.axes if ax.get_title()]
    assert "(panels of different designs)" in fig._suptitle.get_text()
    assert any("16 prompts × 8 completions a step, 1 update per batch" in t for t in titles)
    assert any("4 updates per batch 8 prompts × 4 completions a step" in t for t in titles)  # not said twice
    plt.close(fig)
    fig, _ = paper.draw_paper_figure("fig03_k3_in_reward", config, tables, claims)
    assert "designs" not in fig._suptitle.get_text()
    plt.close(fig)


def test_a_figure_states_the_claims_verdict_in_words_never_its_own(run):
    config, tables, claims = run
    fig, caption = paper.draw_paper_figure("fig13_regularisation", config, tables, claims.assign(verdict="shown"))
    assert "K1 in the reward keeps the policy closer to the reference than no KL: β = 0.1 shown, β = 1 shown" in caption
    assert "k1_reward_regularises" not in caption
    plt.close(fig)
    plain, text = paper.draw_paper_figure("fig13_regularisation", config, tables)
    assert "shown" not in text and "Claims about" not in text
    plt.close(plain)


def test_rings_mark_only_the_points_the_claims_table_shows(run):
    config, tables, claims = run
    shown = claims.assign(verdict=np.where((claims.claim == "k1_reward_regularises") & (claims.beta == 0.1), "shown",
                                           claims.verdict))  # fmt: skip
    fig, _ = paper.draw_paper_figure("fig13_regularisation", config, tables, shown)
    rings = [line for ax in fig.axes for line in ax.lines if line.get_label() == "_ring"]
    assert len(rings) == 1 and rings[0].get_color() == encoding.VERDICT_COLOURS["shown"]
    plt.close(fig)


def test_a_panel_with_nothing_to_show_is_dropped_and_said(run):
    """Every run scoring 0 at every evaluation: the panel goes, the caption says why."""
    config, tables, claims = run
    flat = {**tables, "heldout": tables["heldout"].assign(pass_at_1=0.0)}
    fig, caption = paper.draw_paper_figure("fig02_k1_in_loss", config, flat, claims)
    assert [ax for ax in fig.axes if ax.lines] == [] and "Not drawn: on-policy, every run scores 0" in caption
    plt.close(fig)


def test_what_the_workflow_draws_leaves_out_what_would_show_nothing(run):
    """No training figure for a study trained only on its lag (async Countdown: KL 0 by construction) or without a
    reference; a claims forest only for metrics with a claim testable by design; README.md says what is left out."""
    config = run[0]
    studies = [Path(t).name for t in config_module.training_figures(config)]
    assert "training_async_countdown" not in studies and "training_onpolicy" in studies
    assert "training_offpolicy_k1_loss" not in studies and "training_unbiased" in studies
    assert [Path(t).name for t in config_module.claims_figures(config)] == [
        "claims_forest_heldout", "claims_forest_final_kl", "claims_forest_evaluation"]  # fmt: skip
    text = redraw.readme(config)
    assert "Countdown" in text and "by construction" in text and "forward KL to the base policy" in text
    publish_parts(text, writer="html", settings_overrides={"halt_level": 2, "report_level": 2})  # the report's


def test_no_figure_draws_a_subscript_as_an_underscore(figures):
    """π_ref, π_sampling, J_β are drawn with true subscripts; read back, the glossary's words are the same."""
    from matplotlib.text import Text

    for name, fig, _ in figures:
        drawn = [t.get_text() for t in fig.findobj(Text)]
        assert not [t for t in drawn if captions.SUBSCRIPT.search(t)], name
    assert captions.plain(captions.as_math("KL(π_sampling‖π_ref), J_β, π_θ")) == "KL(π_sampling‖π_ref), J_β, π_θ"
    assert "_" not in captions.as_math("KL(π_ref‖π_θ)").replace("$_", "")


def test_every_caption_is_also_restructured_text_for_the_report(figures):
    """The report shows each caption file through reStructuredText: no markup there may break it."""
    for _, _, caption in figures:
        publish_parts(str(caption), writer="html", settings_overrides={"halt_level": 2, "report_level": 2})


def test_a_caption_defines_every_abbreviation_it_uses(figures):
    for name, fig, caption in figures:
        text = captions.image_texts(fig) + " " + caption_body(caption)
        defined = str(caption).split("Abbreviations: ")[-1]
        for term in ("KL", "K1", "K3", "β", "se", "pass@1"):
            if captions.used(term, text):
                assert f"{term}: " in defined, (name, term)


# ---------------------------------------------------------------------------------------------------------
# The forest.


def test_a_forest_prints_the_z_its_interval_draws(run):
    """Each row's 'z …, critical …' agrees with the interval drawn: z = effect·critical / half-width."""
    config, _, claims = run
    claims = claims.assign(effect=-0.1, se=0.01, critical=3.0, z=10.0)
    fig, _ = forest.draw_claims_forest(claims, config, "final_kl")
    ax = fig.axes[0]
    intervals = [line for line in ax.lines if line.get_gid() == "interval"]
    effects = [line for line in ax.lines if line.get_gid() == "effect"]
    printed = [t.get_text() for t in fig.axes[-1].get_yticklabels() if t.get_text()]
    assert len(intervals) == len(effects) == len(printed) > 0
    for interval, effect, text in zip(intervals, effects, printed, strict=True):
        low, high = interval.get_xdata()
        z = -effect.get_xdata()[0] * 3.0 / ((high - low) / 2)  # towards the prediction (lower)
        assert f"z {encoding.short_number(z)}, critical 3" in text
    plt.close(fig)


def test_a_forests_claim_headings_lie_inside_its_frame(run):
    """A claim's heading, wrapped, ends before the panel's right-hand spine (the twin axis' labels beyond it)."""
    config, _, claims = run
    long = claims.assign(text=claims.text.astype(str) + " and a clause long enough to reach past the frame line")
    for metric in ("heldout", "final_kl"):
        fig, _ = forest.draw_claims_forest(long, config, metric)
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        for ax in fig.axes:
            for text in ax.texts:
                assert text.get_window_extent(renderer).x1 <= ax.get_window_extent(renderer).x1, text.get_text()
        plt.close(fig)


def test_a_forest_leaves_claims_untestable_by_design_to_a_sentence(run):
    config, _, claims = run
    fig, caption = forest.draw_claims_forest(claims, config, "heldout")
    assert "Not drawn, with one paired seed by design" in caption and "Asynchronous RL" in caption
    headers = [t.get_text() for t in fig.axes[0].texts]
    assert not any("Asynchronous" in h for h in headers) and any("RL without a KL penalty" in h for h in headers)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------------------
# The toy figures.


def toy_results() -> tuple[pd.DataFrame, pd.DataFrame]:
    """fig01's inputs, small: two settings, T = 1, 2, 4 and one T without an exact value; K1 in the reward unbiased,
    K3 in the loss biased with K1 in the loss's bias (drawn once)."""
    rows = []
    for setting in ("close", "apart"):
        for length in (1, 2, 4, 32):
            for config, exact in (("k1-reward", 0.0), ("k3-reward", 0.01 * length), ("k3-loss", 0.02 * length),
                                  ("k1-loss", 0.02 * length)):  # fmt: skip
                for param in ("a", "b"):
                    estimator, _, placement = config.partition("-")
                    rows.append(dict(setting=setting, T=length, param=param, config=config, estimator=estimator,
                                     placement=placement, loss_gradient="pathwise", true_grad=0.5,
                                     exact_bias=np.nan if length == 32 else exact, bias=exact + 0.001,
                                     std_error=0.003, variance=0.1 * length * (1 + 0.3 * (config == "k1-loss")),
                                     trials=200, sequences=1000))  # fmt: skip
    tests = pd.DataFrame({"config": ["k1-reward", "k3-reward", "k3-loss", "k1-loss"],
                          "exact_unbiased": [True, False, False, False], "z_critical": 4.0})  # fmt: skip
    return pd.DataFrame(rows), tests


def test_fig01_draws_the_exact_bias_over_the_noise_floor_and_names_coinciding_configurations(run):
    results, tests = toy_results()
    fig, caption = toy_figures.draw_fig01(results, tests)
    bias = fig.axes[0]
    k3 = [line for line in bias.lines if line.get_label() == "K3 in reward"][0]
    assert list(k3.get_xdata()) == [1, 2, 4] and list(k3.get_ydata()) == pytest.approx([1e-4, 4e-4, 16e-4])
    assert "K3 in loss = K1 in loss" in caption and "Squared bias exactly zero at every T" in caption
    assert every_problem(fig, caption, run[0]) == []
    plt.close(fig)


def toy_end_points():
    section = {"length": 4, "reward": {"threshold": 3}, "betas": [0.3, 1.0, 3.0],
               "monte_carlo": {"seeds": 20, "betas": [1.0, 3.0]}}  # fmt: skip
    on = {0.3: (0.9, 1.2), 1.0: (0.7, 0.6), 3.0: (0.35, 0.1)}
    rows = [dict(family="tabular", config=c, beta=b, status="stable", reward=r, kl=k, objective_gap=0.0)
            for c in ("k1-reward", "k3-both") for b, (r, k) in on.items()]  # fmt: skip
    rows += [dict(family="tabular", config="k3-loss", beta=b, status="stable", reward=r - 0.1, kl=k,
                  objective_gap=0.01 / b) for b, (r, k) in on.items()]  # fmt: skip
    rows += [dict(family="tabular", config=c, beta=b, status="drifts", reward=1.0, kl=2.74, objective_gap=np.nan)
             for c in ("none", "k1-loss") for b in on]  # fmt: skip
    fronts = pd.DataFrame({"family": "tabular", "kl": [0.0, 0.3, 2.5], "reward": [0.2, 0.5, 1.0]})
    agreed = pd.DataFrame({"family": "tabular", "mode": "on-policy", "config": ["k3-loss"] * 2 + ["k1-loss"] * 2,
                           "beta": [1.0, 3.0] * 2, "seeds": 20, "mc_reward": [0.6, 0.25, 0.99, 0.98],
                           "mc_reward_se": 0.01, "mc_kl": [0.6, 0.1, 2.4, 2.3], "mc_kl_se": 0.01})  # fmt: skip
    return pd.DataFrame(rows), fronts, agreed, section


def test_the_toy_figure_draws_coinciding_end_points_once_and_names_where_the_drifting_ones_stop(run):
    points, fronts, agreed, section = toy_end_points()
    fig, caption = toy_figures.draw_toy_fixed_points(points, fronts, agreed, section)
    labels = [line.get_label() for line in fig.axes[0].lines if not line.get_label().startswith("_")]
    assert "K1 in reward = K3 in reward and loss" in labels and "K1 in reward" not in labels
    assert "drifts, at KL 2.74 and task reward 1.00: no KL (β = 0) (β 0.3, 1, 3); K1 in loss (β 0.3, 1, 3)" in caption
    assert len(fig.legends[0].get_texts()) <= 8
    assert every_problem(fig, caption, run[0]) == []
    plt.close(fig)


def test_the_monte_carlo_check_has_panels_of_its_own_a_row_per_configuration_trained(run):
    """The seeds' end points are not drawn over the exact ones (crosses on markers of their colour hid their bars):
    a panel per β, a row per configuration trained, named in words, the exact end point above (▶ where its flow
    stopped) and the seeds' mean ± sd below, a cross (no placement's marker, no estimator's fill)."""
    points, fronts, agreed, section = toy_end_points()
    fig, caption = toy_figures.draw_toy_fixed_points(points, fronts, agreed, section)
    exact_panels = [ax for ax in fig.axes if "where training ends" in ax.get_title()]
    assert exact_panels and not [c for ax in exact_panels for c in ax.containers]
    check = [ax for ax in fig.axes if ax.get_title().startswith("β ")]
    assert [ax.get_title() for ax in check] == ["β 1", "β 3"]
    assert [t.get_text() for t in check[0].get_yticklabels()] == ["K1 in loss", "K3 in loss"]  # shared by the rest
    for ax, beta in zip(check, (1.0, 3.0), strict=True):
        crosses = [c.lines[0] for c in ax.containers if c.get_label() == "_monte_carlo"]
        exact = [line for line in ax.lines if line.get_label() == "_exact"]
        assert {line.get_marker() for line in crosses} == {"x"}
        assert [line.get_marker() for line in exact] == [">", encoding.PLACEMENT_MARKERS["loss"]]
        for config, cross, end in zip(("k1-loss", "k3-loss"), crosses, exact, strict=True):
            assert cross.get_xdata()[0] == pytest.approx(agreed[(agreed.config == config) & (agreed.beta == beta)]
                                                         .mc_kl.iloc[0])  # fmt: skip
            assert end.get_xdata()[0] == pytest.approx(points[(points.config == config) & (points.beta == beta)]
                                                       .kl.iloc[0])  # fmt: skip
            assert end.get_ydata()[0] < cross.get_ydata()[0]  # rows run down: the exact end point above its seeds
    assert "a row per configuration trained (tabular policy: K1 in loss, K3 in loss)" in caption
    plt.close(fig)


def test_figure_1_defines_its_settings_and_names_the_lines_that_read_as_one():
    """Each column's setting is defined by its parameters in the caption; lines within a factor NEAR of each other at
    most T are named there; the shipped tables' first setting drawn first."""
    import yaml

    tables = ROOT / "docs" / "embedded" / "tables"
    definitions = yaml.safe_load((tables / "config.yaml").read_text())["toy"]["settings"]
    results = pd.concat([pd.read_csv(tables / "toy" / f"{name}.csv") for name in definitions], ignore_index=True)
    fig, caption = toy_figures.draw_fig01(results, pd.read_csv(tables / "toy" / "unbiasedness.csv"), definitions)
    close = definitions["close"]
    assert f"“close”: the policy's (a, b) = ({close['a']:g}, {close['b']:g})" in caption
    assert "K2 in reward, K3 in reward" in caption  # they lie within a factor 1.25 in the squared-bias panels
    widths = [line.get_linewidth() for line in fig.axes[0].lines if (line.get_gid() or "").startswith("style kl=")]
    assert widths == sorted(widths, reverse=True) and widths[0] > widths[-1]
    plt.close(fig)


def test_a_caption_says_a_one_seed_error_is_drawn_only_where_it_is():
    """One seed: 'the band is ±1 se' where a band is drawn, 'the bar' where bars are, and neither for a smoothed
    training curve, whose raw steps are its noise (a caption claimed a band that panel never had)."""
    smoothed = panels.Drawn("kl", seeds={1})
    assert "band" not in paper.noise_text(smoothed).split(";")[1] and "no band" in paper.noise_text(smoothed)
    assert "the band is" in paper.noise_text(panels.Drawn("heldout", seeds={1}, has_band=True))
    assert "the bar is" in paper.noise_text(panels.Drawn("kl", seeds={1}, has_error_bars=True))
    assert "error bar" in paper.noise_text(panels.Drawn("accuracy", seeds={1}, unit="bar"))


@pytest.mark.parametrize(("steps", "ticks"), [(range(1, 16), [5, 10, 15]), ([0, 4, 8, 12], [0, 4, 8, 12]),
                                              (range(0, 101), [0, 25, 50, 75, 100])])  # fmt: skip
def test_step_ticks_fall_on_a_divisor_of_the_last_step(steps, ticks):
    """Ticks every 5 steps in a run of 15 that evaluates every 5 (not every 3, between its evaluations)."""
    fig, ax = plt.subplots()
    ax.plot(list(steps), np.zeros(len(steps)))
    encoding.step_axis(ax, pd.Series(list(steps)))
    fig.canvas.draw()
    low, high = ax.get_xlim()
    assert [t for t in ax.get_xticks() if low <= t <= high] == ticks
    plt.close(fig)


# ---------------------------------------------------------------------------------------------------------
# A shipped folder redrawn from its committed tables.


@pytest.mark.parametrize("folder", ["embedded", "smollm2", "separation", "toy", "atlas"])
def test_no_shipped_caption_names_a_file_or_an_identifier(folder):
    """Every figure caption a shipped folder holds (up to its table, in a toy report) is read for snake_case, file
    names (a model's GGUF path among them), configuration ids and its run's config names."""
    import yaml
    from figure_checks import identifier_problems

    shipped = ROOT / "docs" / folder
    if not (shipped / "tables").is_dir():
        pytest.skip(f"docs/{folder} ships no tables to redraw it from: its run must be made again (the configs "
                    "docs/results.md names, `make study RUN_DIR=…`) and its tables copied into tables/")
    settings = shipped / "tables" / "config.yaml"
    config = yaml.safe_load(settings.read_text()) if settings.is_file() else {}
    captions = [png.with_suffix(".md") for png in sorted(shipped.glob("*.png"))]
    assert captions, folder
    fig = plt.figure()
    for caption in captions:
        text = caption.read_text().split(redraw.TABLE_MARK)[0]
        assert identifier_problems(fig, text, config) == [], caption.name
    plt.close(fig)


@pytest.mark.parametrize("folder", ["embedded"])
def test_a_committed_figure_redraws_from_its_committed_tables(folder, tmp_path):
    """docs/<folder>/tables holds what its figures read: fig13 redrawn from it passes every check, and its caption is
    the committed one (the committed figures are this code's)."""
    import yaml

    tables = ROOT / "docs" / folder / "tables"
    settings = yaml.safe_load((tables / "config.yaml").read_text())
    read = aggregate.read_tables(tables)
    claims = encoding.read_claims(tables / "claims.csv")
    fig, caption = paper.draw_paper_figure("fig13_regularisation", settings, read, claims)
    assert every_problem(fig, caption, settings) == []
    committed = (ROOT / "docs" / folder / "fig13_regularisation.md").read_text()
    assert committed == f"![fig13_regularisation](fig13_regularisation.png)\n\n{str(caption).strip()}\n"
    plt.close(fig)


def test_a_panel_whose_values_would_fill_a_sliver_of_the_shared_range_keeps_its_own_and_says_so():
    """Panels of one quantity share a y range, but not one whose values stay under a third of it: fig12's biology
    forward KL (0.02-0.05) was drawn on the MATH panel's 0-0.35, its noise unreadable."""
    fig, axes = plt.subplots(1, 3)
    for ax, top in zip(axes, (0.35, 0.2, 0.06), strict=True):
        ax.plot([0, 1], [0, top])
    drawn = [panels.Drawn("forward_kl") for _ in axes]
    panels.share_y(list(axes), drawn)
    assert axes[0].get_ylim() == axes[1].get_ylim() and axes[2].get_ylim()[1] < 0.1
    assert [d.own_scale for d in drawn] == [False, False, True]
    plt.close(fig)


def test_an_error_bar_shows_on_a_black_bar_and_a_zero_bar_is_written():
    """Every bar's error bar has a white rim (black on the black no-KL bar was invisible), and a bar of height 0 says
    0 (an empty slot read as a missing result): smollm2's evaluation figure, from its shipped tables."""
    import yaml

    tables = ROOT / "docs" / "smollm2" / "tables"
    config = yaml.safe_load((tables / "config.yaml").read_text())
    name = next(n for n, f in config["figures"].items() if any(p["kind"] == "bars" for p in f["panels"]))
    fig, _ = paper.draw_paper_figure(name, config, aggregate.read_tables(tables))
    ax = fig.axes[0]
    stems = [stem for bars in ax.containers if getattr(bars, "errorbar", None) for stem in bars.errorbar.lines[2]]
    assert stems and all(stem.get_path_effects() for stem in stems)
    heights = [p.get_height() for p in ax.patches if p.get_gid()]
    assert (0.0 in heights) == any(t.get_text() == "0" for t in ax.texts)
    assert 0.0 in heights  # the shipped run has one (K1 in the loss on MATH²): the test above is not empty
    plt.close(fig)


def test_a_crowded_training_panel_draws_each_seeds_final_value_and_a_forest_names_each_claims_study():
    """Where a panel would hold too many thin lines (each then the mean over seeds), each seed's final value stands
    as a dot right of the end, their mean the thick line's last point (a reader saw no seed drawn); a forest of claims
    on two studies names each claim's (two claims compared K1 in the loss with no KL at β = 10, one on new seeds).
    From docs/separation's shipped tables."""
    import yaml

    tables = ROOT / "docs" / "separation" / "tables"
    config = yaml.safe_load((tables / "config.yaml").read_text())
    read = aggregate.read_tables(tables)
    fig, caption = training.draw_training_figure("bridge", config, read)
    for ax in fig.axes:
        thick = {line.get_gid(): line for line in ax.get_lines() if not line.get_label().startswith("_")}
        dots = [c for c in ax.collections if c.get_label() == "_seed ends"]
        assert len(dots) == len(thick)
        for collection in dots:
            ends = np.asarray(collection.get_offsets())[:, 1]
            line = thick[collection.get_gid().replace(";band", ";line")]
            assert len(ends) == 4 and ends.mean() == pytest.approx(line.get_ydata()[-1])
    assert "each seed's final value then a dot" in caption
    plt.close(fig)
    claims = encoding.read_claims(tables / "claims.csv")
    fig, _ = forest.draw_claims_forest(claims, config, "final_kl")
    words = " ".join(" ".join(t.get_text().split()) for ax in fig.axes for t in ax.texts)
    assert f"in {encoding.study_name(config, 'bridge')}" in words and "in on-policy grid" in words
    plt.close(fig)


def test_a_kl_against_beta_panel_of_many_configurations_takes_the_page_width():
    """Seven configurations side by side in each β category, each with its seeds' dots, ran into one another in a
    column's width (the separating design's fig13)."""
    config = {"studies": {"grid": {"kl": ["none", "k1-reward", "k3-loss"]},
                          "wide": {"kl": ["none", "k1-reward", "k1-loss", "k3-reward", "k3-loss", "k1-both"]}}}
    assert paper._width([{"kind": "kl_vs_beta", "study": "grid"}], config) == encoding.SINGLE_COLUMN
    assert paper._width([{"kind": "kl_vs_beta", "study": "wide"}], config) == encoding.FULL_WIDTH
    assert encoding.wrap("How far each configuration keeps the policy (on-policy)", 50).endswith("(on-policy)")


def test_a_crowded_held_out_panel_draws_each_seeds_last_evaluation_as_a_dot_not_a_line():
    """Seven series of four seeds made 28 thin lines in one panel (the separating design's fig02): past
    RAW_SEED_LINES_UP_TO seed lines, each seed's last evaluation is a dot right of the end, the caption and legend say
    so, and a panel of few seed lines keeps them. From docs/separation's shipped tables."""
    import yaml

    from klstudy.report.figures import series

    tables = ROOT / "docs" / "separation" / "tables"
    config = yaml.safe_load((tables / "config.yaml").read_text())
    fig, caption = paper.draw_paper_figure("fig02_k1_in_loss", config, aggregate.read_tables(tables))
    crowded = fig.axes[0]
    assert not [line for line in crowded.get_lines() if line.get_label() == "_seed"]
    dots = [c for c in crowded.collections if c.get_label() == "_seed ends"]
    means = [line for line in crowded.get_lines() if not line.get_label().startswith("_") and "base" not in
             line.get_label()]  # fmt: skip
    assert len(dots) == len(means) and all(len(c.get_offsets()) == 4 for c in dots)
    assert min(c.get_offsets()[0][0] for c in dots) > max(max(line.get_xdata()) for line in means)
    assert "each seed's last evaluation a dot right of the end" in caption
    assert series.RAW_SEED_LINES_UP_TO < 7 * 4
    # which column is which, in drawing order; seeds that tie stand side by side (pass@1 moves in steps of 0.01)
    order = "; ".join(line.get_label() for line in means)
    assert f"left to right: {order}" in caption
    points = [tuple(p) for c in dots for p in c.get_offsets()]
    assert len(set(points)) == len(points)
    plt.close(fig)


def test_a_bars_panel_draws_the_base_model_without_its_template_where_it_asks():
    """Figs. 5 and 10 draw the paper's Baseline (No-CT) beside Baseline (CT): a panel with base_without_template draws
    the base model's evaluation without its chat template as its own bars (grey, starred), and its caption says so;
    without the key the caption lists it, undrawn."""
    config = study_config()
    name = next(n for n, f in config["figures"].items() if any(p["kind"] == "bars" for p in f["panels"]))
    tables = study_tables(config)
    for asked in (False, True):
        for panel in config["figures"][name]["panels"]:
            panel["base_without_template"] = asked
        fig, caption = paper.draw_paper_figure(name, config, tables)
        ax = next(ax for ax in fig.axes if any(p.get_gid() for p in ax.patches))
        starred = [p for p in ax.patches if (p.get_gid() or "").endswith(";bar_no_template")]
        assert len(starred) == (len(config["evaluation"]["tasks"]) if asked else 0)
        assert all(p.get_hatch() == encoding.NO_TEMPLATE_HATCH and p.get_height() == 0.0 for p in starred)
        assert ("starred, without it" in caption) == asked and ("is not drawn" in caption) != asked
        plt.close(fig)
