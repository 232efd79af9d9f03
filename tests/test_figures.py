"""The figures' rules, each a test that can fail: one encoding, one uncertainty convention with n on every panel,
verdicts from the claims table (never from means), legends outside the data, no empty panel without a reason, titles
from the config. A synthetic on-policy study drawn in memory; seconds in all."""

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import yaml

from klstudy import aggregate, figures
from klstudy.config import validate_config

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


def test_one_encoding_colour_is_the_configuration_and_line_style_the_beta(config):
    grid = figures.beta_grid(config)
    assert grid == [0.05, 0.1, 1.0]
    low, high = figures.style_of("k1-reward", 0.1, grid), figures.style_of("k1-reward", 1.0, grid)
    assert low["color"] == high["color"] and low["linestyle"] != high["linestyle"]
    colours = {str(figures.config_colour(k)) for k in ["none", "k1-reward", "k1-loss", "k3-reward", "k3-loss",
                                                       "k1-both", "k3-both", "k3-loss-ratio", "base"]}  # fmt: skip
    assert len(colours) == 9  # a framework's variant is told apart from its pathwise configuration
    assert figures.beta_linestyle(1.0, grid) == figures.BETA_LINESTYLES[2]
    assert figures.beta_linestyle(0.0, grid) == figures.beta_linestyle(0.3) == "-"  # β = 0, or no grid: solid
    assert figures.beta_hatch(0.1, grid) == figures.BETA_HATCHES[1]


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
    fig = figures.draw_paper_figure("fig13_regularisation", config, tables, claims_rows(verdict))
    seen = texts(fig)
    assert "falls with β" not in seen and "does not fall" not in seen
    assert f"k1_reward_falls_with_beta, β = 1: {verdict} (" in seen
    assert f"k1_reward_regularises, β = 0.1: {verdict} (" in seen
    if verdict != "shown":
        assert ": shown (" not in seen
    plt.close(fig)
    plain = figures.draw_paper_figure("fig13_regularisation", config, tables)  # without the table: no verdict at all
    assert "shown" not in texts(plain)
    plt.close(plain)


def test_every_panel_with_data_has_bands_or_error_bars_and_names_n(config, tables):
    claims = claims_rows("not shown")
    figs = [figures.draw_paper_figure(name, config, tables, claims) for name in config["figures"]]
    figs += [figures.draw_training_figure(study, config, tables) for study in config["studies"]]
    drawn = 0
    for fig in figs:
        for ax in data_axes(fig):
            drawn += 1
            assert ax.collections, ax.get_title()  # fill_between bands, error bar lines
            assert "n = " in ax.get_title(), ax.get_title()
        assert figures.UNCERTAINTY in texts(fig)
        plt.close(fig)
    assert drawn >= 10


def test_no_panel_is_empty_without_saying_why_and_legends_stay_outside(config, tables):
    for name in config["figures"]:
        fig = figures.draw_paper_figure(name, config, tables)
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
    figures.curves_panel(ax, panel, config, tables)
    starts = {(round(line.get_xdata()[0], 6), line.get_ydata()[0]) for line in ax.lines if len(line.get_xdata()) > 1}
    assert len(starts) == len([line for line in ax.lines if len(line.get_xdata()) > 1]) == 9
    plt.close(fig)


def test_panels_of_one_quantity_share_a_y_axis(config, tables):
    fig = figures.draw_paper_figure("fig05_eval_k1_reward_vs_k3_loss", config, tables)
    limits = {ax.get_ylim() for ax in data_axes(fig)}
    assert len(limits) == 1 and next(iter(limits))[0] == 0
    plt.close(fig)


def test_titles_name_the_model_and_scale_from_the_config(config, tables):
    other = {**config, "scale": "paper", "models": {"tiny": {"hub_id": "HuggingFaceTB/SmolLM2-135M-Instruct"}}}
    fig = figures.draw_paper_figure("fig02_k1_in_loss", other, tables)
    assert "HuggingFaceTB/SmolLM2-135M-Instruct, paper scale" in fig._suptitle.get_text()
    assert "embedded" not in fig._suptitle.get_text()
    plt.close(fig)


def test_a_run_that_stopped_early_is_counted_and_marked(config, tables):
    fig, ax = plt.subplots()
    panel = {"kind": "curves", "study": "onpolicy", "model": "tiny", "kl": ["k3-reward"]}
    figures.curves_panel(ax, panel, config, tables)
    assert "K3 in reward, β = 1 (1/2 collapsed)" in [line.get_label() for line in ax.lines]
    assert any(c.get_offsets().shape[0] == 1 for c in ax.collections)  # the cross at its last point
    plt.close(fig)


def test_a_panel_without_results_says_so(config, tables):
    fig = figures.draw_paper_figure("fig07_async", config, tables)  # async studies have no results here
    assert all(not ax.lines for ax in fig.axes)
    assert "no run of this panel has held-out results yet" in texts(fig)
    plt.close(fig)


def test_the_forest_draws_every_claim_coloured_by_its_verdict(config):
    claims = pd.concat([claims_rows("shown").head(1), claims_rows("not shown").iloc[1:2],
                        claims_rows("not testable: one seed").iloc[2:]], ignore_index=True)  # fmt: skip
    claims.loc[2, ["se", "z", "critical"]] = np.nan  # a claim that cannot be tested has no interval
    fig = figures.draw_claims_forest(claims, config)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["k1_reward_falls_with_beta, β = 1 vs 0.1", "k1_reward_regularises, β = 0.1",
                      "k1_loss_does_not_regularise, β = 0.1"]  # fmt: skip
    interval = [line for line in ax.lines if len(line.get_xdata()) == 2 and line.get_ydata()[0] == 0][0]
    assert interval.get_color() == figures.VERDICT_COLOURS["shown"]
    # signed towards the prediction (lower): effect -0.3 drawn at +0.3, its interval ± 31.82 · 0.1 cut at the panel
    low, high = interval.get_xdata()
    assert low == pytest.approx(-ax.get_xlim()[1]) and high == pytest.approx(ax.get_xlim()[1])
    hollow = [line for line in ax.lines if line.get_markerfacecolor() == "white"]
    assert len(hollow) == 1 and hollow[0].get_ydata()[0] == 2
    assert "not testable: one seed" in texts(fig) and "not shown z 4 / 31.8 n 2" in texts(fig)
    plt.close(fig)


def test_lines_that_lie_on_one_another_are_named(config, tables):
    """Runs that log the same values (every reward 0, say) draw one line over another: the figure names them."""
    flat = tables["training"].assign(task_reward=0.0)
    fig = figures.draw_training_figure("onpolicy", config, {**tables, "training": flat})
    seen = texts(fig)
    assert "task reward (batch mean, no KL term), β = 0.1: no KL (β = 0), K1 in reward, β = 0.1" in seen
    assert "lie on one line (0 at every step)" in seen
    assert "gradient norm (before clipping), β" not in seen  # distinct lines are not named
    plt.close(fig)


def test_a_config_without_claims_gets_a_forest_that_says_so(config):
    fig = figures.draw_claims_forest(claims_rows("shown").iloc[:0], config)
    assert "the config names no claims" in texts(fig)
    plt.close(fig)


def test_a_panel_title_counts_its_claims_verdicts(config, tables):
    """A difference the eye sees is read beside the rule's count: 'claims: 0 of 3 shown', the closest by z/critical."""
    fig = figures.draw_paper_figure("fig13_regularisation", config, tables, claims_rows("not shown"))
    (ax,) = data_axes(fig)
    assert "claims: 0 of 3 shown (closest not shown: z 5 of 3)" in ax.get_title()
    plt.close(fig)
    claims = claims_rows("not shown")
    claims.loc[1, "verdict"] = "shown"
    claims.loc[2, "verdict"] = "contradicted"
    fig = figures.draw_paper_figure("fig13_regularisation", config, tables, claims)
    assert "claims: 1 of 3 shown, 1 contradicted (closest not shown: z 3 of 31.8)" in data_axes(fig)[0].get_title()
    plt.close(fig)
    plain = figures.draw_paper_figure("fig13_regularisation", config, tables)
    assert "claims:" not in data_axes(plain)[0].get_title()  # no claims table, no count
    plt.close(plain)


def filled_markers(ax) -> list:
    """The point markers drawn filled (an error bar's caps are markers too: "_")."""
    return [
        line
        for line in ax.lines
        if line.get_marker() not in (None, "None", "", "_", "|")
        and line.get_markerfacecolor() != "white"
        and len(line.get_xdata())
    ]  # fmt: skip (no legend proxies)


@pytest.mark.parametrize("shown", [False, True])
def test_fig13_fills_only_the_points_the_claims_table_shows(config, tables, shown):
    """K3 in the loss ends far below no KL in means (0.2 against 1.0): hollow all the same, since no claim shows it;
    K1 in the reward at β = 0.1 filled only where its claim is shown; a contradicted claim named beside its point."""
    claims = claims_rows("not shown")
    if shown:
        claims.loc[1, "verdict"] = "shown"
    fig = figures.draw_paper_figure("fig13_regularisation", config, tables, claims)
    (ax,) = data_axes(fig)
    filled = filled_markers(ax)
    if shown:
        assert len(filled) == 1 and filled[0].get_color() == figures.config_colour("k1-reward")
        assert filled[0].get_xdata()[0] == pytest.approx(0.1, rel=0.1)
        assert not ax.texts  # the fill says it
    else:
        assert filled == [] and not ax.texts
    assert "hollow: it does not" in texts(fig)
    plt.close(fig)
    claims.loc[2, "verdict"] = "contradicted"  # K1 in the loss at β = 0.1 against no KL
    fig = figures.draw_paper_figure("fig13_regularisation", config, tables, claims)
    assert [t.get_text() for t in data_axes(fig)[0].texts] == ["contradicted"]
    plt.close(fig)


def test_a_bar_too_short_to_see_carries_its_value(config, tables):
    """The base model without its chat template scores 0 on every task: each of its bars is labelled, no other is."""
    fig = figures.draw_paper_figure("fig05_eval_k1_reward_vs_k3_loss", config, tables)
    for ax in data_axes(fig):
        labels = [t.get_text() for t in ax.texts]
        assert labels == ["0"] * len(TASKS), ax.get_title()
    plt.close(fig)


def test_a_crowded_panel_draws_no_raw_steps(config, tables):
    """Five lines with a band each and their raw steps hide one another: past RAW_LINES_UP_TO lines, bands alone."""
    window, grid = 5, figures.beta_grid(config)
    training = tables["training"]
    for kls, raw in ((["none", "k1-reward", "k1-loss", "k3-reward", "k3-loss"], False), (["none", "k1-reward"], True)):
        fig, ax = plt.subplots()
        rows = training[training.kl.isin(kls) & training.beta.isin([0.0, 1.0])]
        figures.step_curves(ax, rows, "task_reward", window, grid)
        thin = [line for line in ax.lines if line.get_label().startswith("_")]
        assert len(thin) == (len(kls) if raw else 0)
        assert len(ax.collections) == len(kls)  # a band for every line either way
        plt.close(fig)


def test_the_forest_says_why_an_interval_spans_the_axis_and_names_a_margin_z(config):
    claims = claims_rows("not shown")
    fig = figures.draw_claims_forest(claims, config)
    seen = texts(fig)
    assert "An arrow: the interval runs past the panel" in seen and "(2 seeds: ± 31.8 se)" in seen
    assert "not shown margin z 5 / 3 n 2" in seen  # the same claim's z is its distance inside the margin
    assert "not shown z 3 / 31.8 n 2" in seen
    plt.close(fig)
    narrow = claims.assign(se=0.001, critical=3.0)  # every interval inside its panel: no arrow, no note
    fig = figures.draw_claims_forest(narrow, config)
    assert "An arrow" not in texts(fig)
    plt.close(fig)


def test_a_panel_of_one_beta_counts_that_betas_claims(config, tables):
    """fig05 draws β = 0.1 and β = 1 apart: each panel's title counts the claims at its own β only."""
    claims = claims_rows("not shown").iloc[:2].assign(metric="evaluation", candidate="k1-reward", baseline="k3-loss",
                                                       predicted="higher", beta=[0.1, 1.0])  # fmt: skip
    claims.loc[1, "verdict"] = "shown"
    fig = figures.draw_paper_figure("fig05_eval_k1_reward_vs_k3_loss", config, tables, claims)
    titles = [ax.get_title() for ax in data_axes(fig)]
    assert "claims: 0 of 1 shown" in titles[0] and "claims: 1 of 1 shown" in titles[1]
    plt.close(fig)


def test_gradient_norms_are_drawn_on_a_log_axis_and_question_pairs_name_their_seeds(config, tables):
    """A gradient norm of 0.2 beside one of 6 is a flat line at 0 on a linear axis shared across β."""
    fig = figures.draw_training_figure("onpolicy", config, tables)
    scales = {ax.get_ylabel(): ax.get_yscale() for ax in fig.axes if ax.get_ylabel()}
    assert scales["gradient norm (before clipping, log scale)"] == "log"
    assert scales["task reward (batch mean, no KL term)"] == "linear"
    plt.close(fig)
    questions = claims_rows("not shown").head(1).assign(pair_by="questions", units=100, seeds=4)
    fig = figures.draw_claims_forest(questions, config)
    assert "n 100 questions × 4 seeds" in texts(fig)
    plt.close(fig)


def test_a_training_figure_keys_colour_and_line_style_apart(config, tables):
    """One legend entry per configuration and one per β (9 lines, 7 entries), not one per configuration × β."""
    fig = figures.draw_training_figure("onpolicy", config, tables)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["no KL (β = 0)", "K1 in reward", "K1 in loss", "K3 in reward", "K3 in loss", "β = 0.1", "β = 1"]
    plt.close(fig)
