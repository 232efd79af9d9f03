"""A user's KL setting in their framework's own words, read into a setting the toy computes (`klstudy explain
--framework X --version V -- <settings>`): verl's config keys, OpenRLHF's and slime's flags, TRL's GRPOConfig fields.

Each key means what the project's record read at the presets' release tags (frameworks.py's sources;
docs/record/framework-kl.md); a key the record does not describe is refused by name, never ignored, and so is a value
the toy cannot hold. Keys left out take the framework's default at that release. G, where the framework's own key
for it was not read (OpenRLHF) or defaults to 1 (verl, slime: no group), is the preset's unless explain's --group
says otherwise, and the output says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from klstudy import kl
from klstudy.frameworks import Preset


@dataclass
class Read:
    """What a user's settings amount to: a KL configuration of kl.py's grammar (kl.NO_KL: off), and the rest."""

    config: str
    normalisation: str
    group: int
    beta: float
    clamp: float | None
    notes: list[str] = field(default_factory=list)


class Keys:
    """The settings given, as {key: value text}; each key read is ticked off, and any left over is an error."""

    def __init__(self, framework: str, pairs: dict[str, str]):
        self.framework, self.pairs, self.read = framework, pairs, set()

    def text(self, key: str, default: str) -> str:
        self.read.add(key)
        return self.pairs.get(key, default)

    def number(self, key: str, default: float) -> float:
        value = self.text(key, str(default))
        try:
            return float(value)
        except ValueError:
            raise ValueError(f"{self.framework} {key}: {value!r} is not a number") from None

    def flag(self, key: str, default: bool) -> bool:
        value = self.text(key, str(default)).lower()
        if value not in ("true", "false"):
            raise ValueError(f"{self.framework} {key}: {value!r} is not true or false")
        return value == "true"

    def choice(self, key: str, default: str, meanings: dict) -> object:
        value = self.text(key, default)
        if value not in meanings:
            raise ValueError(f"{self.framework} {key}: {value!r} is not one of {sorted(meanings)} (the values read)")
        return meanings[value]

    def given(self, key: str) -> bool:
        return key in self.pairs

    def check_all_read(self) -> None:
        unknown = sorted(set(self.pairs) - self.read)
        if unknown:
            raise ValueError(
                f"{self.framework}: {', '.join(unknown)} not read by the project (its record says what each key it "
                f"reads does; the keys read are {sorted(self.read)})"
            )


def key_value_pairs(framework: str, tokens: list[str]) -> dict[str, str]:
    """``key=value`` tokens (verl's Hydra overrides, TRL's GRPOConfig fields)."""
    pairs = {}
    for token in tokens:
        key, equals, value = token.partition("=")
        if not equals:
            raise ValueError(f"{framework} setting {token!r} is not key=value")
        pairs[key] = value
    return pairs


def flag_pairs(framework: str, tokens: list[str], switches: set[str]) -> dict[str, str]:
    """Command-line flags (OpenRLHF's, slime's): ``--flag value``, ``--flag=value``, or a switch alone (true)."""
    pairs, rest = {}, list(tokens)
    while rest:
        token = rest.pop(0)
        if not token.startswith("--"):
            raise ValueError(f"{framework} setting {token!r} is not a --flag")
        key, equals, value = token.partition("=")
        if not equals:
            value = "true" if key in switches else (rest.pop(0) if rest else "")
        if not value:
            raise ValueError(f"{framework} {key} has no value")
        pairs[key] = value
    return pairs


def _group(keys: Keys, key: str | None, preset: Preset, group: int | None, notes: list[str]) -> int:
    """G from the framework's key where it was read, else explain's --group, else the preset's (said in a note)."""
    if key and keys.given(key):
        return int(keys.number(key, preset.group))
    if group is not None:
        return group
    if key:
        keys.text(key, "")
    notes.append(f"G = {preset.group}, the preset's" + (f" ({key} not given)" if key else ""))
    return preset.group


# verl 0.7.0's kl_penalty names (core_algos.py:1626-1643); k1+/k3+ raise NotImplementedError there, abs is no
# estimator of kl.py's: refused.
VERL_ESTIMATORS = {"kl": "k1", "k1": "k1", "mse": "k2", "k2": "k2", "low_var_kl": "k3", "k3": "k3"}


def read_verl(keys: Keys, preset: Preset, group: int | None) -> Read:
    """verl 0.7.0 (ppo_trainer.yaml:84-102, actor/actor.yaml:95-105): GRPO, the KL in the reward, the KL loss or
    both (one estimator and one β: kl.py's 'both')."""
    notes = []
    # omitted, its default gae is read as grpo (modelled, said in the notes); given, gae is refused
    keys.choice("algorithm.adv_estimator", "grpo", {"grpo": "grpo", "gae": None}) or _refuse(
        "verl algorithm.adv_estimator=gae (its default) is PPO with a critic, outside the toy; the toy models "
        "algorithm.adv_estimator=grpo, as verl's example scripts set it"
    )
    if not keys.given("algorithm.adv_estimator"):
        notes.append("advantages modelled as algorithm.adv_estimator=grpo: its default, gae, is PPO with a critic, "
                     "outside the toy")  # fmt: skip
    in_reward = keys.flag("algorithm.use_kl_in_reward", False)
    reward_estimator = keys.choice("algorithm.kl_penalty", "kl", VERL_ESTIMATORS)
    reward_beta = keys.number("algorithm.kl_ctrl.kl_coef", 0.001)
    in_loss = keys.flag("actor_rollout_ref.actor.use_kl_loss", False)
    loss_estimator = keys.choice("actor_rollout_ref.actor.kl_loss_type", "low_var_kl", VERL_ESTIMATORS)
    loss_beta = keys.number("actor_rollout_ref.actor.kl_loss_coef", 0.001)
    normalisation = "group_std" if keys.flag("algorithm.norm_adv_by_std_in_grpo", True) else "mean"
    size = _group(keys, "actor_rollout_ref.rollout.n", preset, group, notes)
    parts = [(e, b, p) for on, e, b, p in ((in_reward, reward_estimator, reward_beta, "reward"),
                                           (in_loss, loss_estimator, loss_beta, "loss")) if on and b > 0]  # fmt: skip
    if not parts:
        return Read(kl.NO_KL, normalisation, size, 0.0, None, notes)
    if len(parts) == 2 and parts[0][:2] != parts[1][:2]:
        raise ValueError(
            "verl: the KL in the reward and the KL loss with different estimators or coefficients "
            f"({parts[0][:2]} and {parts[1][:2]}): kl.py's 'both' has one estimator and one β"
        )
    estimator, beta = parts[0][:2]
    placement = "both" if len(parts) == 2 else parts[0][2]
    return Read(f"{estimator}-{placement}", normalisation, size, beta, 10.0 if estimator == "k3" else None, notes)


# OpenRLHF 0.11.0 (train_ppo_ray.py:419-429, 477-486): every estimator clamped ±10 (models/utils.py:78-95).
OPENRLHF_ADVANTAGES = {"group_norm": "group_std", "reinforce_baseline": "group_whiten", "reinforce": "whiten"}


def read_openrlhf(keys: Keys, preset: Preset, group: int | None) -> Read:
    """OpenRLHF 0.11.0: the KL per token after the advantage (default) or, with --algo.kl.use_loss, in the loss."""
    notes = []
    normalisation = keys.choice(
        "--algo.advantage.estimator", "group_norm", OPENRLHF_ADVANTAGES | {"gae": None}
    ) or _refuse("OpenRLHF --algo.advantage.estimator gae (its default) needs a critic, which the toy has not")
    if not keys.given("--algo.advantage.estimator"):
        notes.append("advantages modelled as --algo.advantage.estimator group_norm: its default, gae, is PPO with a "
                     "critic, outside the toy")
    if keys.given("--algo.kl.target"):
        _refuse("OpenRLHF --algo.kl.target (an adaptive coefficient): the toy holds a fixed β only")
    estimator = keys.choice("--algo.kl.estimator", "k1", {e: e for e in kl.ESTIMATORS})
    beta = keys.number("--algo.kl.init_coef", 0.01)
    placement = "loss" if keys.flag("--algo.kl.use_loss", False) else "advantage"
    size = _group(keys, None, preset, group, notes)
    config = f"{estimator}-{placement}" if beta > 0 else kl.NO_KL
    return Read(config, normalisation, size, beta, 10.0, notes)


def read_slime(keys: Keys, preset: Preset, group: int | None) -> Read:
    """slime 0.3.1 (arguments.py:897-999): the KL loss only; --kl-coef has no effect for GRPO (ppo_utils.py:361-368)."""
    notes = []
    if keys.given("--kl-coef"):
        keys.number("--kl-coef", 0.0)
        notes.append("--kl-coef has no effect for GRPO (slime's record)")
    on = keys.flag("--use-kl-loss", False)
    beta = keys.number("--kl-loss-coef", 0.0)
    estimator = keys.choice("--kl-loss-type", "k1", {"k1": "k1", "low_var_kl": "k3"})
    gradient = "-ratio" if keys.flag("--use-unbiased-kl", False) else ""
    size = _group(keys, "--n-samples-per-prompt", preset, group, notes)
    config = f"{estimator}-loss{gradient}" if on and beta > 0 else kl.NO_KL
    return Read(config, "group_std", size, beta, 10.0 if estimator == "k3" else None, notes)


# TRL's scale_rewards, as GRPOConfig takes it (True is "group", False "none"): kl.TRL_SCALE_REWARDS read backwards.
TRL_NORMALISATIONS = {text: name for name, text in kl.TRL_SCALE_REWARDS.items()} | {"True": "group_std",
                                                                                      "False": "mean"}  # fmt: skip
# loss_type's token aggregations: every answer of the toy has the same length T, so each is the same positive
# multiple of both the task and the KL term there, and none moves the end point. Other loss types change the
# policy term itself and are refused.
TRL_AGGREGATIONS = ("grpo", "bnpo", "dr_grpo", "dapo")


def read_trl(keys: Keys, preset: Preset, group: int | None) -> Read:
    """TRL's GRPOConfig: K3 in the loss at beta, path-wise or × π_θ/π_old (use_bias_correction_kl)."""
    notes = []
    beta = keys.number("beta", preset.default_beta)
    normalisation = keys.choice("scale_rewards", kl.TRL_SCALE_REWARDS[preset.normalisation], TRL_NORMALISATIONS)
    ratio = keys.flag("use_bias_correction_kl", preset.kl.endswith("-ratio"))
    if keys.given("loss_type"):
        keys.choice("loss_type", "dapo", {t: t for t in TRL_AGGREGATIONS})
        notes.append("loss_type: an aggregation over tokens, the same for every answer of the toy")
    size = group if group is not None else int(keys.number("num_generations", preset.group))  # TRL's default: 8
    config = ("k3-loss-ratio" if ratio else "k3-loss") if beta > 0 else kl.NO_KL
    return Read(config, normalisation, size, beta, None, notes)


def _refuse(message: str):
    raise ValueError(message)


READERS = {"verl": (read_verl, "key=value"), "OpenRLHF": (read_openrlhf, "flags"), "slime": (read_slime, "flags"),
           "TRL": (read_trl, "key=value")}  # fmt: skip
SWITCHES = {"OpenRLHF": {"--algo.kl.use_loss"}, "slime": {"--use-kl-loss", "--use-unbiased-kl"}}


def read(preset: Preset, tokens: list[str], group: int | None = None) -> Read:
    """The setting ``tokens`` (the framework's own words) give at ``preset``'s release."""
    if preset.framework not in READERS:
        raise ValueError(
            f"settings in {preset.framework}'s own words are not read (only {sorted(READERS)}'s): give it with --kl"
        )
    reader, style = READERS[preset.framework]
    if style == "flags":
        pairs = flag_pairs(preset.framework, tokens, SWITCHES[preset.framework])
    else:
        pairs = key_value_pairs(preset.framework, tokens)
    keys = Keys(preset.framework, pairs)
    result = reader(keys, preset, group)
    keys.check_all_read()
    return result
