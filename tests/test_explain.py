"""The frameworks' presets by version (frameworks.py) and `klstudy explain` (analysis/explain.py)."""

import subprocess
import sys

import pytest
import yaml

from klstudy import frameworks as presets
from klstudy import kl
from klstudy.analysis import explain
from klstudy.config import validate_config

TOY = validate_config(yaml.safe_load(open("config.yaml")))["toy"]


def test_every_preset_is_a_setting_of_a_release_with_its_sources():
    for name, preset in presets.PRESETS.items():
        assert preset.version[0].isdigit() and "main" not in preset.version, name
        assert ":" in preset.source and preset.framework in explain.OFFERS, name
        assert preset.default_beta >= 0 and (preset.recipe_beta is None or preset.recipe_beta > 0), name
    proposals = [name for name, p in presets.PRESETS.items() if p.status == "proposal"]
    assert proposals == ["skyrl-k2-proposal"]


def test_a_framework_whose_behaviour_changed_has_a_preset_per_behaviour():
    """TRL ≤ 1.9 and ≥ 1.10, NeMo-RL 0.6 and 0.7 differ in the loss gradient only; slime's default and its scripts in
    the estimator; OpenRLHF's GRPO, its default KL and REINFORCE++-baseline in placement or normalisation."""
    p = presets.PRESETS
    assert (p["trl-1.9"].kl, p["trl-1.16"].kl) == ("k3-loss", "k3-loss-ratio")
    assert (p["nemo-rl-0.6"].kl, p["nemo-rl-0.7"].kl) == ("k3-loss", "k3-loss-score")
    assert (p["slime-0.3-default"].kl, p["slime-0.3-scripts"].kl) == ("k1-loss", "k3-loss")
    assert p["openrlhf-0.11-kl-in-reward"].kl == "k1-advantage" and p["areal-1.0-grpo"].kl == "k1-advantage"
    assert p["openrlhf-0.11-reinforce-baseline"].normalisation == "group_whiten"
    assert p["verl-0.7-kl-loss"].group == 5 and p["skyrl-0.3"].default_beta == 0.001


def test_the_trl_preset_is_what_the_installed_trl_defaults_to():
    """TRL 1.16.0, the project's pin: the preset's β, G, normalisation and KL term are GRPOConfig's own defaults."""
    from trl import GRPOConfig

    defaults = GRPOConfig(output_dir="unused", use_cpu=True)
    preset = presets.PRESETS["trl-1.16"]
    assert defaults.beta == preset.default_beta == 0.0
    assert defaults.num_generations == preset.group
    assert kl.TRL_SCALE_REWARDS[preset.normalisation] == defaults.scale_rewards
    assert defaults.use_bias_correction_kl is True and preset.kl.endswith("-ratio")


@pytest.mark.parametrize(
    "framework, version, expected",
    [("TRL", "0.26.0", "trl-1.9"), ("TRL", "1.9.2", "trl-1.9"), ("trl", "1.12.1", "trl-1.16"),
     ("NeMo-RL", "0.6.0", "nemo-rl-0.6"), ("NeMo-RL", "0.7.0", "nemo-rl-0.7"), ("SkyRL", "0.3.0", "skyrl-0.3")],
)  # fmt: skip
def test_a_framework_and_version_find_their_preset(framework, version, expected):
    assert explain.preset_for(framework, version) == expected


def test_a_version_no_preset_covers_is_refused_naming_what_was_read():
    with pytest.raises(ValueError, match="TRL 0.26.0–1.9.2"):
        explain.preset_for("TRL", "0.21.0")


@pytest.mark.parametrize("name", sorted(presets.PRESETS))
def test_every_preset_is_described_and_judged_for_bias(name):
    """The cheap lines for every preset: what the term is in words, its exact bias in the toy, and the nearest
    unbiased option its framework offers (itself where it is unbiased)."""
    setting = explain.Setting.of_preset(name, 1.0)
    words = explain.describe(setting.config)
    assert words.startswith(kl.KLSpec.from_name(setting.config).estimator.upper())
    bias = explain.kl_gradient_bias(setting.config, TOY)
    expected_unbiased = setting.config in ("k1-reward", "k1-advantage", "k1-both", "k3-both")
    assert explain.unbiased(bias) == expected_unbiased, bias
    nearest = explain.nearest_unbiased(setting, TOY)
    if expected_unbiased:
        assert nearest.endswith("this one")
    elif presets.PRESETS[name].framework in ("verl", "OpenRLHF", "SkyRL", "AReaL"):
        assert "offers: k1-" in nearest  # K1 in the reward or the advantage
    else:
        assert nearest.startswith("nearest unbiased setting: none among")


def test_per_token_corrections_are_unbiased_at_one_token_only():
    """Table 1's exact result, as explain computes it: TRL's ratio form has zero bias at T = 1 and not at T = 4;
    the path-wise K3 loss is biased at T = 1 already (its expected gradient is the forward KL's)."""
    ratio, pathwise = (explain.kl_gradient_bias(c, TOY) for c in ("k3-loss-ratio", "k3-loss"))
    assert kl.exactly_zero(ratio[1], 1.0) and not kl.exactly_zero(ratio[4], 1.0)
    assert not kl.exactly_zero(pathwise[1], 1.0)


def test_a_bad_setting_is_refused_with_its_field():
    for bad, field in [(("k9-loss", "rloo", 8, 0.1), "k9"), (("k3-loss", "ppo", 8, 0.1), "ppo"),
                       (("k3-loss", "rloo", 1, 0.1), "G must"), (("k3-loss", "rloo", 8, 0.0), "β > 0")]:  # fmt: skip
        with pytest.raises(ValueError, match=field):
            explain.Setting(*bad).check()
    with pytest.raises(ValueError, match="framework"):
        explain.Setting("k3-loss", "rloo", 8, 0.1, framework="Axolotl").check()


@pytest.mark.deep  # the deep tier: `make test-deep` (docs/testing.md)
def test_explain_prints_a_preset_and_a_setting_no_preset_covers(tmp_path):
    """The command as a user types it: a framework by version, and a setting of kl.py's grammar that no preset is
    (K2 in the advantage with NeMo-RL's normalisation at G = 3), each in a few lines with β_eff/β in both families.
    In a config whose toy answers have T = 2 tokens (its own --config): config.yaml's T = 4 takes minutes on 2 cores."""
    config = yaml.safe_load(open("config.yaml"))
    config["toy"].setdefault("fixed_points", {}).update(length=2, reward={"kind": "ones_at_least", "threshold": 1})
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    command = [sys.executable, "-m", "klstudy", "explain", "--beta", "1", "--range", "3",
               "--config", str(tmp_path / "config.yaml")]  # fmt: skip
    outside = ["--kl", "k2-advantage", "--normalisation", "loo_std", "--group", "3"]
    for arguments, named in ((["--framework", "TRL", "--version", "1.12.0"], "trl-1.16"), (outside, "k2-advantage")):
        out = subprocess.run(command + arguments, capture_output=True, text=True, check=True).stdout
        lines = out.strip().splitlines()
        assert len(lines) <= 8 and named in lines[0], out
        assert sum(line.startswith("β_eff/β, ") for line in lines) == 2, out
        assert "limits:" in lines[-1] and "T = 2" in lines[-1]
