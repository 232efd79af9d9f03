"""What each framework ships as its KL setup, by version: the atlas's presets (docs/atlas.md) and `klstudy explain`'s,
and the other KL settings each offers (OFFERS).

A preset is a setting the toy can compute (a KL configuration in kl.py's grammar, an advantage normalisation of
kl.ADVANTAGES, a group size G, the clamp of the estimator's value) with what the framework's own code says at a release
tag: the files and lines it was read from, its default β (0 where the default turns the KL off) and the β its shipped
recipe sets. Where a framework's behaviour changed between versions there is a preset per behaviour; a change proposed
but not released is a preset with ``status = "proposal"``. Every line cited was read at the tag named (the record:
docs/record/framework-kl.md); the conformance tests (tests/test_frameworks.py) check kl.py's model of each against
the framework's own functions where its release installs on a CPU.

What a preset leaves out is in its ``note``: anything the toy's exact on-policy update cannot hold (off-policy
minibatches, dynamic filtering, advantage clips), and a std's ε that differs from TRL's 1e-4 (kl.STD_EPSILON; verl and
SkyRL 1e-6, OpenRLHF 1e-9, AReaL 1e-5), which moves the toy's end points by less than 3e-4 in KL.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from klstudy import kl


@dataclass(frozen=True)
class Preset:
    framework: str
    version: str  # the release(s) whose code it is: tags, never a branch
    source: str  # file:line (what), at that tag
    kl: str  # kl.py's grammar
    normalisation: str  # kl.ADVANTAGES
    group: int  # G
    default_beta: float  # the framework's default coefficient; 0: the default turns the KL off
    clamp: float | None = None  # the estimator's value clamped at ±this (kl.KLSpec.clamp)
    recipe_beta: float | None = None  # the β of the recipe it follows, where that differs from the default
    status: str = "release"  # or "proposal": not in any release
    note: str = ""
    # The framework's default KL setup at that release: the one its defaults turn on or, where its default β is 0,
    # the one its default KL switch (or recipe) turns on. `klstudy explain --framework` explains it first.
    is_default: bool = False
    # Where the framework's default is outside the toy: what it is, and what this preset models instead (the answer
    # table's notes and explain say it).
    modelled: str = ""

    def __post_init__(self):
        kl.KLSpec.from_name(self.kl, 1.0, clamp=self.clamp)  # the one check of a configuration
        if self.normalisation not in kl.ADVANTAGES or self.normalisation == "none":
            raise ValueError(f"preset normalisation {self.normalisation!r} is not one of kl.ADVANTAGES")
        if self.status not in ("release", "proposal"):
            raise ValueError(f"preset status {self.status!r} is not release or proposal")
        if not self.version[:1].isdigit():
            raise ValueError(f"preset version {self.version!r} is not a release (a tag such as 1.9.2)")

    @property
    def betas(self) -> list[float]:
        """The β the framework itself sets: its default and its recipe's, where not 0."""
        return sorted({b for b in (self.default_beta, self.recipe_beta) if b})

    def as_row(self) -> dict:
        return asdict(self)

# verl's own default advantage (ppo_trainer.yaml `adv_estimator: gae`, read at v0.9.0:74), as OpenRLHF's, is PPO
# with a critic: its presets model its GRPO, as its example scripts set it.
VERL_GAE = ("its default `algorithm.adv_estimator=gae` (PPO with a critic) is outside the toy; modelled: "
            "`adv_estimator=grpo` (÷ the group's std), as its GRPO example script")

PRESETS = {
    "trl-1.9": Preset(
        "TRL", "0.26.0–1.9.2",
        "trl/trainer/grpo_config.py at 1.9.2: :474 num_generations 8, :671 beta 0.0, :779 scale_rewards 'group', "
        ":962 use_bias_correction_kl False; grpo_trainer.py :3071-3076 (K3 per token, path-wise), :2707 (÷ std "
        "+ 1e-4), :3121 (+ beta × K3 in the loss)",
        "k3-loss", "group_std", 8, 0.0,
        note="use_bias_correction_kl arrived in 0.26.0 (PR 4638) with default False",
        is_default=True,
    ),
    "trl-1.16": Preset(
        "TRL", "1.10.0–1.16.0",
        "trl/trainer/grpo_config.py at 1.16.0: :480 num_generations 8, :681 beta 0.0, :789 scale_rewards 'group', "
        ":972 use_bias_correction_kl True (True from 1.10.0, :965 there; PR 6503); grpo_trainer.py :3100-3105 (K3 × "
        "coef_1 = π_θ/π_old), :2787 (÷ std + 1e-4)",
        "k3-loss-ratio", "group_std", 8, 0.0,
        note="on-policy π_old = sg[π_θ], so the ratio form is the score form (kl.py)",
        is_default=True,
    ),
    "verl-0.7-kl-loss": Preset(
        "verl", "0.7.0",
        "verl/trainer/config/actor/actor.yaml:95 use_kl_loss false, :102 kl_loss_coef 0.001, :105 kl_loss_type "
        "low_var_kl; verl/trainer/ppo/core_algos.py:1637-1643 (K3, log-ratio ±20, K3 ±10), :269, :323 (÷ std + 1e-6); "
        "examples/grpo_trainer/run_qwen3-8b.sh (the README's flagship): :20-22 use_kl_loss True, 0.001, low_var_kl, "
        ":31 rollout.n 5",
        "k3-loss", "group_std", 5, 0.0, clamp=10.0, recipe_beta=0.001,
        note="the recipe trains 1024 prompts a batch in minibatches of 256 (:10, :18): 3 of 4 updates off-policy, "
        "which the toy's on-policy update leaves out",
        modelled=VERL_GAE,
        is_default=True,
    ),
    "verl-0.7-k1-reward": Preset(
        "verl", "0.7.0",
        "verl/trainer/config/ppo_trainer.yaml:87 use_kl_in_reward False, :90 kl_penalty kl (K1), :102 kl_ctrl.kl_coef "
        "0.001, :84 norm_adv_by_std_in_grpo True; verl/trainer/ppo/ray_trainer.py:154 (scores − β·K1 per token, before "
        "the advantage), core_algos.py:301, :323 (GRPO sums the tokens, then ÷ the group's std)",
        "k1-reward", "group_std", 5, 0.0, recipe_beta=0.001,
        note="algorithm.use_kl_in_reward=True at the recipe's coefficient and G",
    ),
    "openrlhf-0.11-grpo": Preset(
        "OpenRLHF", "0.11.0",
        "openrlhf/cli/train_ppo_ray.py:419 --algo.kl.init_coef 0.01, :422-429 estimator k1, :485 use_loss False; "
        "examples/scripts/train_dapo_ray_hybrid_engine.sh:12-16 init_coef 1e-3, use_loss, k3, group_norm, :30 "
        "n_samples_per_prompt 8; openrlhf/models/utils.py:64-95 (every estimator ±10); "
        "trainer/ppo_utils/experience_maker.py:269-270 (÷ Bessel std + 1e-9)",
        "k3-loss", "group_std", 8, 0.01, clamp=10.0, recipe_beta=0.001,
        note="its GRPO script without its dynamic filtering",
    ),
    "openrlhf-0.11-k1-advantage": Preset(
        "OpenRLHF", "0.11.0",
        "openrlhf/cli/train_ppo_ray.py:419 init_coef 0.01, :422-429 estimator k1, :485 use_loss False (the KL in "
        "the reward), :477-483 advantage estimator gae, :413-414 n_samples_per_prompt 1; "
        "trainer/ppo_utils/experience_maker.py:205-210 (K per token from the rollout's log-probs), :264-270 (the "
        "group's baseline or ÷ std on the task reward), :276-282 (−β·K per token, compute_reward), :302-307 "
        "(reward-to-go, γ = 1); openrlhf/models/utils.py:64-95 (K1 ±10), :98-126 (compute_reward)",
        "k1-advantage", "group_std", 8, 0.01, clamp=10.0,
        note="the default KL",
        is_default=True,
        modelled="its default `--algo.advantage.estimator gae` (PPO with a critic) is outside the toy; modelled: "
        "`group_norm`, G = 8, as its GRPO script, less its `--algo.kl.use_loss` (K3 in the loss)",
    ),
    "openrlhf-0.11-reinforce-baseline": Preset(
        "OpenRLHF", "0.11.0",
        "examples/scripts/train_reinforce_baseline_hybrid_engine.sh:45 n_samples_per_prompt 8, :83 reinforce_baseline, "
        ":87-89 init_coef 1e-5, use_loss, k2; trainer/ppo_utils/experience_maker.py:267-268 (− group mean), :315-328 "
        "(whitened over every token of the batch); openrlhf/models/utils.py:64-95 (K2 ±10)",
        "k2-loss", "group_whiten", 8, 0.01, clamp=10.0, recipe_beta=1e-5,
        note="REINFORCE++-baseline as its script runs it",
    ),
    "areal-1.0-grpo": Preset(
        "AReaL", "1.0.4",
        "areal/api/cli_args.py:1522 kl_ctl 0.1, :1523 kl_estimator k1, :1480 reward_norm, :1517 adv_norm; "
        "areal/trainer/ppo/actor.py:172-173 (reward_norm), :202 (−kl_ctl·K per token), :219-235 (GAE, γ = λ = 1: "
        "reward-to-go), :238-239 (adv_norm); areal/utils/data.py:1654-1655 (K ±10); examples/math/gsm8k_grpo.yaml:36 "
        "n_samples 4, :68 kl_ctl 0.0, :75-81 reward_norm group, adv_norm batch",
        "k1-advantage", "group_std", 4, 0.1, clamp=10.0,
        note="reward_norm at group level as its GRPO example; its adv_norm then whitens the whole per-token advantage "
        "over the batch, which rescales the update by a positive number and shifts it by one without expected "
        "gradient, so the end point is group_std's; without config.ref the 'KL' is −kl_ctl·log π_old (an entropy "
        "bonus: the record)",
        is_default=True,
    ),
    "nemo-rl-0.6": Preset(
        "NeMo-RL", "0.6.0",
        "examples/configs/grpo_math_1B.yaml:4 num_generations_per_prompt 16, :8-9 normalize_rewards and "
        "use_leave_one_out_baseline true, :50 reference_policy_kl_penalty 0.01, :53 k3, :54-55 clamps 20 / 10; "
        "nemo_rl/algorithms/loss/loss_functions.py:343-358 (weights ones: path-wise)",
        "k3-loss", "loo_std", 16, 0.01, clamp=10.0,
        is_default=True,
    ),
    "nemo-rl-0.7": Preset(
        "NeMo-RL", "0.7.0",
        "examples/configs/grpo_math_1B.yaml:56 reference_policy_kl_penalty 0.01, :59 k3, :60-61 clamps 20 / 10; "
        "nemo_rl/algorithms/loss/loss_functions.py:418-438 (weights exp(log π − sg[log π]): the score form, PR 2506), "
        "nemo_rl/algorithms/utils.py:71-100 (the weight multiplied in before the output clamp)",
        "k3-loss-score", "loo_std", 16, 0.01, clamp=10.0,
        is_default=True,
    ),
    "skyrl-0.3": Preset(
        "SkyRL", "0.3.0",
        "skyrl/train/config/config.py:597 advantage_estimator grpo, :602 kl_estimator_type k3, :604 use_kl_in_reward "
        "False, :606 use_kl_loss True, :608 kl_loss_coef 0.001, :623 grpo_norm_by_std True, :813 n_samples_per_prompt "
        "5; skyrl/backends/skyrl_train/utils/ppo_utils.py:111-117 (K3, log-ratio ±20, K3 ±10), :1291, :1331 (÷ std "
        "+ 1e-6); workers/worker.py:970-980 (the KL loss path-wise)",
        "k3-loss", "group_std", 5, 0.001, clamp=10.0,
        note="the only framework read whose default turns the KL on; skyrl_train to 0.4.0 computed it without "
        "gradient (docs/pitfalls.md)",
        is_default=True,
    ),
    "skyrl-k2-proposal": Preset(
        "SkyRL", "0.3.0 + PR 1445",
        "PR 1445 (open, 'Change default KL estimator to k2'): kl_estimator_type default k2; otherwise skyrl-0.3's "
        "defaults",
        "k2-loss", "group_std", 5, 0.001,
        status="proposal",
        note="a proposal, in no release; the fork MarinSkyRL ships the same gradient as k3_unbiased_gradient",
    ),
    "slime-0.3-default": Preset(
        "slime", "0.3.1",
        "slime/utils/arguments.py:923-928 --kl-loss-type k1, :970 --use-kl-loss False, :973 --kl-loss-coef 0.0, :689 "
        "--n-samples-per-prompt 1, :995-999 GRPO std normalisation on; slime/ray/rollout.py:700-706 (− group mean, "
        "÷ Bessel std + 1e-6); slime/utils/ppo_utils.py (K1 unclamped, path-wise)",
        "k1-loss", "group_std", 8, 0.0,
        note="with --use-kl-loss and a coefficient",
        is_default=True,
        modelled="its default `--n-samples-per-prompt` 1 has no group; modelled: G = 8, as 35 of its 42 shipped "
        "scripts",
    ),
    "slime-0.3-scripts": Preset(
        "slime", "0.3.1",
        "scripts/*.sh, examples/**/*.sh: 34 of 38 set --kl-loss-type low_var_kl, 33 of them --kl-loss-coef 0, one "
        "0.001 (examples/search-r1/run_qwen2.5_3B.sh:73); slime/utils/ppo_utils.py (low_var_kl: K3 clamped ±10)",
        "k3-loss", "group_std", 8, 0.0, clamp=10.0, recipe_beta=0.001,
        note="the scripts' KL loss at the one coefficient a script sets",
    ),
    "roll-0.3-kl-loss": Preset(
        "ROLL", "0.3.0",
        "roll/configs/base_config.py:568 use_kl_loss False, :569 kl_loss_coef 0; roll/utils/functionals.py:198-202 "
        "(K3 ±10 whatever kl_penalty says), :364-370 (masked_whiten); roll/pipeline/rlvr/actor_worker.py:55-57, "
        ":106-107 (path-wise); examples/qwen2.5-7B-rlvr_megatron/rlvr_config.yaml:43 G 8, :45 reinforce, :72 "
        "whiten_advantages",
        "k3-loss", "whiten", 8, 0.0, clamp=10.0,
        note="its RLVR example's advantage clip at ±2 and difficulty mask are left out",
        is_default=True,
    ),
}  # fmt: skip

# What each framework offers beyond its preset, in kl.py's grammar, with the switch that gives it (read at the tags
# of the presets above; docs/record/framework-kl.md). A framework absent here offers nothing else that was read.
OFFERS = {
    "TRL": [],  # GRPOTrainer's KL is K3 in the loss only (a request for a reward KL, TRL 4967, was closed)
    "verl": [
        (
            "k1-reward",
            "algorithm.use_kl_in_reward=True, algorithm.kl_penalty=kl, actor_rollout_ref.actor.use_kl_loss=False",
        ),
        ("k1-both", "use_kl_in_reward=True, kl_penalty=kl, actor.use_kl_loss=True, actor.kl_loss_type=kl"),
        ("k3-loss", "actor.use_kl_loss=True, actor.kl_loss_type=low_var_kl"),
    ],
    "OpenRLHF": [
        ("k1-advantage", "the default KL (--algo.kl.estimator k1, without --algo.kl.use_loss)"),
        ("k3-loss", "--algo.kl.use_loss --algo.kl.estimator k3"),
    ],
    "AReaL": [("k1-advantage", "kl_ctl > 0, kl_estimator k1 (the defaults)")],
    "SkyRL": [
        ("k1-reward", "trainer.algorithm.use_kl_in_reward=true, use_kl_loss=false, kl_estimator_type=k1"),
        ("k3-loss", "the default: use_kl_loss=true, kl_estimator_type=k3"),
    ],
    "slime": [("k1-loss", "--use-kl-loss --kl-loss-type k1"), ("k3-loss", "--use-kl-loss --kl-loss-type low_var_kl")],
    "NeMo-RL": [("k3-loss-score", "loss_fn.reference_policy_kl_type k3 (the default from 0.7.0)")],
    "ROLL": [("k3-loss", "use_kl_loss: true")],
}


# Which estimators each framework clamps at ±10 (the presets' sources): every one (OpenRLHF's and AReaL's
# compute_approx_kl, NeMo-RL's calculate_kl output clamp: docs/record/framework-kl.md), or K3 only (verl's and SkyRL's
# low_var_kl/k3, slime's low_var_kl, ROLL's K3).
CLAMPED = {"OpenRLHF": kl.ESTIMATORS, "AReaL": kl.ESTIMATORS, "NeMo-RL": kl.ESTIMATORS, "verl": ("k3",),
           "SkyRL": ("k3",), "slime": ("k3",), "ROLL": ("k3",), "TRL": ()}  # fmt: skip
# The key that sets β, by where the KL goes ("*": wherever it goes), as each framework spells it: verl's Hydra keys and
# AReaL's, NeMo-RL's and SkyRL's config paths, OpenRLHF's and slime's flags, TRL's GRPOConfig field (the presets'
# sources; SkyRL's reward KL takes kl_loss_coef too, ppo_utils.get_kl_controller: docs/record/framework-kl.md).
BETA_KEYS = {
    "TRL": {"*": "beta"},
    "verl": {"reward": "algorithm.kl_ctrl.kl_coef", "loss": "actor_rollout_ref.actor.kl_loss_coef"},
    "OpenRLHF": {"*": "--algo.kl.init_coef"},
    "AReaL": {"*": "actor.kl_ctl"},
    "NeMo-RL": {"*": "loss_fn.reference_policy_kl_penalty"},
    "SkyRL": {"*": "trainer.algorithm.kl_loss_coef"},
    "slime": {"*": "--kl-loss-coef"},
    "ROLL": {"*": "kl_loss_coef"},
}
# The switch that turns the advantage's ÷ std off (kl.ADVANTAGES "mean": R − the group's mean only), where it was read
# (SkyRL's: its ppo_base_config.yaml, "set to false to disable normalization by std in GRPO").
STD_OFF = {"verl": "algorithm.norm_adv_by_std_in_grpo=False", "TRL": "scale_rewards='none'",
           "SkyRL": "trainer.algorithm.grpo_norm_by_std=false"}  # fmt: skip
# Why the KL is off by default where β alone does not say it: switches off, with a coefficient that is not 0 once on
# (the presets' sources). Elsewhere off means β = 0.
OFF_BY_SWITCH = {"verl": "use_kl_loss and use_kl_in_reward false"}
# Where a framework's own trainer offers no unbiased KL but klstudy's subclass of it does: (KL configuration,
# advantages, how to ask for it). KLTrainer needs TRL 1.16.0 exactly (docs/tutorial-kltrainer.md).
SUBCLASS = {"TRL": ("k1-reward", "rloo", "kl_estimator='k1', kl_placement='reward'")}


def clamp_of(framework: str, config: str) -> float | None:
    """The clamp ``framework`` puts on the estimator of ``config`` (kl.py's grammar)."""
    return 10.0 if kl.KLSpec.from_name(config, 1.0).estimator in CLAMPED.get(framework, ()) else None


def beta_key(framework: str, config: str) -> str:
    """The key that sets β of ``config`` (kl.py's grammar) in ``framework``; verl's 'both' needs its two, set equal."""
    keys = BETA_KEYS[framework]
    placement = kl.KLSpec.from_name(config, 1.0).placement
    if "*" in keys:
        return keys["*"]
    if placement == "both":
        return f"{keys['reward']} = {keys['loss']}"
    return keys[placement]


def presets_of(section: dict) -> dict:
    """{name: the preset's fields}: the shipped presets config ``toy.atlas.presets`` names (frameworks.py), then
    ``extra_presets``, a user's own (each checked as a shipped one is)."""
    shipped = {name: PRESETS[name].as_row() for name in section.get("presets", [])}
    return shipped | {name: Preset(**fields).as_row() for name, fields in section.get("extra_presets", {}).items()}
