"""The answer table docs/analysis.md leads with is the one klstudy.analysis.answer writes from the presets, their
exact bias and the atlas's committed run."""

import pytest

from klstudy.analysis import answer


@pytest.fixture(scope="module")
def expected():
    return answer.markdown()


def test_the_analysis_page_holds_the_answer_table_the_code_writes(expected):
    for page in answer.PAGES:
        assert answer.between_marks(page.read_text()) == expected.strip(), (
            f"{page}: python -m klstudy.analysis.answer --write"
        )
    rows = [line for line in expected.splitlines() if line.startswith("|")]
    assert len(rows) == 2 + sum(p.is_default and p.status == "release" for p in answer.PRESETS.values())


def test_a_framework_without_an_unbiased_kl_says_so_and_one_with_the_std_off_names_the_switch(expected):
    rows = expected.splitlines()
    trl = next(r for r in rows if r.startswith("| TRL 1.10.0"))
    verl = next(r for r in rows if r.startswith("| verl 0.7.0"))
    assert "no unbiased KL (k3-loss-ratio: biased)" in trl and "off (β = 0)" in trl
    assert "algorithm.norm_adv_by_std_in_grpo=False" in verl and "β_eff/β 1.00 / 1.00" in verl
    assert "advantages `grpo`, the group mean only" in verl


def test_a_value_where_the_clamp_binds_is_marked_and_trl_users_are_pointed_to_kltrainer(expected):
    """OpenRLHF's default binds its ±10 clamp at β = 0.01 in the atlas's run (atlas.csv's clamp_binds > 0); AReaL's
    at β = 0.1 does not. TRL's GRPOTrainer offers no unbiased KL; the subclass does, at the strength asked."""
    rows = expected.splitlines()
    openrlhf = next(r for r in rows if r.startswith("| OpenRLHF 0.11.0"))
    areal = next(r for r in rows if r.startswith("| AReaL 1.0.4"))
    trl = next(r for r in rows if r.startswith("| TRL 1.10.0"))
    assert f"0.40{answer.CLAMP_MARK} at β = 0.01" in openrlhf and answer.CLAMP_MARK not in areal
    assert "`KLTrainer`" in trl and "k1-reward" in trl and "β_eff/β 1.00 / 1.00" in trl
    assert expected.startswith(answer.LEGEND[:40])  # its words, before the table


def test_every_row_names_the_key_that_sets_beta(expected):
    """The key each row names is frameworks.BETA_KEYS', for the default's KL and the recommended one alike."""
    rows = expected.splitlines()
    for p in answer.PRESETS.values():
        if p.is_default and p.status == "release":
            row = next(r for r in rows if r.startswith(f"| {p.framework} {p.version} "))
            assert f"β: `{answer.beta_key(p.framework, p.kl)}`" in row, row
    verl = next(r for r in rows if r.startswith("| verl 0.7.0"))
    assert "β: `algorithm.kl_ctrl.kl_coef`" in verl and "β: `actor_rollout_ref.actor.kl_loss_coef`" in verl


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
    from klstudy.analysis import explain

    preset = answer.PRESETS[explain.preset_for(framework, version)]
    key = answer.beta_key(framework, config)
    setting = [key, "0.037"] if key.startswith("--") else [f"{key}=0.037"]
    read = framework_settings.read(preset, words + setting)
    assert (read.config, read.beta) == (config, 0.037)


def test_a_default_with_no_beta_eff_says_why_in_the_atlas_words_the_legend_defines(expected):
    """verl 0.7's example script and SkyRL's default at β = 0.001 are still moving in the atlas's run (parametric):
    the table says `unsettled`, as the atlas does, not a word of its own, and its legend says what each word means."""
    rows = expected.splitlines()
    for release in ("verl 0.7.0", "SkyRL 0.3.0"):
        row = next(r for r in rows if r.startswith(f"| {release} "))
        assert f"unsettled{answer.CLAMP_MARK}" in row and "not resolved" not in row, row
    assert all(word in answer.LEGEND for word in ("`< x`", "`unsettled`", "`drifts`", "Dr. GRPO's, not GRPO's"))
