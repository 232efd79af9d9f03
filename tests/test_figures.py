"""The figures' rules, each a test that can fail: one encoding, one uncertainty convention with n on every panel,
verdicts from the claims table (never from means), legends outside the data, no empty panel without a reason, titles
from the config. A synthetic on-policy study drawn in memory; seconds in all."""

from pathlib import Path

import matplotlib.colors as mcolors
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import yaml
from rendered import problems

from klstudy.config import validate_config
from klstudy.report import aggregate
from klstudy.report.figures import encoding, forest, panels, paper
from klstudy.report.figures import toy as toy_figures
from klstudy.report.figures import training as training_figures

ROOT = Path(__file__).resolve().parents[1]
TASKS = ["math500", "math_squared", "mmlu_college_physics", "mmlu_college_chemistry", "mmlu_college_biology"]
# KL at the end of training per configuration and β: K1 in the reward falls clearly with β (in means).
ENDS = {("none", 0.0): 1.0, ("k1-reward", 0.1): 0.6, ("k1-reward", 1.0): 0.3, ("k1-loss", 0.1): 1.0,
        ("k1-loss", 1.0): 1.2, ("k3-reward", 0.1): 0.9, ("k3-reward", 1.0): 0.8, ("k3-loss", 0.1): 0.5,
        ("k3-loss", 1.0): 0.2}  # fmt: skip


@pytest.fixture(scope="module")
def config():
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["studies"]["onpolicy"]["seeds"] = [0, 1]
    # The configurations the synthetic tables below hold (config.yaml's list may grow: docs/tutorial-estimator.md).
    config["studies"]["onpolicy"]["kl"] = ["none", "k1-reward", "k1-loss", "k3-reward", "k3-loss"]
    return validate_config(config)


def identity(kl, beta, seed, study="onpolicy"):
    estimator, _, placement = kl.partition("-")
    return dict(study=study, model="tiny", kl=kl, estimator=estimator, placement=placement or "none", beta=beta,
                seed=seed)  # fmt: skip


@pytest.fixture(scope="module")
def tables():
    """The on-policy study of config.yaml, two seeds, every other study without results."""
    rng = np.random.default_rng(0)
    cells, training, heldout, evaluations, divergence = [], [], [], [], []
    for (kl, beta), end in ENDS.items():
        for seed in (0, 1):
            cell = identity(kl, beta, seed)
            cells.append({**cell, "status": "collapsed" if (kl, beta, seed) == ("k3-reward", 1.0, 1) else "ok"})
            for step in range(1, 16):
                training.append(
                    {
                        **cell,
                        "step": step,
                        "kl_k3": end * step / 15 + rng.normal(0, 0.05),
                        "task_reward": 0.3 + rng.normal(0, 0.02),
                        "grad_norm": 1 + rng.normal(0, 0.1),
                    }
                )
            for step in (0, 5, 10, 15):  # every line starts at the same score: equal values must not hide
                heldout.append({**cell, "step": step, "pass_at_1": 0.3 if step == 0 else 0.3 + 0.01 * seed,
                                "stderr": 0.045})  # fmt: skip
            if kl in ("k1-reward", "k3-loss"):
                for task in TASKS:
                    evaluations.append({**cell, "chat_template": "on", "task": task, "mean_at_k": 0.3 + 0.01 * seed,
                                        "stderr": 0.04, "unread": 0.1, "k": 4, "cell_status": "ok"})  # fmt: skip
                if beta == 0.1 and seed == 0:
                    for task in ("math_test", "mmlu_college_biology"):
                        for step in (0, 5, 10, 15):
                            divergence.append(
                                {
                                    **cell,
                                    "task": task,
                                    "step": step,
                                    "forward_kl": 0.01 * step,
                                    "forward_kl_stderr": 0.005,
                                    "entropy": 0.2,
                                    "entropy_stderr": 0.01,
                                }
                            )
    for template in ("on", "off"):
        for task in TASKS:
            evaluations.append({**identity("base", 0.0, 0, "base"), "kl": "base", "chat_template": template,
                                "task": task, "mean_at_k": 0.25 if template == "on" else 0.0, "stderr": 0.04,
                                "unread": 0.1, "k": 4, "cell_status": "base"})  # fmt: skip
    return {"cells": pd.DataFrame(cells), "training": pd.DataFrame(training), "heldout": pd.DataFrame(heldout),
            "evaluations": pd.DataFrame(evaluations), "divergence": pd.DataFrame(divergence)}  # fmt: skip


def claims_rows(verdict: str) -> pd.DataFrame:
    """A claims table (the columns figures read) on what fig13 draws, every verdict the given one."""
    rows = [
        dict(claim="k1_reward_falls_with_beta", study="onpolicy", model="tiny", metric="final_kl",
             candidate="k1-reward", baseline="k1-reward", beta=1.0, baseline_beta=0.1, predicted="lower",
             effect=-0.3, se=0.1, z=3.0, critical=31.82, verdict=verdict, units=2, note="", baseline_mean=0.6),
        dict(claim="k1_reward_regularises", study="onpolicy", model="tiny", metric="final_kl", candidate="k1-reward",
             baseline="none", beta=0.1, baseline_beta="", predicted="lower", effect=-0.4, se=0.1, z=4.0,
             critical=31.82, verdict=verdict, units=2, note="", baseline_mean=1.0),
        dict(claim="k1_loss_does_not_regularise", study="onpolicy", model="tiny", metric="final_kl",
             candidate="k1-loss", baseline="none", beta=0.1, baseline_beta="", predicted="same", effect=0.0, se=0.1,
             z=5.0, critical=3.0, verdict=verdict, units=2, note="", baseline_mean=1.0),
    ]  # fmt: skip
    return pd.DataFrame(rows)


def texts(fig) -> str:
    """Every text a reader sees in the figure: titles, labels, legends, notes, footnote."""
    return " ".join(" ".join(t.get_text().split()) for t in fig.findobj(plt.Text))  # wrapped lines joined


def data_axes(fig):
    return [ax for ax in fig.axes if ax.lines or ax.patches or ax.collections]


PAPER_CONFIGS = ["none", "k1-reward", "k1-loss", "k3-reward", "k3-loss", "k1-both", "k3-both", "k2-reward", "k2-loss",
                 "k2-both"]  # fmt: skip


def test_one_palette_colour_is_the_configuration_and_line_style_the_beta_by_its_value():
    low, high = encoding.style_of("k1-reward", 0.1), encoding.style_of("k1-reward", 1.0)
    assert low["color"] == high["color"] and low["linestyle"] != high["linestyle"]
    colours = {str(encoding.config_colour(k)) for k in [*PAPER_CONFIGS, "k3-loss-ratio", "base"]}
    assert len(colours) == len(PAPER_CONFIGS) + 2  # a framework's variant is told apart from its pathwise configuration
    # β by its value: the same β has the same style in a run of two β and in one of four
    assert encoding.beta_linestyle(0.1) == "--" and encoding.beta_hatch(0.1) == "//"
    assert encoding.beta_linestyle(0.0) == encoding.beta_linestyle(None) == "-"
    # every β has a style of its own, none of them no KL's solid line or unhatched bar
    styles = [encoding.beta_linestyle(b) for b in encoding.BETA_STYLES]
    hatches = [encoding.beta_hatch(b) for b in encoding.BETA_STYLES]
    assert "-" not in styles and "" not in hatches
    assert len({str(x) for x in styles}) == len(styles) and len(set(hatches)) == len(hatches)
    # verdict colours are no configuration's colour
    verdicts = {mcolors.to_hex(c) for c in [*encoding.VERDICT_COLOURS.values(), encoding.UNTESTED_COLOUR]}
    assert not verdicts & {mcolors.to_hex(encoding.config_colour(k)) for k in [*PAPER_CONFIGS, "base"]}


def test_placement_and_estimator_read_without_colour():
    """Marker shape = placement, marker fill = estimator: every configuration has its own (shape, fill)."""
    keys = {(encoding.marker_of(k)["marker"], encoding.marker_of(k)["fillstyle"], encoding.marker_of(k).get(
        "markerfacecolor")) for k in PAPER_CONFIGS}  # fmt: skip
    assert len(keys) == len(PAPER_CONFIGS)


def test_the_palette_is_colour_blind_safe_for_the_papers_contrasts():
    """K1 in the reward against K3 in the loss, and K3 in the reward against K3 in the loss, differ in lightness (what
    a red-green colour-blind reader still sees), not only in hue."""

    def lightness(kl):
        r, g, b = mcolors.to_rgb(encoding.config_colour(kl))
        return 0.2126 * r + 0.7152 * g + 0.0722 * b

    def blue_yellow(kl):  # the opponent axis that red-green colour blindness keeps
        r, g, b = mcolors.to_rgb(encoding.config_colour(kl))
        return b - (r + g) / 2

    for a, b in [("k3-reward", "k3-loss"), ("k1-reward", "k1-loss")]:
        assert abs(lightness(a) - lightness(b)) > 0.15, (a, b)
    assert blue_yellow("k1-reward") > 0 > blue_yellow("k3-loss")  # blue against brown


def test_the_uncertainty_convention_by_hand():
    mean, se, n = aggregate.mean_and_se([0.3, 0.5], [0.05, 0.05])
    assert (mean, n) == (pytest.approx(0.4), 2) and se == pytest.approx(0.1)  # the seeds' spread: 0.1414 / √2
    _, se, _ = aggregate.mean_and_se([0.4, 0.4], [0.05, 0.05])
    assert se == pytest.approx(0.05 * 2**0.5 / 2)  # seeds that agree by chance: the measurements' own error
    assert aggregate.mean_and_se([0.4, np.nan], [0.03, 0.01])[1:] == (pytest.approx(0.03), 1)  # one seed: its own
    assert np.isnan(aggregate.mean_and_se([0.4])[1]) and aggregate.mean_and_se([])[2] == 0


def test_every_caption_states_the_same_convention():
    """The figures' footnote (aggregate.UNCERTAINTY) and the report's captions give one formula."""
    formula = "se = max(s/√n, √(Σ eᵢ²)/n)"
    assert formula in aggregate.UNCERTAINTY
    for name in ("figure", "training", "evaluations", "regularisation", "evaluation_differences"):
        assert formula in (ROOT / "workflow" / "report" / f"{name}.rst").read_text(), name


def test_the_last_point_of_a_trailing_curve_is_the_final_value(config, tables):
    run = tables["training"][(tables["training"].kl == "k3-loss") & (tables["training"].seed == 1)]
    run = run[run.beta == 1.0]
    curve = aggregate.trailing_mean(run, "kl_k3", config["studies"]["onpolicy"]["final_steps"])
    final = aggregate.final_values(run, config)
    assert curve.value.iloc[-1] == pytest.approx(final.kl_k3.iloc[0])
    assert curve.se.iloc[-1] == pytest.approx(final.kl_k3_stderr.iloc[0])


@pytest.mark.parametrize("verdict", ["not shown", "shown", "not testable: one seed"])
def test_a_figure_states_the_claims_verdict_never_its_own(config, tables, verdict):
    """Fig. 13's means fall with β for K1 in the reward; what it says is the claims table's verdict."""
    fig, caption = paper.draw_paper_figure("fig13_regularisation", config, tables, claims_rows(verdict))
    seen = texts(fig)
    assert "falls with β" not in seen and "does not fall" not in seen
    assert f"k1_reward_falls_with_beta, β = 1: {verdict} (" in caption  # the verdicts, with z: in the caption
    assert f"k1_reward_regularises, β = 0.1: {verdict} (" in caption
    if verdict != "shown":
        assert ": shown (" not in caption
    plt.close(fig)
    plain, text = paper.draw_paper_figure("fig13_regularisation", config, tables)  # no table: no verdict at all
    assert "shown" not in texts(plain) and "k1_reward_regularises" not in text
    plt.close(plain)


def test_every_panel_with_data_has_bands_or_error_bars_and_names_n(config, tables):
    claims = claims_rows("not shown")
    figs = [paper.draw_paper_figure(name, config, tables, claims) for name in config["figures"]]
    figs += [training_figures.draw_training_figure(study, config, tables) for study in config["studies"]]
    drawn = 0
    for fig, text in figs:
        for ax in data_axes(fig):
            drawn += 1
            assert ax.collections, ax.get_title()  # fill_between bands, error bar lines
            assert "n = " in ax.get_title(), ax.get_title()
        assert aggregate.UNCERTAINTY[1:] in text and "not a test" in texts(fig)
        plt.close(fig)
    assert drawn >= 10


def test_no_panel_is_empty_without_saying_why_and_legends_stay_outside(config, tables):
    for name in config["figures"]:
        fig, caption = paper.draw_paper_figure(name, config, tables)
        for ax in fig.axes:
            assert ax.get_legend() is None  # one legend for the figure, beside the panels
            if not (ax.lines or ax.patches or ax.collections):
                assert any(t.get_text().startswith("no ") for t in ax.texts), (name, ax.get_title())
        if data_axes(fig):
            assert fig.legends, name
        plt.close(fig)


def test_lines_at_equal_values_do_not_hide_each_other(config, tables):
    """Every held-out line starts at 0.3 at step 0: dodged sideways, no two markers at the same point."""
    fig, ax = plt.subplots()
    panel = {"kind": "curves", "study": "onpolicy", "model": "tiny"}
    panels.curves_panel(ax, panel, config, tables)
    starts = {(round(line.get_xdata()[0], 6), line.get_ydata()[0]) for line in ax.lines if len(line.get_xdata()) > 1}
    assert len(starts) == len([line for line in ax.lines if len(line.get_xdata()) > 1]) == 9
    plt.close(fig)


def test_panels_of_one_quantity_share_a_y_axis(config, tables):
    fig, caption = paper.draw_paper_figure("fig05_eval_k1_reward_vs_k3_loss", config, tables)
    limits = {ax.get_ylim() for ax in data_axes(fig)}
    assert len(limits) == 1 and next(iter(limits))[0] == 0
    plt.close(fig)


def test_captions_name_the_model_and_scale_and_titles_are_one_line_without_them(config, tables):
    other = {**config, "scale": "paper", "models": {"tiny": {"hub_id": "HuggingFaceTB/SmolLM2-135M-Instruct"}}}
    fig, caption = paper.draw_paper_figure("fig02_k1_in_loss", other, tables)
    assert "Models: HuggingFaceTB/SmolLM2-135M-Instruct; paper scale." in caption
    assert fig._suptitle.get_text() == "K1 in the loss"
    plt.close(fig)
    fig, caption = training_figures.draw_training_figure("onpolicy", config, tables)
    assert fig._suptitle.get_text() == "Training dynamics: on-policy grid"  # no study id, no figure numbers
    assert "tiny (built locally)" in caption and "tiny" not in fig._suptitle.get_text()
    plt.close(fig)


def test_a_run_that_stopped_early_is_counted_and_marked(config, tables):
    fig, ax = plt.subplots()
    panel = {"kind": "curves", "study": "onpolicy", "model": "tiny", "kl": ["k3-reward"]}
    panels.curves_panel(ax, panel, config, tables)
    assert "K3 in reward, β = 1 (1/2 collapsed)" in [line.get_label() for line in ax.lines]
    assert any(c.get_offsets().shape[0] == 1 for c in ax.collections)  # the cross at its last point
    plt.close(fig)


def test_a_panel_without_results_says_so(config, tables):
    fig, caption = paper.draw_paper_figure("fig07_async", config, tables)  # async studies have no results here
    assert all(not ax.lines for ax in fig.axes)
    assert "no run of this panel has held-out results yet" in texts(fig)
    plt.close(fig)


def test_the_forest_draws_every_claim_coloured_by_its_verdict(config):
    claims = pd.concat([claims_rows("shown").head(1), claims_rows("not shown").iloc[1:2],
                        claims_rows("not testable: one seed").iloc[2:]], ignore_index=True)  # fmt: skip
    claims.loc[2, ["se", "z", "critical"]] = np.nan  # a claim that cannot be tested has no interval
    fig, caption = forest.draw_claims_forest(claims, config)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["k1_reward_falls_with_beta, β = 1 vs 0.1  ◀", "k1_reward_regularises, β = 0.1  ◀",
                      "k1_loss_does_not_regularise, β = 0.1"]  # fmt: skip (◀: predicted lower; same: none)
    interval = [line for line in ax.lines if len(line.get_xdata()) == 2 and line.get_ydata()[0] == 0][0]
    assert interval.get_color() == encoding.VERDICT_COLOURS["shown"]
    # in the metric's own sign: effect -0.3 drawn at -0.3; its interval ± 31.82 · 0.1 clipped below at -0.6 (a KL of
    # at least 0 against a baseline of 0.6, marked |) and cut above at the panel (an arrow)
    assert [line.get_xdata()[0] for line in ax.lines if line.get_marker() == "o"][0] == pytest.approx(-0.3)
    low, high = interval.get_xdata()
    assert low == pytest.approx(-0.6) and high == pytest.approx(ax.get_xlim()[1])
    assert [line.get_xdata() for line in ax.lines if line.get_marker() == "|"] == [-0.6]
    hollow = [line for line in ax.lines if line.get_markerfacecolor() == "white"]
    assert len(hollow) == 1 and hollow[0].get_ydata()[0] == 2
    assert "not testable: one seed" in texts(fig) and "not shown z 4 / 31.8 n 2" in texts(fig)
    plt.close(fig)


def test_lines_that_lie_on_one_another_are_named(config, tables):
    """Runs that log the same values (every reward 0, say) draw one line over another: the figure names them."""
    flat = tables["training"].assign(task_reward=0.0)
    fig, caption = training_figures.draw_training_figure("onpolicy", config, {**tables, "training": flat})
    seen = texts(fig)
    assert "task reward, β = 0.1: no KL (β = 0), K1 in reward, β = 0.1" in caption
    assert "lie on one line (0 at every step)" in caption
    assert "gradient norm before clipping, β" not in caption  # distinct lines are not named
    assert "lie on one line" not in seen
    plt.close(fig)


def test_a_config_without_claims_gets_a_forest_that_says_so(config):
    fig, caption = forest.draw_claims_forest(claims_rows("shown").iloc[:0], config)
    assert "the config names no claims" in texts(fig)
    plt.close(fig)


def test_a_panel_title_counts_its_claims_verdicts(config, tables):
    """A difference the eye sees is read beside the rule's count: 'claims: 0 of 3 shown'."""
    fig, caption = paper.draw_paper_figure("fig13_regularisation", config, tables, claims_rows("not shown"))
    (ax,) = data_axes(fig)
    assert ax.get_title().endswith("claims: 0 of 3 shown")
    plt.close(fig)
    claims = claims_rows("not shown")
    claims.loc[1, "verdict"] = "shown"
    claims.loc[2, "verdict"] = "contradicted"
    fig, caption = paper.draw_paper_figure("fig13_regularisation", config, tables, claims)
    assert data_axes(fig)[0].get_title().endswith("claims: 1 of 3 shown, 1 contradicted")
    plt.close(fig)
    plain, _ = paper.draw_paper_figure("fig13_regularisation", config, tables)
    assert "claims:" not in data_axes(plain)[0].get_title()  # no claims table, no count
    plt.close(plain)


def rings(ax) -> list:
    """The verdict rings drawn around points (legend proxies have no data)."""
    return [line for line in ax.lines if line.get_markerfacecolor() == "none" and line.get_markersize() == 11
            and len(line.get_xdata())]  # fmt: skip


@pytest.mark.parametrize("shown", [False, True])
def test_fig13_rings_only_the_points_the_claims_table_shows(config, tables, shown):
    """K3 in the loss ends far below no KL in means (0.2 against 1.0): no ring all the same, since no claim shows it;
    K1 in the reward at β = 0.1 ringed in the verdict's colour only where its claim is shown; a contradicted claim's
    point ringed in the contradicted colour."""
    claims = claims_rows("not shown")
    if shown:
        claims.loc[1, "verdict"] = "shown"
    fig, caption = paper.draw_paper_figure("fig13_regularisation", config, tables, claims)
    (ax,) = data_axes(fig)
    ringed = rings(ax)
    if shown:
        assert len(ringed) == 1 and ringed[0].get_color() == encoding.VERDICT_COLOURS["shown"]
        assert ringed[0].get_xdata()[0] == pytest.approx(0.1, rel=0.1)
    else:
        assert ringed == []
    assert "no ring: not shown" in caption
    plt.close(fig)
    claims.loc[2, "verdict"] = "contradicted"  # K1 in the loss at β = 0.1 against no KL
    fig, caption = paper.draw_paper_figure("fig13_regularisation", config, tables, claims)
    assert encoding.VERDICT_COLOURS["contradicted"] in [line.get_color() for line in rings(data_axes(fig)[0])]
    plt.close(fig)


def test_bars_carry_their_unread_fraction_chance_and_leave_the_untemplated_base_model_to_the_caption(config, tables):
    """Every bar is labelled with its unread fraction (10 % here); a chance line spans each multiple-choice task; the
    base model without its chat template (0 everywhere) is not drawn but listed in the caption."""
    fig, caption = paper.draw_paper_figure("fig05_eval_k1_reward_vs_k3_loss", config, tables)
    for ax in data_axes(fig):
        bars = [p for p in ax.patches if p.get_height() > 0]
        assert [t.get_text() for t in ax.texts] == ["10%"] * len(bars) == ["10%"] * 3 * len(TASKS)  # base, 2 configs
        chance = [c for c in ax.collections if "chance" in str(c.get_label())]
        assert len(chance) == sum(t.startswith("mmlu") for t in TASKS)
    assert "the base model without its chat template (one evaluation, not drawn): math500 0.00, 10% unread" in caption
    plt.close(fig)


def test_a_crowded_panel_draws_no_raw_steps(config, tables):
    """Five lines with a band each and their raw steps hide one another: past RAW_LINES_UP_TO lines, bands alone."""
    window = 5
    training = tables["training"]
    for kls, raw in ((["none", "k1-reward", "k1-loss", "k3-reward", "k3-loss"], False), (["none", "k1-reward"], True)):
        fig, ax = plt.subplots()
        rows = training[training.kl.isin(kls) & training.beta.isin([0.0, 1.0])]
        panels.step_curves(ax, rows, "task_reward", window)
        thin = [line for line in ax.lines if line.get_label().startswith("_")]
        assert len(thin) == (len(kls) if raw else 0)
        assert len(ax.collections) == len(kls)  # a band for every line either way
        plt.close(fig)


def test_the_forest_says_why_an_interval_spans_the_axis_and_names_a_margin_z(config):
    claims = claims_rows("not shown")
    fig, caption = forest.draw_claims_forest(claims, config)
    seen = texts(fig)
    assert "An arrow: the interval runs past the panel" in caption and "(2 seeds: ± 31.8 se)" in caption
    assert "not shown margin z 5 / 3 n 2" in seen  # the same claim's z is its distance inside the margin
    assert "not shown z 3 / 31.8 n 2" in seen
    plt.close(fig)
    narrow = claims.assign(se=0.001, critical=3.0)  # every interval inside its panel: no arrow, no note
    fig, caption = forest.draw_claims_forest(narrow, config)
    assert "An arrow:" not in caption
    plt.close(fig)


def test_a_panel_of_one_beta_counts_that_betas_claims(config, tables):
    """fig05 draws β = 0.1 and β = 1 apart: each panel's title counts the claims at its own β only."""
    claims = claims_rows("not shown").iloc[:2].assign(metric="evaluation", candidate="k1-reward", baseline="k3-loss",
                                                       predicted="higher", beta=[0.1, 1.0])  # fmt: skip
    claims.loc[1, "verdict"] = "shown"
    fig, caption = paper.draw_paper_figure("fig05_eval_k1_reward_vs_k3_loss", config, tables, claims)
    titles = [ax.get_title() for ax in data_axes(fig)]
    assert "claims: 0 of 1 shown" in titles[0] and "claims: 1 of 1 shown" in titles[1]
    plt.close(fig)


def test_gradient_norms_are_drawn_on_a_log_axis_and_question_pairs_name_their_seeds(config, tables):
    """A gradient norm of 0.2 beside one of 6 is a flat line at 0 on a linear axis shared across β."""
    fig, caption = training_figures.draw_training_figure("onpolicy", config, tables)
    scales = {ax.get_ylabel(): ax.get_yscale() for ax in fig.axes if ax.get_ylabel()}
    assert scales["gradient norm before clipping\n(trailing 5-step mean, log)"] == "log"
    assert scales["task reward, batch mean\n(trailing 5-step mean)"] == "linear"
    assert "KL(π_sampling‖π_ref), K3, nats\n(trailing 5-step mean)" in scales  # the sampling policy's, smoothed
    plt.close(fig)
    questions = claims_rows("not shown").head(1).assign(pair_by="questions", units=100, seeds=4)
    fig, caption = forest.draw_claims_forest(questions, config)
    assert "n 100 questions × 4 seeds" in texts(fig)
    plt.close(fig)


def test_a_training_figure_keys_colour_and_line_style_apart(config, tables):
    """One legend entry per configuration and one per β (9 lines, 7 entries), not one per configuration × β."""
    fig, caption = training_figures.draw_training_figure("onpolicy", config, tables)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["no KL (β = 0)", "K1 in reward", "K1 in loss", "K3 in reward", "K3 in loss", "β = 0.1", "β = 1"]
    plt.close(fig)


def toy_results() -> tuple[pd.DataFrame, pd.DataFrame]:
    """fig01's inputs, small: two settings, T = 1, 2, 4 and one T without an exact value; K1 in the reward unbiased
    (exact bias 0), K3 in the reward biased, K3 in the loss biased with K1 in the loss's bias (drawn once)."""
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
                                     std_error=0.003, variance=0.1 * length, trials=200, sequences=1000))  # fmt: skip
    tests = pd.DataFrame({"config": ["k1-reward", "k3-reward", "k3-loss", "k1-loss"],
                          "exact_unbiased": [True, False, False, False], "z_critical": 4.0})  # fmt: skip
    return pd.DataFrame(rows), tests


def test_fig01_draws_the_exact_bias_over_the_noise_floor_and_names_coinciding_and_unbiased_configurations(tmp_path):
    results, tests = toy_results()
    png = tmp_path / "fig01_toy_bias_variance.png"
    toy_figures.fig01_toy_bias_variance(results, tests, png)
    assert png.is_file() and "Monte Carlo noise floor" in png.with_suffix(".md").read_text()
    fig, caption = toy_figures.draw_fig01(results, tests)
    labels = [" ".join(t.get_text().split()) for t in fig.legends[0].get_texts()]  # wrapped labels joined
    assert "K3 in loss = K1 in loss" in labels  # equal exact biases: one line, named together
    assert labels[-1].startswith("squared bias exactly 0 (not drawn): K1 in reward")
    bias = fig.axes[0]
    k3 = [line for line in bias.lines if line.get_label() == "K3 in reward"][0]
    assert list(k3.get_xdata()) == [1, 2, 4]  # exact values only: none at T = 32
    assert list(k3.get_ydata()) == pytest.approx([1e-4, 4e-4, 16e-4])  # the exact bias squared, not the sampled one
    floor = [line for line in bias.lines if line.get_label().startswith("Monte Carlo noise floor")][0]
    assert list(floor.get_ydata()) == pytest.approx([9e-6] * 3)
    assert problems(fig) == []
    plt.close(fig)


def test_rendered_figures_overlap_no_text_hide_no_data_under_a_legend_and_use_no_small_font(config, tables):
    """Every paper, training and claims figure as saved: no two text boxes overlap, no legend box holds a data point,
    no font below 7 pt (renderer extents)."""
    claims = claims_rows("not shown")
    drawn = [(name, *paper.draw_paper_figure(name, config, tables, claims)) for name in config["figures"]]
    drawn += [(study, *training_figures.draw_training_figure(study, config, tables))
              for study in ("onpolicy", "async_math")]  # fmt: skip
    drawn.append(("claims_forest", *forest.draw_claims_forest(claims, config)))
    found = []
    for name, fig, _ in drawn:
        found += [f"{name}: {problem}" for problem in problems(fig)]
        plt.close(fig)
    assert found == []


def test_the_checks_catch_an_overlap_a_legend_over_data_and_a_small_font():
    """rendered.problems fails each of its three faults (so that the test above can fail)."""
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([0, 0.5, 1], [0, 0.5, 1], label="line")  # its middle point under the legend
    ax.legend(loc="center")
    ax.text(0.1, 0.9, "one text", transform=ax.transAxes)
    ax.text(0.12, 0.9, "another text", transform=ax.transAxes, fontsize=6)
    found = " | ".join(problems(fig))
    assert "texts overlap: 'one text' and 'another text'" in found
    assert "legend over data: line" in found and "font too small: 'another text': 6.0 pt" in found
    plt.close(fig)


def test_a_footnote_of_more_than_two_lines_is_refused():
    fig = plt.figure()
    with pytest.raises(ValueError, match="caption"):
        encoding.footnote(fig, "one\ntwo\nthree")
    plt.close(fig)


def toy_end_points():
    """fixed_points' tables, small: K1 in the reward and K3 in both on the optimum at every β (one end point), K3 in
    the loss below it, K2 in the reward drifting to a reward of 0 at β = 3; a frontier of three rungs; Monte Carlo end
    points of K3 in the loss at two β."""
    section = {"length": 4, "reward": {"threshold": 3}, "betas": [0.3, 1.0, 3.0],
               "monte_carlo": {"seeds": 20, "betas": [1.0, 3.0]}}  # fmt: skip
    on = {0.3: (0.9, 1.2), 1.0: (0.7, 0.6), 3.0: (0.35, 0.1)}
    rows = [dict(family="tabular", config=c, beta=b, status="stable", reward=r, kl=k, objective_gap=0.0)
            for c in ("k1-reward", "k3-both") for b, (r, k) in on.items()]  # fmt: skip
    rows += [dict(family="tabular", config="k3-loss", beta=b, status="stable", reward=r - 0.1, kl=k, objective_gap=0.01)
             for b, (r, k) in on.items()]  # fmt: skip
    rows += [dict(family="tabular", config="k2-reward", beta=b, status="drifts", reward=0.0 if b == 3.0 else 1.0,
                  kl=1.0 + b, objective_gap=np.nan) for b in on]  # fmt: skip
    fronts = pd.DataFrame({"family": "tabular", "kl": [0.0, 0.3, 2.5], "reward": [0.2, 0.5, 1.0]})
    agreed = pd.DataFrame({"family": "tabular", "mode": "on-policy", "config": "k3-loss", "beta": [1.0, 3.0],
                           "seeds": 20, "mc_reward": [0.6, 0.25], "mc_reward_se": 0.01, "mc_kl": [0.6, 0.1],
                           "mc_kl_se": 0.01})  # fmt: skip
    return pd.DataFrame(rows), fronts, agreed, section


def test_the_toy_figure_names_coinciding_configurations_once_labels_monte_carlo_betas_and_hides_nothing():
    points, fronts, agreed, section = toy_end_points()
    fig, caption = toy_figures.draw_toy_fixed_points(points, fronts, agreed, section)
    plane = fig.axes[0]
    labels = [line.get_label() for line in plane.lines]
    assert "K1 in reward = K3 in reward and loss" in labels and "K1 in reward" not in labels  # drawn once
    assert any("β 1" in t.get_text() for t in plane.texts) and any("3" in t.get_text() for t in plane.texts)
    collapse = [line for line in plane.lines if line.get_marker() == ">"][0]
    assert 0.0 in list(collapse.get_ydata())  # K2 in the reward's collapse is drawn, at reward 0
    front = [line for line in plane.lines if line.get_label().startswith("optimum of J_β")][0]
    above = np.interp(points.kl, front.get_xdata(), front.get_ydata()) - points.reward
    assert (above[points.objective_gap == 0] >= -1e-12).all()  # no end point on the optimum above the frontier drawn
    assert "on the optimum (gap < 1e-12) at every β: K1 in reward = K3 in reward and loss" in caption
    assert problems(fig) == []
    plt.close(fig)


def test_an_asynchronous_run_shorter_than_its_lag_says_its_kl_is_zero_by_construction(config, tables):
    """async_countdown: level 4, 5 steps; every batch was sampled by the initial policy, so its KL is 0 by
    construction: the panel and the caption say so, instead of a row of zeros that reads as a finding."""
    runs = tables["training"][tables["training"].step <= 5].assign(study="async_countdown", kl_k3=0.0, task_reward=0.0)
    runs = runs[runs.kl.isin(["none", "k1-reward"]) & runs.beta.isin([0.0, 0.1])].assign(
        beta=lambda t: np.where(t.kl == "none", 0.0, 0.05))  # fmt: skip
    fig, caption = training_figures.draw_training_figure("async_countdown", config, {**tables, "training": runs})
    assert "0 by construction" in texts(fig)
    assert "its KL row is 0 at every step, and its reward is the reference's, by construction" in caption
    assert problems(fig) == []
    plt.close(fig)
    fig, caption = training_figures.draw_training_figure("onpolicy", config, tables)
    assert "by construction" not in texts(fig) + caption
    plt.close(fig)


def test_one_beta_is_one_category_and_one_seed_has_no_band(config, tables):
    """A panel of one β draws it as one category (a log axis with sideways dodge reads as three β); a series of one
    seed has no band (its own error over steps is not a spread over seeds)."""
    fig, ax = plt.subplots()
    panel = {"kind": "kl_vs_beta", "study": "onpolicy", "model": "tiny", "betas": [0.1]}
    panels.kl_vs_beta_panel(ax, panel, config, tables)
    assert ax.get_xscale() == "linear" and [t.get_text() for t in ax.get_xticklabels()] == ["0.1"]
    plt.close(fig)
    one_seed = tables["training"][tables["training"].seed == 0]
    fig, ax = plt.subplots()
    panels.step_curves(ax, one_seed[one_seed.kl.isin(["none", "k1-reward"]) & one_seed.beta.isin([0.0, 0.1])],
                        "kl_k3", 5)  # fmt: skip
    bands = [c for c in ax.collections if len(c.get_paths()) and len(c.get_paths()[0].vertices)]
    assert bands == []
    plt.close(fig)


def test_every_estimator_has_a_marker_fill_of_its_own():
    """Without colour the fill says the estimator: one missing would be drawn as K1 (the default fill)."""
    from klstudy import kl

    fills = [encoding.ESTIMATOR_FILLS.get(estimator) for estimator in kl.ESTIMATORS]
    assert None not in fills and len(set(fills)) == len(fills), dict(zip(kl.ESTIMATORS, fills, strict=True))
