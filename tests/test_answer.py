"""The answer table docs/analysis.md leads with is the one klstudy.analysis.answer writes from the presets, their
exact bias and the atlas's committed run."""

import pandas as pd
import pytest
import yaml

from klstudy import kl
from klstudy.analysis import answer, explain
from klstudy.config import validate_config

TOY = validate_config(yaml.safe_load((answer.ROOT / "config.yaml").read_text()))["toy"]
RECOMMENDED, STRENGTH = answer.COLUMNS[3], answer.COLUMNS[4]


@pytest.fixture(scope="module")
def expected():
    return answer.markdown()


@pytest.fixture(scope="module")
def rows():
    """{release: its Row}, built once for the module."""
    built = answer.table(pd.read_csv(answer.ATLAS), TOY)
    return {r.cells["release"]: r for r in built}


def test_the_analysis_page_holds_the_answer_table_the_code_writes(expected):
    for page in answer.PAGES:
        assert answer.between_marks(page.read_text()) == expected.strip(), (
            f"{page}: python -m klstudy.analysis.answer --write"
        )
    lines = [line for line in expected.splitlines() if line.startswith("|")]
    assert len(lines) == 2 + sum(p.is_default and p.status == "release" for p in answer.PRESETS.values())
    assert max(map(len, lines)) <= 170, "a row a laptop screen shows whole (they were over 500): long words go below"


def test_a_framework_without_an_unbiased_kl_says_so_and_one_with_the_std_off_names_the_switch(rows):
    trl, verl = rows["TRL 1.10.0–1.16.0"], rows["verl 0.7.0"]
    assert "none among TRL's own keys (k3-loss-ratio: biased)" in trl.note and "off: `beta` = 0" in trl.note
    assert trl.cells[RECOMMENDED].startswith("none in TRL; `KLTrainer`: ")  # as its note says
    assert "algorithm.norm_adv_by_std_in_grpo=False" in verl.note and verl.cells[STRENGTH] == explain.EXACT_ONE
    assert verl.cells[RECOMMENDED] == "k1-reward (mean)"


def test_a_value_where_the_clamp_binds_is_marked_and_trl_users_are_pointed_to_kltrainer(rows, expected):
    """OpenRLHF's default binds its ±10 clamp at β = 0.01 in the atlas's run (atlas.csv's clamp_binds > 0); AReaL's
    at β = 0.1 does not. TRL's GRPOTrainer offers no unbiased KL; the subclass does, at the strength asked."""
    openrlhf, areal, trl = rows["OpenRLHF 0.11.0"], rows["AReaL 1.0.4"], rows["TRL 1.10.0–1.16.0"]
    assert openrlhf.cells[answer.COLUMNS[2]] == f"0.40{answer.CLAMP_MARK}"
    assert answer.CLAMP_MARK not in " ".join(areal.cells.values())
    assert "`KLTrainer`" in trl.note and "k1-reward" in trl.cells[RECOMMENDED]
    assert trl.cells[STRENGTH] == explain.EXACT_ONE
    assert expected.startswith(answer.LEGEND[:40])  # its words, before the table


def test_every_row_names_the_key_that_sets_beta(rows):
    """The key each row's note names is frameworks.BETA_KEYS', for the default's KL and the recommended one alike."""
    for p in answer.PRESETS.values():
        if p.is_default and p.status == "release":
            assert f"`{answer.beta_key(p.framework, p.kl)}`" in rows[f"{p.framework} {p.version}"].note, p
    verl = rows["verl 0.7.0"].note
    assert "β: `algorithm.kl_ctrl.kl_coef`" in verl and "β:\n  `actor_rollout_ref.actor.kl_loss_coef`" not in verl
    assert "`actor_rollout_ref.actor.kl_loss_coef`" in verl


def test_a_default_outside_the_toy_is_named_with_what_the_row_models(rows):
    """OpenRLHF's default advantage estimator is gae (a critic), which the toy does not model: the row says
    `modelled:` and its note names the default and the modelled setting; a row fully modelled says neither."""
    openrlhf = rows["OpenRLHF 0.11.0"]
    assert "(modelled: group_std, 8)" in openrlhf.cells[answer.COLUMNS[1]]
    assert "`--algo.advantage.estimator gae`" in openrlhf.note and "modelled: `group_norm`" in openrlhf.note
    assert "modelled" not in rows["AReaL 1.0.4"].cells[answer.COLUMNS[1]] + rows["AReaL 1.0.4"].note
    verl = rows["verl 0.7.0"]  # verl's own default is gae too
    assert "(modelled: group_std, 5)" in verl.cells[answer.COLUMNS[1]] and "`algorithm.adv_estimator=gae`" in verl.note


def test_a_default_off_the_strength_asked_is_recommended_at_the_beta_explain_computes(rows):
    """OpenRLHF's default (0.40†) and AReaL's (0.67) are unbiased but off 1 by more than TOLERANCE: the note says
    to set the β explain computes, not "its default" alone."""
    for release in ("OpenRLHF 0.11.0", "AReaL 1.0.4"):
        assert "Recommended: its default KL, at the β `klstudy explain` computes" in rows[release].note


def test_every_advantage_the_table_names_is_defined_in_its_legend(expected, rows):
    """One name, one normalisation: the legend says each the table uses in kl.ADVANTAGE_WORDS' words (whiten and
    group_whiten told apart), and kl.py has words for every normalisation it has."""
    assert set(kl.ADVANTAGE_WORDS) == set(kl.ADVANTAGES) - {"none"}
    legend = expected.split("\n\n", 1)[0].replace("\n", " ")
    for name in set().union(*(r.normalisations for r in rows.values())):
        assert f"`{name}`, {kl.ADVANTAGE_WORDS[name]}" in legend, name
    assert kl.ADVANTAGE_WORDS["whiten"] != kl.ADVANTAGE_WORDS["group_whiten"]


@pytest.mark.parametrize(
    "framework, version, config, words",
    [("verl", "0.7.0", "k1-reward", ["algorithm.use_kl_in_reward=True"]),
     ("verl", "0.7.0", "k3-loss", ["actor_rollout_ref.actor.use_kl_loss=True"]),
     ("OpenRLHF", "0.11.0", "k1-advantage", []), ("slime", "0.3.1", "k1-loss", ["--use-kl-loss"]),
     ("TRL", "1.16.0", "k3-loss-ratio", [])],
)  # fmt: skip
def test_the_key_named_for_beta_is_the_one_explain_reads(framework, version, config, words):
    """The page's key, given in the framework's own words to explain (framework_settings), sets that KL's β."""
    from klstudy import framework_settings

    preset = answer.PRESETS[explain.preset_for(framework, version)]
    key = answer.beta_key(framework, config)
    setting = [key, "0.037"] if key.startswith("--") else [f"{key}=0.037"]
    read = framework_settings.read(preset, words + setting)
    assert (read.config, read.beta) == (config, 0.037)


def test_a_default_with_no_beta_eff_says_why_in_the_atlas_words_the_legend_defines(rows, expected):
    """verl 0.7's example script and SkyRL's default at β = 0.001 are still moving in the atlas's run (parametric):
    the table says `unsettled`, as the atlas does, not a word of its own, and its legend says what each word it uses
    means (and no word it does not use)."""
    for release in ("verl 0.7.0", "SkyRL 0.3.0"):
        cell = rows[release].cells[answer.COLUMNS[2]]
        assert cell.startswith(f"unsettled{answer.CLAMP_MARK}") and "not resolved" not in cell, cell
    legend = expected.split("\n\n", 1)[0].replace("\n", " ")
    assert answer.WHY_NONE["unsettled"] in legend and answer.WHY_NONE["drifts"] not in legend
    assert kl.ADVANTAGE_WORDS["mean"] in legend  # the group mean only: not GRPO's own, which is group_std


def test_the_answer_table_and_explain_recommend_the_same_setting_for_every_release(rows):
    """Each release's row names the KL and advantages explain recommends at its default, klstudy's KLTrainer where
    it does, and β_eff/β 1 in the atlas's run where explain says 1 exactly."""
    for name, p in answer.PRESETS.items():
        if not p.is_default or p.status != "release":
            continue
        row = rows[f"{p.framework} {p.version}"]
        found = explain.recommendation(explain.Setting.of_preset(name), TOY)
        if found is None:
            assert row.cells[RECOMMENDED] == "none" and "KLTrainer" not in row.note, name
            continue
        assert row.cells[RECOMMENDED].removeprefix(answer.SUBCLASS_HEAD.format(p.framework)).startswith(found.config)
        assert row.cells[RECOMMENDED].endswith(f"({found.normalisation})"), (name, found, row.cells)
        assert found.via_subclass == ("KLTrainer" in row.cells[RECOMMENDED]), name
        if (found.config, found.normalisation) in explain.EXACT:
            assert row.cells[STRENGTH] == explain.EXACT_ONE, (name, row.cells)
