"""The atlas's figure (src/klstudy/report/figures/atlas.py) on small families: the one encoding (colour, marker and
fill of the KL configuration, line style of β; normalisation and G on the axis), print size, words for every setting,
numbers read from the drawing, and new rows (a preset, a β) drawn without a change of code."""

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from figure_checks import every_problem, tagged
from figure_study import study_config

from klstudy.analysis import atlas, effective_beta
from klstudy.analysis import fixed_points as fp
from klstudy.report.figures import atlas as atlas_figure
from klstudy.report.figures import atlas_length, encoding

FLOW = {"step": 0.25, "steps": 200, "newton_every": 25}
ONE = {"kind": "ones_at_least", "threshold": 1}
SECTION = {
    "configs": ["k3-loss"],
    "normalisations": ["rloo", "group_std"],
    "group_sizes": [2],
    "reference": {"a_ref": -0.5, "b_ref": 0.1},
    "presets": [],
    "extra_presets": {  # small G, to keep it quick; verl's coincides with a grid setting the figure draws
        "trl-grpo": {
            "framework": "TRL",
            "version": "1.16.0",
            "source": "trl",
            "kl": "k3-loss-ratio",
            "normalisation": "group_std",
            "group": 4,
            "default_beta": 0.0,
        },
        "verl-grpo": {
            "framework": "verl",
            "version": "0.7.0",
            "source": "verl",
            "kl": "k3-loss",
            "normalisation": "group_std",
            "group": 2,
            "default_beta": 0.0,
            "clamp": 10.0,
        },
    },  # fmt: skip
    "length": {
        "settings": ["k3-loss/rloo/G2", "trl-grpo", "verl-grpo"],  # verl's: K3 in the loss again, ÷ group std
        "betas": [1.0],
        "threshold_fraction": 0.75,
        "max_length": {"tabular": 2, "parametric": 3},
    },  # fmt: skip
}


@pytest.fixture(scope="module")
def tables():
    """The atlas's end points on the small families above (T = 2) and its length sweep (to T = 3)."""
    settings = atlas.grid_settings(SECTION)
    points = pd.concat(
        [atlas.end_points(fp.Family(name, 2, -0.5, 0.1), ONE, settings, [0.3, 1.0], FLOW) for name in fp.FAMILIES],
        ignore_index=True,
    )
    return points, atlas.length_sweep(SECTION, FLOW)


def test_the_atlas_passes_every_check_and_keys_at_most_nine_entries(tables):
    points, _ = tables
    fig, caption = atlas_figure.figure(points, SECTION, beta_min=effective_beta.EFFECTIVE_BETA_RANGE[0])
    assert every_problem(fig, caption, study_config()) == []
    assert len(fig.legends) == 1 and len(fig.legends[0].get_texts()) <= 9
    assert "\n" not in fig._suptitle.get_text() and "β_eff" in caption
    plt.close(fig)


def test_marker_and_fill_say_the_configuration_never_the_normalisation_or_g(tables):
    """Every tagged artist's marker is its KL configuration's (a square for K3 in the loss, whatever its
    normalisation or G); the normalisations are named on the grid's axis."""
    points, length = tables
    fig, _ = atlas_figure.figure(points, SECTION, beta_min=effective_beta.EFFECTIVE_BETA_RANGE[0])
    markers = {(artist.get_gid().split(";")[0], artist.get_marker()) for artist in tagged(fig)
               if hasattr(artist, "get_marker") and artist.get_marker() not in ("", "None")}  # fmt: skip
    assert markers and all(marker == encoding.PLACEMENT_MARKERS["loss"] for _, marker in markers), markers
    grid = next(ax for ax in fig.axes if ax.get_xlabel().startswith("G, completions per prompt"))
    assert {"RLOO", "÷ group std"} <= {" ".join(t.get_text().split()) for t in grid.texts}
    plt.close(fig)


def test_presets_are_named_by_their_framework_and_coinciding_ones_together(tables):
    points, length = tables
    fig, caption = atlas_figure.figure(points, SECTION, beta_min=effective_beta.EFFECTIVE_BETA_RANGE[0])
    names = [" ".join(t.get_text().split()) for t in fig.axes[0].get_yticklabels()]  # a row per preset
    assert any(name.startswith("TRL 1.16 GRPO") for name in names)
    assert not any("trl-grpo" in name or "group_std" in name for name in names)
    plt.close(fig)


def test_a_new_preset_and_a_new_beta_are_drawn_from_the_table_alone(tables):
    """Rows the table gains (#71: presets by framework version, more β) need no change of the figure's code."""
    points, length = tables
    extra = points[points.setting == "verl-grpo"].assign(setting="verl-grpo-0-4", preset="verl-grpo-0-4",
                                                         beta_eff_ratio=lambda t: t.beta_eff_ratio * 1.2)  # fmt: skip
    wider = points[points.beta == 1.0].assign(beta=10.0, beta_eff_ratio=lambda t: t.beta_eff_ratio * 0.9)
    section = {**SECTION, "extra_presets": {**SECTION["extra_presets"], "verl-grpo-0-4": {
        "framework": "verl", "version": "0.4.0", "source": "verl", "kl": "k3-loss", "normalisation": "group_std",
        "group": 2, "default_beta": 0.0}}}  # fmt: skip
    fig, caption = atlas_figure.figure(pd.concat([points, extra, wider], ignore_index=True), section,
                                       beta_min=effective_beta.EFFECTIVE_BETA_RANGE[0])  # fmt: skip
    assert "verl 0.4" in " ".join(t.get_text() for t in fig.axes[0].get_yticklabels())
    assert "β\u00a0=\u00a010" in [ax.get_title() for ax in fig.axes]  # a panel of its own
    assert every_problem(fig, caption, study_config()) == []
    plt.close(fig)


def test_a_preset_is_named_by_its_framework():
    assert atlas_figure.preset_name("nemo-rl-grpo", {"framework": "NeMo-RL", "version": "0.6.0"}) == "NeMo-RL 0.6 GRPO"
    assert atlas_figure.preset_name("trl-grpo", {"framework": "TRL", "version": "1.16.0"}) == "TRL 1.16 GRPO"
    assert atlas_figure.preset_name("slime-default", {"framework": "slime", "version": "main"}) == "slime default"
    shipped = {
        name: atlas_figure.preset_name(name, row)
        for name, row in atlas.presets_of(
            {"presets": ["trl-1.9", "verl-0.7-kl-loss", "openrlhf-0.11-reinforce-baseline", "skyrl-k2-proposal"]}
        ).items()
    }
    assert shipped == {
        "trl-1.9": "TRL 0.26–1.9",
        "verl-0.7-kl-loss": "verl 0.7 KL loss",
        "openrlhf-0.11-reinforce-baseline": "OpenRLHF 0.11 REINFORCE++ baseline",
        "skyrl-k2-proposal": "SkyRL 0.3 + PR 1445 K2 proposal",
    }  # the key's version not repeated


def test_every_normalisation_has_a_name():
    """A normalisation kl.ADVANTAGES gains is named in the figure (on the grid's axis and in the caption)."""
    from klstudy import kl

    assert set(kl.ADVANTAGES) <= set(atlas_figure.NORMALISATION_NAMES) & set(atlas_figure.AXIS_NAMES)


def test_the_conventions_name_every_configurations_colour_in_words():
    """figures/README.md names each configuration's colour in words (a colour without a name was printed as hex)."""
    import re

    from klstudy.report.figures.captions import conventions

    assert not re.search(r"#[0-9A-Fa-f]{6}", conventions({}))


def test_a_presets_panel_is_read_across_against_its_reference():
    """The presets' panels are rows of points across, each read against β_eff/β = 1: a panel without the reference,
    or without a point, is a panel that shows nothing."""
    from figure_checks import DOTS, panel_problems

    fig, ax = plt.subplots()
    ax.set_gid(DOTS)
    ax.plot([0.5], [0], "o")
    assert panel_problems(fig, "Claims on it") == ["'': points with no reference to read them against"]
    ax.axvline(1, gid="reference one")
    assert panel_problems(fig, "Claims on it") == []
    plt.close(fig)


def test_the_length_sweep_passes_every_check_and_no_panel_holds_two_settings_of_one_colour(tables):
    """Its own figure, a panel per family and normalisation: two settings of one KL configuration (one colour) at one
    β never share a panel, where nothing in the ink could tell them apart; each is named in its panel."""
    _, length = tables
    fig, caption = atlas_length.length_figure(length, SECTION)
    assert every_problem(fig, caption, study_config()) == []
    for ax in fig.axes:
        styles = [line.get_gid() for line in ax.get_lines() if (line.get_gid() or "").startswith("style kl=")]
        assert styles and len(styles) == len(set(styles)), (ax.get_title(), styles)
    named = {" ".join(t.get_text().split()) for ax in fig.axes for t in ax.texts}
    assert {"K3 in loss", "TRL 1.16 GRPO, G = 4"} <= named, named
    assert "K3 in loss at β = 1:" in caption and "at T = " in caption
    plt.close(fig)


def test_configurations_that_end_alike_everywhere_are_drawn_once_and_named_together():
    """Two configurations with the same β_eff/β in every grid setting are one line whose legend entry names both;
    coinciding lines within a panel are drawn in falling widths and said in the caption."""
    grid = pd.DataFrame([  # K1 in the advantage ends where K1 in the reward does under RLOO only
        {"family": "tabular", "config": config, "beta": 1.0, "status": "stable", "normalisation": normalisation,
         "group": 2, "beta_eff_ratio": value, "preset": None, "T": 2, "setting": f"{config}/{normalisation}/G2"}
        for config, rloo, grpo in (("k1-reward", 1.0, 1.0), ("k1-both", 1.0, 1.0), ("k1-advantage", 1.0, 2.0),
                                   ("k3-loss", 0.9, 1.9))
        for normalisation, value in (("rloo", rloo), ("grpo", grpo))
    ])  # fmt: skip
    fig, caption = atlas_figure.figure(grid, {"betas": [1.0]}, beta_min=effective_beta.EFFECTIVE_BETA_RANGE[0])
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "K1 in reward = K1 in reward and loss" in labels and "K1 in reward and loss" not in labels
    # K3 in the loss, 10 % under them, within a marker's height: hollow, so drawn widest and beneath
    assert "tabular, β = 1, RLOO: K3 in loss and K1 in reward and K1 in advantage (per token)" in caption
    panel = next(ax for ax in fig.axes if ax.get_xlabel().startswith("G, completions per prompt"))
    rloo = {line.get_gid().split(";")[0]: line.get_markersize() for line in panel.get_lines()
            if (line.get_gid() or "").startswith("style kl=") and list(line.get_xdata()) == [0]}  # fmt: skip
    assert rloo["style kl=k3-loss"] > rloo["style kl=k1-reward"] > rloo["style kl=k1-advantage"], rloo
    assert "style kl=k1-both" not in rloo
    plt.close(fig)


def test_lines_that_run_together_over_part_of_their_length_are_drawn_in_falling_widths():
    """A long line that meets another from some T on (a line hid one from T = 7 in the length sweep, unnamed: the
    rule asked for nearness at every T) joins its group, and so does a line near any member, not only the first."""
    xs = [1, 2, 3, 4]
    first = {"xs": xs, "ys": [1.0, 1.0, 1.0, 1.0]}
    joins_late = {"xs": xs, "ys": [2.0, 2.0, 1.02, 1.01]}
    near_the_second = {"xs": xs, "ys": [2.1, 2.1, 3.0, 3.0]}
    apart = {"xs": xs, "ys": [5.0, 5.0, 5.0, 5.0]}
    groups = atlas_figure._overlapping([first, joins_late, near_the_second, apart], at_least=2)
    assert [len(g) for g in groups] == [3, 1]
    assert [len(g) for g in atlas_figure._overlapping([first, joins_late, near_the_second, apart])] == [1, 1, 1, 1]


def test_an_end_point_beyond_the_optima_is_drawn_as_the_bound_its_ratio_lies_below():
    """No β_eff because the end point has more KL than the optimum at the least β the optima reach (β_c): an arrow at
    β_c/β where its line has a gap (the gap alone hid a ratio below 0.11 under the axis), from the shipped tables."""
    import yaml

    tables = Path(__file__).resolve().parents[1] / "docs" / "atlas" / "tables"
    length = pd.read_csv(tables / "atlas_length.csv")
    section = yaml.safe_load((tables / "config.yaml").read_text())["toy"]["atlas"]
    fig, caption = atlas_length.length_figure(length, section)
    arrows = sorted((round(x), y) for ax in fig.axes for line in ax.get_lines() if line.get_gid() == "bound"
                    for x, y in zip(line.get_xdata(), line.get_ydata(), strict=True))  # fmt: skip
    beyond = length[(length.status == "stable") & length.beta_eff_ratio.isna() & length.beyond_curve.astype(bool)]
    beyond = beyond[beyond.beta.isin(section["length"]["betas"])]
    assert len(beyond) and arrows == sorted(zip(beyond["T"], beyond.curve_beta_min / beyond.beta, strict=True))
    assert all(ax.get_ylim()[0] < min(y for _, y in arrows) for ax in fig.axes)  # every arrow inside the axes
    assert "a bar at β_c/β, which its β_eff/β lies below" in caption
    plt.close(fig)


def test_the_atlas_draws_every_bound_and_joins_only_configurations_whose_gaps_agree_too():
    """Presets and grid: each end point beyond the optima is an arrow at its bound (blanks hid the weakest presets,
    below 0.11); two configurations are drawn as one only where they agree on their gaps and why as well (the caption
    joined two that one list called still moving and the other beyond the optima). From the shipped tables."""
    import yaml

    from klstudy.analysis.effective_beta import EFFECTIVE_BETA_RANGE

    tables = Path(__file__).resolve().parents[1] / "docs" / "atlas" / "tables"
    points = pd.read_csv(tables / "atlas.csv")
    section = yaml.safe_load((tables / "config.yaml").read_text())["toy"]["atlas"]
    fig, caption = atlas_figure.figure(points, section, beta_min=EFFECTIVE_BETA_RANGE[0])
    drawn = {round(float(v), 9) for ax in fig.axes for line in ax.get_lines() if line.get_gid() == "bound"
             for v in [*line.get_xdata(), *line.get_ydata()]}  # fmt: skip
    beyond = points[(points.status == "stable") & points.beta_eff_ratio.isna() & points.beyond_curve.astype(bool)
                    & points.beta.isin(section["betas"])]  # fmt: skip
    assert len(beyond) and {round(b, 9) for b in beyond.curve_beta_min / beyond.beta} <= drawn
    assert "K3 in loss, ratio-weighted = weighted K2-gradient" not in caption
    plt.close(fig)
