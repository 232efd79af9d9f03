"""The frameworks' presets by version (frameworks.py) and `klstudy explain` (analysis/explain.py)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from klstudy import framework_settings, kl
from klstudy import frameworks as presets
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
    assert p["openrlhf-0.11-k1-advantage"].kl == "k1-advantage" and p["areal-1.0-grpo"].kl == "k1-advantage"
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
     ("NeMo-RL", "0.6.0", "nemo-rl-0.6"), ("NeMo-RL", "0.7.0", "nemo-rl-0.7"), ("SkyRL", "0.3.0", "skyrl-0.3"),
     ("OpenRLHF", "0.11.0", "openrlhf-0.11-k1-advantage"), ("slime", "0.3.1", "slime-0.3-default"),
     ("verl", "0.7.0", "verl-0.7-kl-loss")],
)  # fmt: skip
def test_a_framework_and_version_find_their_default_preset(framework, version, expected):
    """The framework's default KL setup, not the first preset listed (OpenRLHF's default is the KL per token after
    the normalisation, not its GRPO script's K3 loss)."""
    assert explain.preset_for(framework, version) == expected


def test_every_release_has_one_default_and_lists_the_others():
    releases = {(p.framework, p.version) for p in presets.PRESETS.values() if p.status == "release"}
    for framework, version in releases:
        names = explain.release_presets(framework, version.split("–")[-1])
        assert sum(presets.PRESETS[n].is_default for n in names) == 1 and presets.PRESETS[names[0]].is_default
    others = explain.release_presets("OpenRLHF", "0.11.0")[1:]
    assert others == ["openrlhf-0.11-grpo", "openrlhf-0.11-reinforce-baseline"]


@pytest.mark.parametrize(
    "framework, version, off, beta",
    [("TRL", "1.16.0", True, None), ("slime", "0.3.1", True, None), ("ROLL", "0.3.0", True, None),
     ("verl", "0.7.0", True, 0.001), ("OpenRLHF", "0.11.0", False, 0.01), ("AReaL", "1.0.4", False, 0.1),
     ("SkyRL", "0.3.0", False, 0.001)],
)  # fmt: skip
def test_a_release_is_explained_at_its_own_beta_and_off_by_default_said(framework, version, off, beta):
    """β = 0 by default is said as "off by default"; the setting is computed at the preset's own β (its recipe's
    where the default is off), or not at all where it has none, with the command that computes it at a β."""
    release = explain.resolve_release(framework, version)
    assert any("off by default" in line for line in release.head) == off
    assert (release.setting.beta if release.setting else None) == beta
    if beta is None:
        assert release.head[-1].split(": ", 1)[1].startswith(explain.COMMAND)
    assert explain.resolve_release(framework, version, beta=0.3).setting.beta == 0.3


def test_a_version_no_preset_covers_is_refused_naming_what_was_read():
    with pytest.raises(ValueError, match="TRL 0.26.0–1.9.2"):
        explain.preset_for("TRL", "0.21.0")
    with pytest.raises(ValueError, match="not read, even where its functions are checked"):
        explain.preset_for("verl", "0.9.0")  # checked against kl.py (docs/frameworks.md), its defaults not read


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
    found = explain.suggestion(setting, TOY)
    if expected_unbiased:
        assert found == (setting.config, "this setting")
    elif presets.PRESETS[name].framework in ("verl", "OpenRLHF", "SkyRL", "AReaL"):
        assert found[0].startswith("k1-")  # K1 in the reward or the advantage
    else:
        assert found is None


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


def small_config(tmp_path):
    """A config whose toy answers have T = 2 tokens: config.yaml's T = 4 takes minutes on 2 cores."""
    config = yaml.safe_load(open("config.yaml"))
    config["toy"].setdefault("fixed_points", {}).update(length=2, reward={"kind": "ones_at_least", "threshold": 1})
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    return str(tmp_path / "config.yaml")


def printed_commands(out: str) -> list[str]:
    return [explain.COMMAND + line.split(explain.COMMAND, 1)[1] for line in out.splitlines() if explain.COMMAND in line]


CASES = [
    (["--framework", "verl", "--version", "0.7.0"], "verl-0.7-kl-loss", "off by default"),
    (["--framework", "verl", "--version", "0.7.0", "--beta", "0.3", "--", "algorithm.use_kl_in_reward=True",
      "actor_rollout_ref.rollout.n=5"], "k1-reward, advantages group_std (", "your verl 0.7.0"),
    (["--kl", "k2-advantage", "--normalisation", "loo_std", "--group", "3", "--beta", "1"], "k2-advantage",
     "recommended setting: name the framework (--on"),
]  # fmt: skip


def explained(config: str) -> list[str]:
    command = [sys.executable, "-m", "klstudy", "explain", "--range", "3", "--config", config]
    return [subprocess.run(command + arguments, capture_output=True, text=True, check=True).stdout
            for arguments, _, _ in CASES]  # fmt: skip


@pytest.mark.deep  # the deep tier: `make test-deep` (docs/testing.md)
def test_explain_prints_a_release_and_a_setting_no_preset_covers(tmp_path):
    """The command as a user types it: a framework by version (verl: off by default, computed at its recipe's β, the
    recommended K1 in the reward with the std off, its other preset), a user's setting in
    verl's words, and a setting of kl.py's grammar no preset is (K2 in the advantage, loo_std, G = 3)."""
    config = small_config(tmp_path)
    outputs = explained(config)
    for out, (_, named, said) in zip(outputs, CASES, strict=True):
        assert named in out and said in out, out
        assert sum(line.startswith("β_eff/β, ") for line in out.splitlines()) == 2, out
        assert sum(line.startswith("limits:") and "T = 2" in line for line in out.splitlines()) == 1, out
    assert f"G = 5: β_eff/β = {explain.EXACT_ONE} at any β (theory, not measured" in outputs[0]
    assert "G = 5, β = 0.3" in outputs[1] and all(explain.WORDS in out for out in outputs)
    assert "other preset of verl 0.7.0: verl-0.7-k1-reward" in outputs[0]
    printed = [line for out in outputs for line in printed_commands(out)]
    assert len(printed) >= 3 and all(line.endswith(f"--config {config}") for line in printed), printed


@pytest.mark.slow
def test_every_command_explain_prints_runs_as_printed(tmp_path):
    """Each command the cases above print, run as printed (.venv/bin/python: from the repository's root)."""
    config = small_config(tmp_path)
    for line in sorted({line for out in explained(config) for line in printed_commands(out)}):
        assert subprocess.run(line, shell=True, capture_output=True, text=True).returncode == 0, line


@pytest.mark.parametrize("beta", [None, 0.001, 0.3])
def test_verl_is_recommended_its_std_off_never_a_beta_that_keeps_the_std(beta):
    """verl 0.7.0 at its example script's β (0.001) or another: K1 in the reward with the group mean only and the KL
    loss off, at the strength asked exactly, not the β under ÷ std that came nearest (7.28e-06 at β 0.001)."""
    release = explain.resolve_release("verl", "0.7.0", beta=beta)
    assert "`algorithm.adv_estimator=gae` (PPO with a critic)" in release.head[0]
    assert "off by default" in release.head[1] and ("its example script's β" in release.head[1]) == (beta is None)
    [line] = explain.recommended(release.setting, TOY, {}, None)
    assert "k1-reward" in line and "advantages mean" in line and f"β_eff/β = {explain.EXACT_ONE} at any β" in line
    assert "norm_adv_by_std_in_grpo=False" in line and "actor_rollout_ref.actor.use_kl_loss=False" in line
    assert "β: algorithm.kl_ctrl.kl_coef" in line  # the recommended setting's own β key, not the KL loss's
    assert "set β" not in line and "7.28e-06" not in line


def test_trl_off_by_default_is_pointed_to_kltrainer_and_slime_to_none():
    """Computed at no β, a release still gets its recommendation where nothing need be computed for it."""
    trl = explain.explain_release(explain.resolve_release("TRL", "1.16.0"), TOY)
    assert "KLTrainer" in trl and "k1-reward" in trl and "advantages rloo" in trl
    assert f"= {explain.EXACT_ONE} at any β" in trl
    assert "β: beta" in trl
    assert explain.WORDS in trl
    slime = explain.explain_release(explain.resolve_release("slime", "0.3.1"), TOY)
    assert "recommended setting: none whose KL gradient is unbiased among what slime offers" in slime


def test_the_output_defines_its_words_and_tells_the_exact_value_from_the_measured():
    """explain's terms are defined in its output (G, T, β_eff, measured, exact, not resolved and why, †), none left
    that a user does not know (J_β, the flow); an EXACT setting's measured lines are told apart from its exact 1."""
    from klstudy.analysis.atlas import CLAMP_MARK

    for word in ("G, ", "T, ", "β_eff, ", "measured: ", "exact: ", "not resolved: ", "unsettled (", "drifts (", "< x (",
                 f"{CLAMP_MARK}: "):  # fmt: skip
        assert word in explain.WORDS, word
    setting = explain.Setting("k1-reward", "mean", 5, 0.3, framework="verl")
    lines = explain.explain(setting, TOY, range_betas=()).splitlines()
    assert lines[1] == explain.WORDS and explain.MEASURED_VS_EXACT in lines
    assert not any("J_β" in line or "flow" in line for line in lines), lines


def test_flags_that_cannot_be_combined_are_refused_before_computing():
    for arguments, said in ((["--kl", "k1-reward", "--", "beta=0.1"], "need --framework"),
                            (["--framework", "TRL"], "needs --version"),
                            (["--framework", "verl", "--version", "0.7.0", "--", "algorithm.bogus=1"],
                             "algorithm.bogus")):  # fmt: skip
        done = subprocess.run([sys.executable, "-m", "klstudy", "explain", *arguments], capture_output=True, text=True)
        assert done.returncode != 0 and said in done.stderr, done.stderr



def test_run_outside_the_repository_it_says_where_the_config_was_looked_for(tmp_path):
    done = subprocess.run([sys.executable, "-m", "klstudy", "explain", "--framework", "TRL", "--version", "1.16.0"],
                          capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert done.returncode != 0 and "no config.yaml here" in done.stderr and "Traceback" not in done.stderr, done.stderr

@pytest.mark.parametrize(
    "framework, version, words, expected",
    [("verl", "0.7.0", ["algorithm.use_kl_in_reward=True", "actor_rollout_ref.rollout.n=5"],
      ("k1-reward", "group_std", 5, 0.001, None)),
     ("verl", "0.7.0", ["actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_type=mse",
                        "actor_rollout_ref.actor.kl_loss_coef=0.01", "algorithm.norm_adv_by_std_in_grpo=False",
                        "actor_rollout_ref.rollout.n=8"], ("k2-loss", "mean", 8, 0.01, None)),
     ("verl", "0.7.0", ["algorithm.use_kl_in_reward=True", "algorithm.kl_penalty=low_var_kl",
                        "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.rollout.n=4"],
      ("k3-both", "group_std", 4, 0.001, 10.0)),
     ("verl", "0.7.0", ["actor_rollout_ref.rollout.n=5"], (kl.NO_KL, "group_std", 5, 0.0, None)),
     ("TRL", "1.16.0", ["beta=0.04", "scale_rewards=none", "num_generations=4", "loss_type=dr_grpo"],
      ("k3-loss-ratio", "mean", 4, 0.04, None)),
     ("TRL", "1.16.0", ["beta=0.04", "use_bias_correction_kl=False", "scale_rewards=batch"],
      ("k3-loss", "batch_std", 8, 0.04, None)),
     ("TRL", "1.9.2", ["beta=0.1"], ("k3-loss", "group_std", 8, 0.1, None)),
     ("TRL", "1.16.0", [], (kl.NO_KL, "group_std", 8, 0.0, None)),
     ("OpenRLHF", "0.11.0", [], ("k1-advantage", "group_std", 8, 0.01, 10.0)),
     ("OpenRLHF", "0.11.0", ["--algo.kl.use_loss", "--algo.kl.estimator", "k3", "--algo.kl.init_coef=1e-3"],
      ("k3-loss", "group_std", 8, 0.001, 10.0)),
     ("OpenRLHF", "0.11.0", ["--algo.advantage.estimator", "reinforce_baseline", "--algo.kl.estimator", "k2"],
      ("k2-advantage", "group_whiten", 8, 0.01, 10.0)),
     ("slime", "0.3.1", ["--use-kl-loss", "--kl-loss-type", "low_var_kl", "--kl-loss-coef", "0.001",
                         "--n-samples-per-prompt", "8", "--use-unbiased-kl"],
      ("k3-loss-ratio", "group_std", 8, 0.001, 10.0)),
     ("slime", "0.3.1", ["--use-kl-loss", "--kl-loss-type", "low_var_kl", "--kl-loss-coef", "0"],
      (kl.NO_KL, "group_std", 8, 0.0, 10.0))],
)  # fmt: skip
def test_a_setting_in_the_frameworks_own_words_is_read_into_kl_py(framework, version, words, expected):
    """verl's config keys, TRL's GRPOConfig fields, OpenRLHF's and slime's flags, as the record read them."""
    read = framework_settings.read(presets.PRESETS[explain.preset_for(framework, version)], words)
    assert (read.config, read.normalisation, read.group, read.beta, read.clamp) == expected


@pytest.mark.parametrize(
    "framework, version, words, named",
    [("verl", "0.7.0", ["algorithm.kl_ctrl.type=adaptive"], "algorithm.kl_ctrl.type"),
     ("verl", "0.7.0", ["algorithm.kl_penalty=abs"], "algorithm.kl_penalty"),
     ("verl", "0.7.0", ["actor_rollout_ref.actor.kl_loss_type=k3+"], "kl_loss_type"),
     ("verl", "0.7.0", ["algorithm.use_kl_in_reward=True", "actor_rollout_ref.actor.use_kl_loss=True"], "'both'"),
     ("verl", "0.7.0", ["algorithm.use_kl_in_reward"], "key=value"),
     ("TRL", "1.16.0", ["beta=0.04", "loss_type=sapo"], "loss_type"),
     ("TRL", "1.16.0", ["beta=0.04", "importance_sampling_level=sequence"], "importance_sampling_level"),
     ("OpenRLHF", "0.11.0", ["--algo.advantage.estimator", "gae"], "critic"),
     ("verl", "0.7.0", ["algorithm.adv_estimator=gae"], "critic, outside the toy; the toy models"),
     ("OpenRLHF", "0.11.0", ["--rollout.n_samples_per_prompt", "16"], "--rollout.n_samples_per_prompt"),
     ("slime", "0.3.1", ["--use-kl-loss", "--kl-loss-type", "k2"], "--kl-loss-type"),
     ("SkyRL", "0.3.0", ["trainer.algorithm.use_kl_loss=true"], "--kl")],
)  # fmt: skip
def test_an_option_not_read_is_named_in_the_error(framework, version, words, named):
    with pytest.raises(ValueError, match=named.replace("+", "[+]")):
        framework_settings.read(presets.PRESETS[explain.preset_for(framework, version)], words)


def test_verl_without_its_advantage_estimator_says_its_default_gae_is_modelled_as_grpo():
    """verl's own default is gae (PPO with a critic): a setting that leaves it out is read as verl's GRPO, said."""
    preset = presets.PRESETS[explain.preset_for("verl", "0.7.0")]
    omitted = framework_settings.read(preset, ["algorithm.use_kl_in_reward=True"])
    given = framework_settings.read(preset, ["algorithm.use_kl_in_reward=True", "algorithm.adv_estimator=grpo"])
    assert any("its default, gae, is PPO with a critic" in note for note in omitted.notes)
    assert not any("gae" in note for note in given.notes)


def test_a_group_of_one_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="G must"):
        explain.resolve_release("slime", "0.3.1", tokens=["--use-kl-loss", "--kl-loss-coef", "0.01",
                                                          "--n-samples-per-prompt", "1"])  # fmt: skip


@pytest.mark.deep
def test_every_explain_command_of_the_pages_runs_as_copied():
    """The docs tier runs only the commands a shown output follows, and checks the others against `--help`; these are
    all run, as a reader copies them (verl at G = 8, which the toy cannot enumerate, once crashed: atlas.end_points)."""
    pages = [Path("README.md"), *sorted(Path("docs").glob("*.md"))]
    pattern = r"\.venv/bin/python -m klstudy explain [^`\n]*"
    commands = {m for page in pages for m in re.findall(pattern, page.read_text())}
    assert len(commands) >= 4, commands
    for command in sorted(commands):
        run = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0 and "recommended" in run.stdout, f"{command}: {run.stderr[-2000:]}"
