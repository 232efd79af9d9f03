"""kl.py's model of each framework's KL setup, checked against the framework's own code (issue #71, item 4).

Each framework's KL term and advantage function is imported from its pinned PyPI release (envs/frameworks.txt:
verl, OpenRLHF, SkyRL, AReaL, TRL) and compared with kl.py's model of that preset on random float64 inputs: the
value, and the gradient with respect to the policy's log-probs (torch.autograd), to 1e-9 relative to max(1, |x|).
OpenRLHF and AReaL compute their KL estimators in float32 whatever the input (``log_probs.float()``); those
comparisons hold to float32's precision instead (FLOAT32). What each test reads in the framework's code, with
file:line in the wheel: docs/record/framework-kl.md. How to run them: docs/frameworks.md.

The releases live in an environment of their own (`make frameworks-env`), not the project's; `make test-frameworks`
runs this file there. Modules the frameworks import but the tested functions never call are stood in for
(tests/framework_stubs: ray, deepspeed, vLLM, ...). Elsewhere this file is skipped.

Where kl.py and a framework disagree, the test says so with a strict xfail: it fails the day they agree.
"""

from __future__ import annotations

import ast
import textwrap
from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from framework_stubs import FRAMEWORKS, release_module

from klstudy import kl
from klstudy.frameworks import PRESETS

if not FRAMEWORKS.is_dir():
    pytest.skip(
        f"the frameworks' pinned releases are installed only in the frameworks environment ({FRAMEWORKS} is absent): "
        "`make test-frameworks` runs these tests",
        allow_module_level=True,
    )

# The frameworks warn at import about what a CPU lacks (no GPU, no Megatron engine, deprecated torch.jit): noise here.
pytestmark = [
    pytest.mark.frameworks,
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

F64 = torch.float64
FLOAT64 = 1e-9  # the issue's tolerance, relative to max(1, |expected|)
# float32 results from float64 inputs: the cast rounds each log-prob by up to 2^-24 of itself (|log p| ≤ 25 here, so
# ≤ 1.5e-6 on the log-ratio), and K3's slope inside its clamp is at most 13: 2e-5 on the value; so 2^-14 ≈ 6e-5.
FLOAT32 = 2.0**-14
# TRL's nanstd takes Bessel's factor n/(n − 1) from integer counts, which torch divides in float32 (trl/trainer/utils.py
# :876-879 in 1.9.2): from float64 rewards its standard deviation is float64 but for that factor's rounding, 2^-24.
TRL_STD = 2.0**-22
# The estimators each framework clamps at ±10 (kl.KLSpec.clamp): verl (low_var_kl) and SkyRL K3 alone, OpenRLHF and
# AReaL every one; TRL none.
CLAMPED = {"verl": ("k3",), "skyrl": ("k3",), "openrlhf": kl.ESTIMATORS, "areal": kl.ESTIMATORS}


def clamp(framework, estimator):
    """The clamp of kl.py's model of ``framework``'s ``estimator``: 10, or None."""
    return 10.0 if estimator in CLAMPED.get(framework, ()) else None


SHAPES = [(4, 7), (8, 13), (6, 1)]
SEEDS = [0, 1]


def assert_agree(actual, expected, tolerance, what=""):
    """|actual − expected| ≤ tolerance·max(1, |expected|) everywhere: absolute for small values, relative beyond."""
    actual, expected = actual.detach().to(F64), expected.detach().to(F64)
    assert actual.shape == expected.shape, f"{what}: shapes {tuple(actual.shape)} and {tuple(expected.shape)}"
    excess = (actual - expected).abs() - tolerance * expected.abs().clamp(min=1.0)
    worst = int(excess.flatten().argmax())
    assert excess.max() <= 0, (
        f"{what}: they differ by {(actual - expected).abs().flatten()[worst]:.3g} where kl.py has "
        f"{expected.flatten()[worst]:.6g} and the framework {actual.flatten()[worst]:.6g}"
    )


def log_probs(seed, shape, far=False):
    """Log-probs of sampled tokens under the policy (a leaf, for its gradient) and the reference, and a right-padded
    response mask with one full row. Log-ratios are N(0, 1.5²), so K3's clamp acts (below −2.6); ``far`` puts a fifth
    of the tokens (at least one) 10 to 25 nats apart, where K1 and K2 pass 10 and verl's ±20 clamp of the log-ratio
    acts."""
    generator = torch.Generator().manual_seed(seed)
    log_ratio = 1.5 * torch.randn(shape, generator=generator, dtype=F64)
    if far:
        apart = torch.rand(shape, generator=generator, dtype=F64) < 0.2
        apart[(0,) * len(shape)] = True  # at least one, on the first row, which is never padded
        sign = torch.where(torch.rand(shape, generator=generator, dtype=F64) < 0.5, -1.0, 1.0)
        distance = 10 + 15 * torch.rand(shape, generator=generator, dtype=F64)
        log_ratio = torch.where(apart, sign * distance, log_ratio)
    base = -3 * torch.rand(shape, generator=generator, dtype=F64)
    logp = (base + log_ratio.clamp(max=0)).requires_grad_()
    ref_logp = base - log_ratio.clamp(min=0)
    lengths = torch.randint(1, shape[-1] + 1, shape[:-1], generator=generator)
    lengths[0] = shape[-1]
    mask = (torch.arange(shape[-1]) < lengths.unsqueeze(-1)).to(F64)
    return logp, ref_logp, mask


def task_rewards(seed, groups, group_size):
    """Rewards (groups, G), each group with its own spread, down to 1e-3, so that an epsilon added to the spread
    shows (1e-6 against 1e-9 moves an advantage by 1e-3 relative there)."""
    generator = torch.Generator().manual_seed(1000 + seed)
    scale = 10 ** (-3 * torch.rand(groups, 1, generator=generator, dtype=F64))
    return torch.randn(groups, group_size, generator=generator, dtype=F64) * scale


def gradient(value, logp):
    """d Σ value / d logp."""
    (grad,) = torch.autograd.grad(value.sum(), logp, retain_graph=True, allow_unused=True)
    return torch.zeros_like(logp) if grad is None else grad


def loss_term(name, logp, ref_logp, mask, framework=None, old_logp=None):
    """kl.py's per-token loss term of configuration ``name`` at β = 1, with ``framework``'s clamp."""
    spec = kl.KLSpec.from_name(name, 1.0, clamp=clamp(framework, name.partition("-")[0]))
    return kl.loss_penalty(logp, ref_logp, mask, spec, old_logp=old_logp)


def check_term(framework_term, kl_term, logp, mask, tolerance, what):
    """The framework's per-token term and kl.py's agree on the response tokens, in value and in gradient."""
    assert_agree(framework_term * mask, kl_term, tolerance, f"{what}: value")
    assert_agree(gradient(framework_term * mask, logp), gradient(kl_term, logp), tolerance, f"{what}: gradient")


# ---------------------------------------------------------------------------------------------------------- verl

VERL = "verl-0.9.0"
# verl's kl_penalty names (core_algos.py:2187-2250) and kl.py's model of each; +: straight-through, kl.py's st.
VERL_KL = {
    "kl": "k1-loss",
    "k1": "k1-loss",
    "mse": "k2-loss",
    "k2": "k2-loss",
    "low_var_kl": "k3-loss",
    "k3": "k3-loss",
    "k1+": "k1-loss-st",
    "k2+": "k2-loss-st",
    "k3+": "k3-loss-st",
}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", VERL_KL)
def test_verl_kl_penalty(name, shape, seed):
    """kl_penalty, the KL term of verl's KL loss (workers/utils/losses.py:131-140) and of its reward."""
    core_algos = release_module(VERL, "verl.trainer.ppo.core_algos")
    logp, ref_logp, mask = log_probs(seed, shape, far=True)
    mine = loss_term(VERL_KL[name], logp, ref_logp, mask, "verl")
    check_term(core_algos.kl_penalty(logp, ref_logp, name), mine, logp, mask, FLOAT64, f"verl {name}")


def verl_groups(seed, groups, group_size):
    """Rewards (groups, G) and verl's uid per response, the groups interleaved as a shuffled batch would have them."""
    rewards = task_rewards(seed, groups, group_size)
    order = torch.randperm(groups * group_size, generator=torch.Generator().manual_seed(seed))
    index = np.array([f"prompt-{i // group_size}" for i in range(groups * group_size)], dtype=object)[order.numpy()]
    return rewards, order, index


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("norm_by_std, advantage", [(True, "group_std"), (False, "mean")])
def test_verl_grpo_advantage(norm_by_std, advantage, seed):
    """compute_grpo_outcome_advantage (core_algos.py:268-331): per uid, ÷ (Bessel std + 1e-6), or the mean alone."""
    core_algos = release_module(VERL, "verl.trainer.ppo.core_algos")
    rewards, order, index = verl_groups(seed, groups=5, group_size=4)
    _, _, mask = log_probs(seed, (20, 6))
    token_rewards = torch.zeros(20, 6, dtype=F64)
    token_rewards[:, 0] = rewards.flatten()[order]
    theirs, _ = core_algos.compute_grpo_outcome_advantage(
        token_rewards, mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=norm_by_std
    )
    mine = advantages_of(advantage, rewards, epsilon=1e-6).flatten()[order]
    assert_agree(theirs, mine.unsqueeze(-1) * mask, FLOAT64, f"verl GRPO, norm_adv_by_std_in_grpo={norm_by_std}")


def advantages_of(name, rewards, epsilon):
    """kl.ADVANTAGES[name] of rewards (..., G), with the framework's epsilon where the normalisation divides by a
    standard deviation."""
    if name.endswith("std"):
        return kl.ADVANTAGES[name](rewards, epsilon=epsilon)
    return kl.ADVANTAGES[name](rewards)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("norm_by_std, advantage", [(True, "group_std"), (False, "mean")])
@pytest.mark.parametrize("name, estimator", [("kl", "k1"), ("mse", "k2"), ("low_var_kl", "k3")])
def test_verl_kl_in_the_reward(name, estimator, norm_by_std, advantage, seed):
    """use_kl_in_reward: apply_kl_penalty (ray_trainer.py:78-117) on verl's own DataProto, then GRPO's advantage:
    kl.py's <estimator>-reward, the sequence's −β·Σ K_t before the per-group normalisation."""
    core_algos = release_module(VERL, "verl.trainer.ppo.core_algos")
    ray_trainer = release_module(VERL, "verl.trainer.ppo.ray_trainer")
    beta, (groups, group_size, length) = 0.05, (5, 4, 9)
    rewards, order, index = verl_groups(seed, groups, group_size)
    old_logp, ref_logp, mask = log_probs(seed, (groups * group_size, length), far=True)
    scores = torch.zeros_like(mask)
    scores[torch.arange(len(mask)), mask.sum(-1).long() - 1] = rewards.flatten()[order]  # on the last token
    data = ray_trainer.DataProto.from_dict(
        tensors={
            "response_mask": mask,
            "token_level_scores": scores,
            "old_log_probs": old_logp.detach(),
            "ref_log_prob": ref_logp,
        }
    )
    data, _ = ray_trainer.apply_kl_penalty(data, core_algos.FixedKLController(beta), kl_penalty=name)
    theirs, _ = core_algos.compute_grpo_outcome_advantage(
        data.batch["token_level_rewards"], mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=norm_by_std
    )
    spec = kl.KLSpec.from_name(f"{estimator}-reward", beta, clamp=clamp("verl", estimator))
    unshuffle = torch.argsort(order)
    grouped = (t[unshuffle].view(groups, group_size, -1) for t in (old_logp, ref_logp, mask))
    shaped = kl.shaped_rewards(rewards, *grouped, spec)
    mine = advantages_of(advantage, shaped, epsilon=1e-6).flatten()[order]
    assert_agree(theirs, mine.unsqueeze(-1) * mask, FLOAT64, f"verl {name} in the reward")


# ------------------------------------------------------------------------------------------------------ OpenRLHF

OPENRLHF = "openrlhf-0.11.0"  # the presets' release
OPENRLHF_ISST = "openrlhf-0.11.2"  # the newest, with --algo.kl.unbiased_gradient (since 0.11.1)
OPENRLHF_RELEASES = [OPENRLHF, OPENRLHF_ISST]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("estimator", kl.ESTIMATORS)
@pytest.mark.parametrize("release", OPENRLHF_RELEASES)
def test_openrlhf_kl_estimator_and_kl_loss(release, estimator, shape, seed):
    """compute_approx_kl (models/utils.py:64-95), per token and as the KL loss of ppo_actor.py:319-337:
    aggregate_loss(compute_approx_kl(π_θ, π_ref)) × kl_ctl, path-wise. float32 inside (log_probs.float())."""
    utils = release_module(release, "openrlhf.models.utils")
    loss = release_module(release, "openrlhf.models.loss")
    logp, ref_logp, mask = log_probs(seed, shape, far=True)
    theirs = utils.compute_approx_kl(logp, ref_logp, kl_estimator=estimator)
    assert theirs.dtype == torch.float32
    mine = loss_term(f"{estimator}-loss", logp, ref_logp, mask, "openrlhf")
    check_term(theirs, mine, logp, mask, FLOAT32, f"OpenRLHF {estimator}")
    beta = 0.01
    their_loss = loss.aggregate_loss(theirs, mask) * beta
    my_loss = beta * mine.sum() / mask.sum()
    assert_agree(their_loss, my_loss, FLOAT32, "OpenRLHF KL loss")
    assert_agree(gradient(their_loss, logp), gradient(my_loss, logp), FLOAT32, "OpenRLHF KL loss: gradient")


def openrlhf_advantages(release, estimator, rewards, token_kl, mask, beta, seed=0):
    """OpenRLHF's RemoteExperienceMaker.compute_advantages_and_returns (experience_maker.py:237-330), on a maker built
    without its __init__ (what the method reads: the CLI's arguments at their defaults, the KL coefficient), over the
    batch split into two Experiences in shuffled order, as a rollout delivers them. ``rewards`` (groups, G);
    ``token_kl`` and ``mask`` (groups·G, T) in prompt order. Returns the per-token advantages in prompt order."""
    maker = release_module(release, "openrlhf.trainer.ppo_utils.experience_maker")
    args = SimpleNamespace(
        algo=SimpleNamespace(advantage=SimpleNamespace(estimator=estimator, gamma=1.0, no_std_norm=False)),
        rollout=SimpleNamespace(n_samples_per_prompt=rewards.shape[-1]),
        reward=SimpleNamespace(clip_range=(-10, 10), overlong_buffer_len=None, stop_properly_penalty_coef=None),
    )
    stand_in = maker.RemoteExperienceMaker.__new__(maker.RemoteExperienceMaker)  # its __init__ takes ray actors
    stand_in.strategy, stand_in.args = SimpleNamespace(args=args), args
    stand_in.kl_ctl, stand_in.advantage_estimator = SimpleNamespace(value=beta), estimator
    order = torch.randperm(rewards.numel(), generator=torch.Generator().manual_seed(seed))
    experiences = [
        maker.Experience(
            index=part.tolist(),
            rewards=rewards.flatten()[part],
            kl=token_kl[part],
            action_mask=mask[part].bool(),
            info={},
        )
        for part in order.chunk(2)
    ]
    experiences = stand_in.compute_advantages_and_returns(experiences)
    advantages = torch.empty_like(mask, dtype=experiences[0].advantages.dtype)
    advantages[order] = torch.cat([experience.advantages for experience in experiences])
    return advantages


# OpenRLHF's advantage estimators (experience_maker.py:264-270, whitened after the KL at :315-328 for
# reinforce_baseline and reinforce) and kl.py's normalisation of each, with OpenRLHF's ε where it divides by a std.
OPENRLHF_ADVANTAGES = [
    ("rloo", "rloo", None),
    ("group_norm", "group_std", 1e-9),
    ("dr_grpo", "mean", None),
    ("reinforce_baseline", "group_whiten", None),
    ("reinforce", "whiten", None),
]


def kl_token_advantages(normalisation, epsilon, rewards, penalty, mask):
    """kl.token_advantages; with a framework's ε for a std normalisation, which token_advantages does not take (its
    normalisations divide by the std + kl.STD_EPSILON, TRL's 1e-4), the same difference by hand."""
    if epsilon is None:
        return kl.token_advantages(rewards, penalty, mask, normalisation)
    return advantages_of(normalisation, rewards, epsilon).unsqueeze(-1) - penalty


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kl_estimator", [None, *kl.ESTIMATORS])
@pytest.mark.parametrize("estimator, normalisation, epsilon", OPENRLHF_ADVANTAGES)
@pytest.mark.parametrize("release", OPENRLHF_RELEASES)
def test_openrlhf_advantages(release, estimator, normalisation, epsilon, kl_estimator, seed):
    """The task reward normalised in its group, clamped at ±10 (:281) and put on the last token, −β·K per token from
    the rollout's log-probs (compute_approx_kl as make_experience calls it, :205-210; compute_reward,
    models/utils.py:98-126), summed to go (γ = 1, :302-307, 380-411), and whitened over the batch's tokens for
    reinforce_baseline and reinforce: kl.py's <estimator>-advantage and token_advantages. Without a KL
    (--algo.kl.use_loss: the KL is zeros, :212-214) everything is float64; the KL (compute_approx_kl) and the
    whitening (.float(), :316) are float32."""
    utils = release_module(release, "openrlhf.models.utils")
    groups, group_size, length, beta = 5, 4, 9, 0.05
    rewards = task_rewards(seed, groups, group_size)
    old_logp, ref_logp, mask = log_probs(seed, (groups * group_size, length), far=True)
    old_logp = old_logp.detach()
    spec = kl.KLSpec.from_name(f"{kl_estimator or 'k1'}-advantage", beta if kl_estimator else 0.0, clamp=10.0)
    if kl_estimator is None:
        token_kl = torch.zeros_like(old_logp)
    else:
        token_kl = utils.compute_approx_kl(old_logp, ref_logp, kl_estimator=kl_estimator)
    theirs = openrlhf_advantages(release, estimator, rewards, token_kl, mask, beta, seed=seed)
    grouped = [t.view(groups, group_size, length) for t in (old_logp, ref_logp, mask)]
    penalty = kl.advantage_penalty(*grouped, spec)
    mine = kl_token_advantages(normalisation, epsilon, rewards, penalty, grouped[-1]).flatten(0, 1)
    centred = advantages_of(kl.WHITENED.get(normalisation, normalisation), rewards, epsilon)
    assert centred.abs().max() < 10, "OpenRLHF clamps the normalised reward at ±10 there; kl.py does not"
    whitened = normalisation in kl.WHITENED
    tolerance = FLOAT32 if kl_estimator or whitened else FLOAT64
    assert_agree(theirs * mask, mine * mask, tolerance, f"OpenRLHF {estimator}, KL {kl_estimator} in the reward")


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("estimator", kl.ESTIMATORS)
@pytest.mark.parametrize(
    "drift",
    [
        pytest.param(None, id="on-policy"),
        pytest.param(0.5, id="off-policy"),
        pytest.param(4.0, id="far-off-policy"),  # the weight π_θ/π_old past OpenRLHF's cap at 10 (kl.ISST_WEIGHT_CAP)
    ],
)
def test_openrlhf_unbiased_gradient_kl_loss(estimator, drift, shape, seed):
    """--algo.kl.unbiased_gradient (OpenRLHF 0.11.2, models/utils.py:69-128): the estimator's value, the gradient
    sg[w]·K1·∇log π with w = π_θ/π_old: kl.py's isst. ``drift``: the spread of log π_θ − log π_old (none on-policy);
    at 0.5 every w is below 10, at 4 some pass it."""
    utils = release_module(OPENRLHF_ISST, "openrlhf.models.utils")
    logp, ref_logp, mask = log_probs(seed, shape, far=True)
    old_logp = None
    if drift is not None:
        generator = torch.Generator().manual_seed(seed + 7)
        old_logp = logp.detach() - drift * torch.randn(shape, generator=generator, dtype=F64).abs()
        if drift > 1:
            old_logp[(0,) * len(shape)] = logp.detach()[(0,) * len(shape)] - 3  # w = e³ > 10 on a token in the mask
    theirs = utils.compute_approx_kl(
        logp, ref_logp, log_probs_old=old_logp, kl_estimator=estimator, unbiased_gradient=True
    )
    mine = loss_term(f"{estimator}-loss-isst", logp, ref_logp, mask, "openrlhf", old_logp=old_logp)
    check_term(theirs, mine, logp, mask, FLOAT32, f"OpenRLHF unbiased_gradient {estimator}")


# --------------------------------------------------------------------------------------------------------- SkyRL

SKYRL_PPO_UTILS = "skyrl.backends.skyrl_train.utils.ppo_utils"
SKYRL_TORCH_UTILS = "skyrl.backends.skyrl_train.utils.torch_utils"


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("estimator", kl.ESTIMATORS)
@pytest.mark.parametrize("release", ["skyrl-0.2.0", "skyrl-0.3.0"])
def test_skyrl_kl_loss(release, estimator, shape, seed):
    """compute_approx_kl (ppo_utils.py:88-125 in 0.3.0) and the worker's KL loss (workers/worker.py:970-980):
    masked_mean(compute_approx_kl(π_θ, π_ref, mask), mask, dim=-1).mean() × kl_loss_coef, path-wise."""
    ppo_utils = release_module(release, SKYRL_PPO_UTILS)
    torch_utils = release_module(release, SKYRL_TORCH_UTILS)
    logp, ref_logp, mask = log_probs(seed, shape, far=True)
    theirs = ppo_utils.compute_approx_kl(logp, ref_logp, loss_mask=mask, kl_estimator_type=estimator)
    mine = loss_term(f"{estimator}-loss", logp, ref_logp, mask, "skyrl")
    check_term(theirs, mine, logp, mask, FLOAT64, f"{release} {estimator}")
    beta = 0.001
    their_loss = torch_utils.masked_mean(theirs, mask, dim=-1).mean() * beta
    my_loss = beta * (mine.sum(-1) / mask.sum(-1)).mean()
    assert_agree(their_loss, my_loss, FLOAT64, f"{release} KL loss")
    assert_agree(gradient(their_loss, logp), gradient(my_loss, logp), FLOAT64, f"{release} KL loss: gradient")


@pytest.mark.parametrize("estimator", kl.ESTIMATORS)
def test_skyrl_0_1_kl_loss_has_no_gradient(estimator):
    """skyrl 0.1.0 decorates compute_approx_kl with torch.no_grad (ppo_utils.py:87): the KL loss has kl.py's value
    and no gradient at all (docs/pitfalls.md, "A KL loss with no gradient"); 0.2.0 and 0.3.0 have it (above)."""
    ppo_utils = release_module("skyrl-0.1.0", SKYRL_PPO_UTILS)
    logp, ref_logp, mask = log_probs(0, (8, 13), far=True)
    theirs = ppo_utils.compute_approx_kl(logp, ref_logp, loss_mask=mask, kl_estimator_type=estimator)
    mine = loss_term(f"{estimator}-loss", logp, ref_logp, mask, "skyrl")
    assert_agree(theirs, mine, FLOAT64, f"skyrl 0.1.0 {estimator}: value")
    assert not theirs.requires_grad and gradient(mine, logp).abs().sum() > 0


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("norm_by_std, advantage", [(True, "group_std"), (False, "mean")])
def test_skyrl_grpo_advantage(norm_by_std, advantage, seed):
    """compute_grpo_outcome_advantage (ppo_utils.py:1287-1336 in 0.3.0): ÷ (Bessel std + 1e-6) with
    grpo_norm_by_std, the group mean alone without."""
    ppo_utils = release_module("skyrl-0.3.0", SKYRL_PPO_UTILS)
    rewards, order, index = verl_groups(seed, groups=5, group_size=4)
    _, _, mask = log_probs(seed, (20, 6))
    token_rewards = torch.zeros(20, 6, dtype=F64)
    token_rewards[:, 0] = rewards.flatten()[order]
    theirs, _ = ppo_utils.compute_grpo_outcome_advantage(
        token_rewards, mask, index, epsilon=1e-6, grpo_norm_by_std=norm_by_std
    )
    mine = advantages_of(advantage, rewards, epsilon=1e-6).flatten()[order]
    assert_agree(theirs, mine.unsqueeze(-1) * mask, FLOAT64, f"SkyRL GRPO, grpo_norm_by_std={norm_by_std}")


# --------------------------------------------------------------------------------------------------------- AReaL

AREAL = "areal-1.0.4"


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("estimator", kl.ESTIMATORS)
def test_areal_kl_estimator(estimator, shape, seed):
    """KLEstimator (areal/utils/data.py:1598-1656): every estimator in float32 (.float()) and clamped at ±10."""
    data = release_module(AREAL, "areal.utils.data")
    logp, ref_logp, mask = log_probs(seed, shape, far=True)
    theirs = data.KLEstimator(estimator)(logp, ref_logp)
    assert theirs.dtype == torch.float32
    mine = loss_term(f"{estimator}-loss", logp, ref_logp, mask, "areal")
    check_term(theirs, mine, logp, mask, FLOAT32, f"AReaL {estimator}")


def areal_advantages(rewards, logp, ref_logp, mask, kl_ctl, estimator, reward_norm, prompt=3):
    """AReaL's PPOActor._compute_advantages (areal/trainer/ppo/actor.py:145-249), on a PPOActor built by its own
    __init__ from a PPOActorConfig at its defaults but for ``kl_ctl``, ``kl_estimator`` and ``reward_norm`` (no
    engine: the method never calls it). A batch of ``prompt`` prompt tokens then the responses, right-padded; the
    engine's log-probs are aligned with the tokens, the reference's with the next token (actor.py:188, 192), as AReaL
    has them. Returns the per-token advantages of the response tokens, (B, T)."""
    actor = release_module(AREAL, "areal.trainer.ppo.actor")
    cli_args = release_module(AREAL, "areal.api.cli_args")
    config = cli_args.PPOActorConfig(
        experiment_name="conformance", trial_name="0", kl_ctl=kl_ctl, kl_estimator=estimator, reward_norm=reward_norm
    )
    ppo_actor = actor.PPOActor(config, engine=None)
    batch, length = mask.shape
    response = slice(prompt, prompt + length)
    lengths = prompt + mask.sum(-1).long()
    attention = (torch.arange(prompt + length) < lengths.unsqueeze(-1)).long()
    data = {
        "input_ids": torch.ones(batch, prompt + length, dtype=torch.long),
        "attention_mask": attention,
        "loss_mask": torch.zeros_like(attention),
        "logprobs": torch.zeros(batch, prompt + length, dtype=F64),
        "ref_logp": torch.zeros(batch, prompt + length, dtype=F64),
        "rewards": rewards.flatten().clone(),
    }
    data["loss_mask"][:, response] = mask.long()
    data["logprobs"][:, response] = logp.detach()
    data["ref_logp"][:, prompt - 1 : prompt - 1 + length] = ref_logp
    out = ppo_actor._compute_advantages(data)
    return out["advantages"][:, prompt - 1 : prompt - 1 + length] * mask


# AReaL's reward_norm (a NormConfig, group level, its default eps 1e-5) and kl.py's normalisation.
AREAL_NORMS = [
    ({"mean_level": "group", "std_level": "group"}, "group_std", 1e-5),
    ({"mean_level": "group", "std_level": None}, "mean", None),
    ({"mean_level": "group", "mean_leave1out": True, "std_level": None}, "rloo", None),
]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kl_estimator", [None, *kl.ESTIMATORS])
@pytest.mark.parametrize("norm, normalisation, epsilon", AREAL_NORMS, ids=[a for _, a, _ in AREAL_NORMS])
def test_areal_advantages(norm, normalisation, epsilon, kl_estimator, seed):
    """The task reward normalised in its group (reward_norm, actor.py:172-173) on the last response token, −kl_ctl·K
    per token from the rollout's log-probs (:202, every estimator ±10), summed to go by GAE with γ = λ = 1 and no
    values (:219-235): kl.py's <estimator>-advantage. kl_ctl = 0 without a KL. In float32 (the normalisation returns
    float32, areal/utils/data.py:1496; KLEstimator computes in float32)."""
    cli_args = release_module(AREAL, "areal.api.cli_args")
    groups, group_size, length, beta = 5, 4, 9, 0.1
    rewards = task_rewards(seed, groups, group_size)
    old_logp, ref_logp, mask = log_probs(seed, (groups * group_size, length), far=True)
    reward_norm = cli_args.NormConfig(**norm, group_size=group_size)
    kl_ctl = beta if kl_estimator else 0.0
    theirs = areal_advantages(rewards, old_logp, ref_logp, mask, kl_ctl, kl_estimator or "k1", reward_norm)
    spec = kl.KLSpec.from_name(f"{kl_estimator or 'k1'}-advantage", kl_ctl, clamp=10.0)
    grouped = [t.view(groups, group_size, length) for t in (old_logp, ref_logp, mask)]
    penalty = kl.advantage_penalty(*grouped, spec)
    mine = kl_token_advantages(normalisation, epsilon, rewards, penalty, grouped[-1]).flatten(0, 1)
    assert_agree(theirs, mine * mask, FLOAT32, f"AReaL reward_norm {norm}, KL {kl_estimator} in the reward")


# ----------------------------------------------------------------------------------------------------------- TRL

TRL_RELEASES = ["trl-1.9.2", "trl-1.16.0"]


class OneProcess:
    """The accelerator of one process: gathering and reducing return what they are given."""

    num_processes = 1
    sync_gradients = True

    def gather(self, tensor):
        return tensor

    gather_for_metrics = gather

    def reduce(self, tensor, reduction="sum"):
        return tensor


def trl_trainer(release, beta, use_bias_correction_kl, logp):
    """A GRPOTrainer of ``release`` built without its __init__ (which loads models), holding what _compute_loss reads:
    GRPOConfig's defaults for the loss (loss_type "dapo", token-level importance sampling, ε 0.2) but β and the flag;
    a model in eval mode (no gradient-accumulation scaling); and log-probs it returns for "the model's" tokens."""
    grpo = release_module(release, "trl.trainer.grpo_trainer")
    config = release_module(release, "trl.trainer.grpo_config").GRPOConfig
    defaults = {f.name: f.default for f in config.__dataclass_fields__.values()}
    trainer = grpo.GRPOTrainer.__new__(grpo.GRPOTrainer)
    trainer.args = SimpleNamespace(use_bias_correction_kl=use_bias_correction_kl, delta=defaults["delta"])
    trainer.beta, trainer.loss_type = beta, defaults["loss_type"]
    trainer.importance_sampling_level = defaults["importance_sampling_level"]
    trainer.epsilon_low = defaults["epsilon"]
    trainer.epsilon_high = defaults["epsilon_high"] if defaults["epsilon_high"] is not None else defaults["epsilon"]
    trainer.top_entropy_quantile, trainer.off_policy_mask_threshold = 1.0, None
    trainer.use_vllm, trainer.aux_loss_enabled, trainer._entropy_bonus_enabled = False, False, False
    trainer.model, trainer.accelerator = SimpleNamespace(training=False), OneProcess()
    trainer._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    trainer._get_per_token_logps_and_entropies = lambda *args, **kwargs: (logp, torch.zeros_like(logp), None)
    return trainer


def trl_per_token_kl(release, beta, use_bias_correction_kl, logp, ref_logp, mask, old_logp=None):
    """β × TRL's per-token KL term, as _compute_loss (grpo_trainer.py:2991-3263 in 1.9.2) adds it to the loss: with
    zero advantages the policy term is 0 in value and gradient, and with loss_type "dapo" the loss is
    Σ_t loss_t·mask_t / num_items_in_batch, so its derivative with respect to the mask is each token's term."""
    trainer = trl_trainer(release, beta, use_bias_correction_kl, logp)
    weights = mask.clone().requires_grad_()
    tokens = torch.ones_like(mask, dtype=torch.long)
    inputs = {
        "prompt_ids": tokens[:, :1],
        "prompt_mask": tokens[:, :1],
        "completion_ids": tokens,
        "completion_mask": weights,
        "advantages": torch.zeros(len(mask), dtype=F64),
        "ref_per_token_logps": ref_logp,
        "num_items_in_batch": torch.tensor(1.0, dtype=F64),
    }
    if old_logp is not None:
        inputs["old_per_token_logps"] = old_logp
    loss = trainer._compute_loss(None, inputs)
    (per_token,) = torch.autograd.grad(loss, weights, create_graph=True)
    return per_token


# (release, use_bias_correction_kl, kl.py's loss gradient): 1.9.2's default (False) is the paper's path-wise K3,
# 1.16.0's (True, since 1.10.0) multiplies it by π_θ/π_old, not detached: kl.py's ratio.
TRL_KL = [
    ("trl-1.9.2", False, "pathwise"),
    ("trl-1.9.2", True, "ratio"),
    ("trl-1.16.0", True, "ratio"),
    ("trl-1.16.0", False, "pathwise"),
]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("release, flag, loss_gradient", TRL_KL)
def test_trl_kl_term(release, flag, loss_gradient, shape, seed):
    """On-policy (no old log-probs: π_old = sg[π_θ], grpo_trainer.py:3036-3037), so ratio is score too. No clamp:
    tokens 25 nats apart have K3 up to e^25."""
    logp, ref_logp, mask = log_probs(seed, shape, far=True)
    beta = 0.04
    theirs = trl_per_token_kl(release, beta, flag, logp, ref_logp, mask)
    for name in {"pathwise": ["k3-loss"], "ratio": ["k3-loss-ratio", "k3-loss-score"]}[loss_gradient]:
        mine = kl.loss_penalty(logp, ref_logp, mask, kl.KLSpec.from_name(name, beta))
        check_term(theirs, mine, logp, mask, FLOAT64, f"{release} use_bias_correction_kl={flag} as {name}")


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("release", TRL_RELEASES)
def test_trl_kl_term_off_policy(release, seed):
    """With old log-probs (num_iterations > 1, or vLLM), the flag's ratio is π_θ/π_old: kl.py's ratio given
    old_logp."""
    logp, ref_logp, mask = log_probs(seed, (8, 13), far=True)
    old_logp = logp.detach() + 0.3 * torch.randn(8, 13, generator=torch.Generator().manual_seed(seed), dtype=F64)
    theirs = trl_per_token_kl(release, 0.04, True, logp, ref_logp, mask, old_logp=old_logp)
    spec = kl.KLSpec.from_name("k3-loss-ratio", 0.04)
    mine = kl.loss_penalty(logp, ref_logp, mask, spec, old_logp=old_logp)
    check_term(theirs, mine, logp, mask, FLOAT64, f"{release} off-policy ratio")


@pytest.mark.parametrize("release, default", [("trl-1.9.2", False), ("trl-1.16.0", True)])
def test_trl_use_bias_correction_kl_default(release, default):
    """GRPOConfig's default (grpo_config.py:962-963 in 1.9.2, 972-973 in 1.16.0): what each preset assumes."""
    config = release_module(release, "trl.trainer.grpo_config").GRPOConfig
    assert config.__dataclass_fields__["use_bias_correction_kl"].default is default
    assert config.__dataclass_fields__["scale_rewards"].default == "group"


def trl_advantage_block(release):
    """The statement of GRPOTrainer._generate_and_score_completions that turns rewards into advantages (the
    ``if self.multi_objective_aggregation == "sum_then_normalize":`` block, grpo_trainer.py:2681-2726 in 1.9.2),
    parsed from the installed file and compiled as written: the rest of the method generates and scores."""
    grpo = release_module(release, "trl.trainer.grpo_trainer")
    with open(grpo.__file__, encoding="utf-8") as file:
        lines = file.read().splitlines(keepends=True)
    method = next(
        node
        for node in ast.walk(ast.parse("".join(lines)))
        if isinstance(node, ast.FunctionDef) and node.name == "_generate_and_score_completions"
    )
    block = next(
        node for node in ast.walk(method) if isinstance(node, ast.If) and "sum_then_normalize" in ast.unparse(node.test)
    )
    source = textwrap.dedent("".join(lines[block.lineno - 1 : block.end_lineno]))
    return compile(source, f"{grpo.__file__}:{block.lineno}", "exec"), grpo


# TRL's scale_rewards and kl.py's normalisation (TRL_SCALE_REWARDS), all with TRL's 1e-4 on the spread.
TRL_SCALES = [(scale, advantage) for advantage, scale in kl.TRL_SCALE_REWARDS.items()]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("scale_rewards, advantage", TRL_SCALES)
@pytest.mark.parametrize("release", TRL_RELEASES)
def test_trl_advantages(release, scale_rewards, advantage, seed):
    """One reward function, weight 1. TRL makes the rewards float32 (_calculate_rewards, grpo_trainer.py:1614 in
    1.9.2); given float64, the block computes in float64 but for the Bessel factor (TRL_STD)."""
    code, grpo = trl_advantage_block(release)
    groups, group_size = 5, 4
    rewards = task_rewards(seed, groups, group_size)
    trainer = SimpleNamespace(
        multi_objective_aggregation="sum_then_normalize", scale_rewards=scale_rewards, reward_weights=torch.ones(1)
    )
    unscorable = torch.zeros(groups * group_size, dtype=torch.bool)
    scope = dict(vars(grpo), self=trainer, rewards_per_func=rewards.reshape(-1, 1), device="cpu")
    scope.update(num_generations=group_size, unscorable_mask=unscorable)
    exec(code, scope)  # TRL's own statement, as compiled from its file
    mine = advantages_of(advantage, rewards, 1e-4).flatten()
    tolerance = FLOAT64 if scale_rewards == "none" else TRL_STD
    assert_agree(scope["advantages"], mine, tolerance, f"{release} scale_rewards={scale_rewards}")


# -------------------------------------------------------------------------------------------------------- polgrad

POLGRAD = "polgrad-0.2.1"


@pytest.mark.parametrize("name", VERL_KL)
def test_polgrad_vendored_verl_kl_penalty_is_the_wheels(name):
    """polgrad's copy of verl's kl_penalty (at verl 74a718a4) against verl 0.9.0's own: bitwise, value and gradient.
    The fallback where verl cannot be imported; here both can."""
    vendored = release_module(POLGRAD, "polgrad.conformance._vendor.verl_core_algos")
    core_algos = release_module(VERL, "verl.trainer.ppo.core_algos")
    logp, ref_logp, mask = log_probs(0, (8, 13), far=True)
    theirs, copied = core_algos.kl_penalty(logp, ref_logp, name), vendored.kl_penalty(logp, ref_logp, name)
    assert torch.equal(theirs, copied)
    assert torch.equal(gradient(theirs, logp), gradient(copied, logp))


@pytest.mark.parametrize("token_level_loss", [True, False])
def test_polgrad_vendored_openrlhf_aggregate_loss_is_the_wheels(token_level_loss):
    """polgrad's copy of OpenRLHF's aggregate_loss (at OpenRLHF bc71bb19) against OpenRLHF 0.11.0's own."""
    vendored = release_module(POLGRAD, "polgrad.conformance._vendor.openrlhf_loss")
    loss = release_module(OPENRLHF, "openrlhf.models.loss")
    logp, ref_logp, mask = log_probs(0, (8, 13))
    per_token = kl.token_kl(logp, ref_logp, "k3")
    theirs = loss.aggregate_loss(per_token, mask, token_level_loss=token_level_loss)
    copied = vendored.aggregate_loss(per_token, mask, token_level_loss=token_level_loss)
    assert torch.equal(theirs, copied)
    assert torch.equal(gradient(theirs, logp), gradient(copied, logp))


# -------------------------------------------------------------------------------------------------------- presets

# What the tests above check for each framework: kl.py's configurations (N: any estimator) and normalisations.
CHECKED = {
    "TRL": ({"k3-loss", "k3-loss-ratio", "k3-loss-score"}, {"group_std", "batch_std", "mean"}),
    "verl": ({"kN-loss", "kN-loss-st", "kN-reward"}, {"group_std", "mean"}),
    "OpenRLHF": ({"kN-loss", "kN-loss-isst", "kN-advantage"}, {"rloo", "group_std", "mean", "group_whiten", "whiten"}),
    "SkyRL": ({"kN-loss"}, {"group_std", "mean"}),
    "AReaL": ({"kN-loss", "kN-advantage"}, {"group_std", "mean", "rloo"}),
}


@pytest.mark.parametrize(
    "preset", [pytest.param(preset, id=name) for name, preset in PRESETS.items() if preset.framework in CHECKED]
)
def test_each_preset_is_a_setting_checked_here(preset):
    """The atlas's presets (klstudy.frameworks) of the frameworks checked here are configurations, clamps and
    normalisations the tests above compare with the framework's code (ε aside: the presets' notes say so)."""
    configurations, normalisations = CHECKED[preset.framework]
    spec = kl.KLSpec.from_name(preset.kl, 1.0, clamp=preset.clamp)
    assert preset.kl in configurations or preset.kl.replace(spec.estimator, "kN", 1) in configurations
    assert preset.normalisation in normalisations
    assert preset.clamp == clamp(preset.framework.lower(), spec.estimator)
