"""KL estimators and where they go in the policy-gradient objective: the paper's Table 1, written once.

Every part of klstudy that touches the KL penalty (the toy model of §3.3, the RL trainer, the tests that
compare both with TRL) imports these functions; none writes its own.

Notation (paper §3). For token t of a response sampled from the policy,

    log_ratio_t = log π_θ(y_t | x, y_<t) − log π_ref(y_t | x, y_<t)        (= −log r_t in the paper)

    K1_t = log_ratio_t                       naive estimator; E[Σ_t K1_t] = KL(π_θ ‖ π_ref)
    K2_t = ½ · log_ratio_t²                  squared log-ratio; biased for the KL value
    K3_t = exp(−log_ratio_t) − 1 + log_ratio_t   Schulman's estimator; unbiased and ≥ 0

Placement (eqs. 7–9). With sequence estimate K = Σ_t K_t (masked), task reward R and baseline b:

    reward: A = R − β·sg[K] − b          the score-function term  β·K·∇log π_θ(y)        (eq. 8)
    loss:   L = L_pg + β·Σ_t K_t          the path-wise term       β·Σ_t ∇K_t               (eq. 9)
    both:   both terms; on-policy their sum is ∇E[K], so unbiased whenever K is unbiased (eq. 6; the loss
            term path-wise)
    advantage: A_t = A(R) − β·Σ_{s≥t} sg[K_s]   the KL added per token *after* the task reward's normalisation, as
            reward-to-go (γ = 1): OpenRLHF's and AReaL's KL in the reward. Its score-function term is
            β·Σ_t ∇log π_t·Σ_{s≥t} K_s, whose expectation is β·∇KL for K1 (a token's score has mean zero given its
            prefix, so the earlier tokens' K1 drop out): unbiased, and not divided by the group's spread, so a
            normalisation that rescales the task term rescales the balance of the two (docs/atlas.md)
    none:   no KL term (β is ignored)

Only K1-in-reward, and "both" with an estimator unbiased in value and its loss term differentiated path-wise
(k1-both, k3-both), give unbiased gradients of the sequence-level reverse KL (§3.2; checked exactly in
tests/test_toy.py). "both" with a per-token correction of the loss term (k1-both-ratio, k3-both-st, ...) is biased,
even at T = 1: eq. 6 needs the path-wise ∇K_t beside the reward's score-function term, and on-policy every
correction has the gradient K1_t·∇log π_t instead, whose expectation differs (Table 1's exact bias at T = 1 and 4,
setting "apart": 0.29 and 1.1 for K1, 0.059 and 0.17 for K3; at the optimum of the toy in fixed_points.py at
β = 0.3 the expected update of k3-both-ratio is 5.8e-3 and of k1-both-ratio 2.2e-2, where k3-both's is 1e-17).

How the loss term is differentiated (``loss_gradient``). The paper differentiates β·K_t path-wise. Frameworks
now ship per-token corrections, each with value β·K_t on-policy and a score-function part added to the
gradient. With ω_t = π_θ/π_old per token (1 on-policy, with gradient ∇log π_θ), and sg[·] a stop-gradient:

    pathwise  β·K_t                          ∇: β·∇K_t                     the paper (eq. 9); TRL with
                                                                           use_bias_correction_kl=False
    ratio     β·ω_t·K_t                      ∇: β·ω_t·(∇K_t + K_t·∇log π)  TRL use_bias_correction_kl=True,
                                                                           slime --use-unbiased-kl
    score     β·exp(log π − sg[log π])·K_t   ∇: β·(∇K_t + K_t·∇log π)      NeMo-RL
    st        β·(sg[K_t] + K2_t − sg[K2_t])   ∇: β·K1_t·∇log π               verl k1+ / k3+
    isst      β·(sg[K_t] + sg[w_t·K1_t]·(log π − sg[log π]))   ∇: β·sg[w_t]·K1_t·∇log π   OpenRLHF
              w_t = min(ω_t, ISST_WEIGHT_CAP)                                  --algo.kl.unbiased_gradient

On-policy every correction of K3 (and st, isst of any estimator) has the per-token gradient K1_t·∇log π_t,
whose expectation is Σ_t E_{y<t}[∇KL(π(·|y<t) ‖ π_ref(·|y<t))] with the prefix's distribution held fixed: the
gradient of the reverse KL of each token, not of the sequence. The sequence-level gradient also has
E[∇log π_t · Σ_{s>t} K1_s], what token t does to the KL of the tokens after it, which no per-token term
carries; so they are unbiased for T = 1 and biased for longer sequences wherever a token changes the
distribution of the later ones (measured exactly in toy.py;
docs/record/analysis-methods.md, "The KL losses frameworks ship").

A grid names a configuration ``<estimator>-<placement>`` (``k1-reward``), ``<estimator>-<placement>-<loss
gradient>`` for a loss term differentiated otherwise than path-wise (``k3-loss-ratio``), or ``none`` (the
β = 0 baseline); ``KLSpec.from_name`` is the one reader of that grammar, and the config schema and the
workflow's wildcard are built from ``NAME_PATTERN``. torch is imported by the functions that compute, so that
jobs which only read names (aggregation, figures) never load it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

ESTIMATORS = ("k1", "k2", "k3")
PLACEMENTS = ("reward", "loss", "both", "advantage", "none")
SCORE_PLACEMENTS = ("reward", "advantage")  # a score-function term only: no loss term, so no loss gradient
PATHWISE = "pathwise"  # the paper's: the loss term β·K_t differentiated as it is
LOSS_GRADIENTS = (PATHWISE, "ratio", "score", "st", "isst")
NO_KL = "none"  # a grid's β = 0 baseline: no penalty anywhere
# The names a grid may use (a regular expression, unanchored): none; or an estimator and a placement that is not
# none, then, for a placement with a loss term, optionally the loss gradient (path-wise when left out).
NAME_PATTERN = (
    f"{NO_KL}|({'|'.join(ESTIMATORS)})-({'|'.join(SCORE_PLACEMENTS)}|(loss|both)(-({'|'.join(LOSS_GRADIENTS[1:])}))?)"
)

# Where each way of differentiating the loss term comes from (Table 1's "framework" column).
# Who ships each, by version (read at the release tags: docs/record/framework-kl.md).
LOSS_GRADIENT_SOURCES = {
    PATHWISE: "the paper; TRL 0.26-1.9 (use_bias_correction_kl False); verl 0.7-0.9 low_var_kl; NeMo-RL 0.6; "
    "SkyRL 0.2-0.3 (0.1 computed it without gradient); OpenRLHF 0.11 --algo.kl.use_loss; ROLL 0.3; slime 0.3.1",
    "ratio": "TRL use_bias_correction_kl=True (the default from 1.10.0); slime 0.3.1 --use-unbiased-kl (DeepSeek-V3.2)",
    "score": "NeMo-RL from 0.7.0 (KL loss × exp(log π − sg[log π]))",
    "st": "verl k1+ / k3+ (value of K, gradient of K2; they raise NotImplementedError before 0.8.0)",
    "isst": "OpenRLHF --algo.kl.unbiased_gradient (from 0.11.1; w = π/π_old detached and capped at 10)",
}

EXPRESSIONS = {  # as Table 1 writes them, with r = π_ref / π_θ
    "k1": "-log r",
    "k2": "(log r)^2 / 2",
    "k3": "r - 1 - log r",
}
# Whether E_π[K_t] is the token's KL (K2's is not): then a per-token loss correction (ratio, score) has the expected
# gradient of the KL itself at T = 1; for an estimator whose value is off, it has that of E_π[K_t] instead.
VALUE_IS_KL = {"k1": True, "k2": False, "k3": True}
ISST_WEIGHT_CAP = 10.0  # OpenRLHF 0.11.1+ caps the detached weight π_θ/π_old of its unbiased_gradient at 10


def exactly_zero(bias: float, scale: float) -> bool:
    """Table 1's exact verdict on a bias: an exact bias (float64 enumeration, analysis/toy.py) is zero when it is
    rounding error relative to the gradient's size (here, torch-free, so that a figure reads the rule without torch)."""
    return bool(bias <= 1e-9 * max(1.0, scale))


@dataclass(frozen=True)
class KLSpec:
    """One KL configuration of the study.

    Attributes:
        estimator: token-level estimator, one of ``ESTIMATORS`` (None only with placement ``none``).
        placement: where the penalty enters the objective, one of ``PLACEMENTS``.
        beta: penalty coefficient β ≥ 0.
        loss_gradient: how the loss term is differentiated, one of ``LOSS_GRADIENTS`` (only ``pathwise`` without
            a loss term).
        clamp: the estimator's per-token value clamped to [−c, c] in the penalty (value, and no gradient beyond):
            verl clamps its K3 (low_var_kl) at 10 and no other estimator; OpenRLHF, AReaL and NeMo-RL clamp every
            estimator at 10. None: no clamp (the paper's analysis).
    """

    estimator: str | None
    placement: str
    beta: float
    loss_gradient: str = PATHWISE
    clamp: float | None = None

    @classmethod
    def from_name(cls, name: str, beta: float = 0.0, clamp: float | None = None) -> KLSpec:
        """The configuration a grid names: ``<estimator>-<placement>[-<loss gradient>]`` with ``beta`` (and
        ``clamp``), or ``none``, which has no estimator and β = 0 whatever ``beta`` says."""
        if not re.fullmatch(NAME_PATTERN, str(name)):
            raise ValueError(
                f"kl configuration {name!r} is not 'none' or '<estimator>-<placement>[-<loss gradient>]' "
                f"({NAME_PATTERN})"
            )
        if name == NO_KL:
            return cls(None, "none", 0.0)
        estimator, placement, *loss_gradient = name.split("-")
        return cls(estimator, placement, float(beta), *loss_gradient, clamp=clamp)

    def __post_init__(self):
        if self.estimator not in ESTIMATORS and not (self.estimator is None and self.placement == "none"):
            raise ValueError(f"kl estimator {self.estimator!r} is not one of {ESTIMATORS}")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"kl placement {self.placement!r} is not one of {PLACEMENTS}")
        if not self.beta >= 0:
            raise ValueError(f"kl beta must be >= 0, got {self.beta!r}")
        if self.loss_gradient not in LOSS_GRADIENTS:
            raise ValueError(f"kl loss gradient {self.loss_gradient!r} is not one of {LOSS_GRADIENTS}")
        if self.clamp is not None and not self.clamp > 0:
            raise ValueError(f"kl clamp must be > 0 or None, got {self.clamp!r}")
        if self.loss_gradient != PATHWISE and self.placement not in ("loss", "both"):
            raise ValueError(
                f"kl loss gradient {self.loss_gradient!r} needs a loss term, not placement {self.placement!r}"
            )

    @property
    def in_reward(self) -> bool:
        return self.beta > 0 and self.placement in ("reward", "both")

    @property
    def in_loss(self) -> bool:
        return self.beta > 0 and self.placement in ("loss", "both")

    @property
    def in_advantage(self) -> bool:
        return self.beta > 0 and self.placement == "advantage"

    @property
    def name(self) -> str:
        """The grid's name of the configuration (``none`` when nothing is penalised, whatever the estimator)."""
        if self.placement == "none":
            return NO_KL
        suffix = "" if self.loss_gradient == PATHWISE else f"-{self.loss_gradient}"
        return f"{self.estimator}-{self.placement}{suffix}"


def token_kl(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str, clamp: float | None = None) -> torch.Tensor:
    """Per-token estimate of KL(π_θ ‖ π_ref) from log-probs of the sampled tokens (any shape); clamped to
    [−clamp, clamp] when given (KLSpec.clamp).

    Differentiable in ``logp``; the caller detaches where the placement needs a stop-gradient.
    """
    import torch

    log_ratio = logp - ref_logp
    if estimator == "k1":
        value = log_ratio
    elif estimator == "k2":
        value = 0.5 * log_ratio.square()
    elif estimator == "k3":
        # Written as TRL writes it, so that the two agree to the last bit. verl, SkyRL and NeMo-RL clamp the
        # log-ratio to ±20 first: beyond it K3 > 10 whatever its sign, so at a clamp of 10 that changes nothing.
        value = torch.exp(-log_ratio) - 1 + log_ratio
    else:
        raise ValueError(f"kl estimator {estimator!r} is not one of {ESTIMATORS}")
    return value if clamp is None else torch.clamp(value, min=-clamp, max=clamp)


def sequence_kl(logp, ref_logp, mask, estimator, clamp: float | None = None) -> torch.Tensor:
    """Σ_t K_t over the response tokens of each sequence: shape ``logp.shape[:-1]``."""
    return (token_kl(logp, ref_logp, estimator, clamp) * mask).sum(-1)


def reward_penalty(logp, ref_logp, mask, spec: KLSpec) -> torch.Tensor:
    """β·Σ_t sg[K_t] per sequence when the KL is placed in the reward, else zeros (no gradient).

    ``logp`` must be the log-probs of the policy that *sampled* the tokens (eq. 7): in an off-policy
    update that is π_old, not the policy being trained.
    """
    import torch

    if not spec.in_reward:
        return torch.zeros(logp.shape[:-1], dtype=logp.dtype, device=logp.device)
    return spec.beta * sequence_kl(logp.detach(), ref_logp.detach(), mask, spec.estimator, spec.clamp)


def shaped_rewards(task_rewards, logp, ref_logp, mask, spec: KLSpec) -> torch.Tensor:
    """R − β·Σ_t sg[K_t]: the reward the baseline and advantage are computed from."""
    return task_rewards - reward_penalty(logp, ref_logp, mask, spec)


def to_go(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Σ_{s≥t} values_s·mask_s for every token t (the reward-to-go with γ = 1), over the last dimension."""
    masked = values * mask
    return masked.flip(-1).cumsum(-1).flip(-1)


def advantage_penalty(logp, ref_logp, mask, spec: KLSpec) -> torch.Tensor:
    """β·Σ_{s≥t} sg[K_s] per token when the KL is placed in the advantage (subtracted from the normalised advantage,
    as OpenRLHF's and AReaL's reward-to-go of −β·K per token), else zeros (no gradient). ``logp``: the sampling
    policy's log-probs, as for reward_penalty."""
    import torch

    if not spec.in_advantage:
        return torch.zeros_like(logp)
    per_token = token_kl(logp.detach(), ref_logp.detach(), spec.estimator, spec.clamp)
    return spec.beta * to_go(per_token, mask)


def loss_penalty(logp, ref_logp, mask, spec: KLSpec, old_logp=None) -> torch.Tensor:
    """Per-token β·K_t·mask to add to the per-token loss when the KL is placed in the loss, differentiated as
    ``spec.loss_gradient`` says (the module's docstring); zeros when the KL is not in the loss.

    ``old_logp``: log-probs of the policy that sampled the tokens, for the ratio ω_t = π_θ/π_old of ``ratio`` and
    ``isst``; None on-policy (π_old = sg[π_θ], so ω_t = 1 with gradient ∇log π_θ).

    A clamp (``spec.clamp``) acts on the weighted term of ``ratio`` and ``score``, ω_t·K_t, as slime (its ratio on
    low_var_kl) and NeMo-RL (its weights "multiplied into the KL before output clamping") apply it: where it binds,
    the token has no gradient at all; elsewhere on K_t itself.
    """
    import torch

    if not spec.in_loss:
        return torch.zeros_like(logp)
    ref_logp = ref_logp.detach()
    per_token = token_kl(logp, ref_logp, spec.estimator, spec.clamp)
    score = logp - logp.detach()  # value 0, gradient ∇log π_θ
    ratio = torch.exp(logp - (logp.detach() if old_logp is None else old_logp.detach()))
    if spec.loss_gradient in ("ratio", "score"):
        weight = ratio if spec.loss_gradient == "ratio" else torch.exp(score)
        per_token = weight * token_kl(logp, ref_logp, spec.estimator)
        if spec.clamp is not None:
            per_token = torch.clamp(per_token, min=-spec.clamp, max=spec.clamp)
    elif spec.loss_gradient == "st":
        k2 = token_kl(logp, ref_logp, "k2")
        per_token = per_token.detach() + (k2 - k2.detach())
    elif spec.loss_gradient == "isst":
        weight = ratio.clamp(max=ISST_WEIGHT_CAP)
        per_token = per_token.detach() + (weight * token_kl(logp, ref_logp, "k1")).detach() * score
    return spec.beta * per_token * mask


def by_token(advantages, logp):
    """Advantages broadcast to ``logp``'s tokens: one value per sequence (shape ``logp.shape[:-1]``) is each of its
    tokens'; per-token advantages (token_advantages: the KL in the advantage, whitening) are taken as they are."""
    return advantages if advantages.dim() == logp.dim() else advantages.unsqueeze(-1)


def clipped_surrogate(logp, old_logp, advantages, epsilon_low: float, epsilon_high: float):
    """The trainer's per-token policy loss, TRL's clipped surrogate −min(ω·A, clip(ω, 1−ε_low, 1+ε_high)·A) with
    ω_t = π_θ/π_old per token. ``advantages``: one value per sequence or per token (``by_token``). On-policy
    (``old_logp`` = sg[logp]) its gradient is −A·∇log π_θ per token, the score term of ``reinforce_loss``."""
    import torch

    ratio = torch.exp(logp - old_logp.detach())
    advantages = by_token(advantages, logp)
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    return -torch.min(ratio * advantages, clipped * advantages)


# prime-rl's importance-ratio bounds for its asynchronous (stale) batches: clip_ratio of its default "ratio" loss
# (August to 16 October 2025) and mask_ratio_high / mask_ratio_low of the masked loss that replaced it.
PRIME_RL_RATIO_HIGH = 8.0
PRIME_RL_RATIO_LOW = 0.125


def truncated_is_surrogate(logp, old_logp, advantages):
    """prime-rl's policy loss from August to 16 October 2025 (its default RatioLossConfig): −min(ω_t, 8)·A, a
    truncated importance weight without PPO's clip; a token whose ω_t passes 8 adds no gradient."""
    import torch

    ratio = torch.exp(logp - old_logp.detach())
    return -torch.clamp(ratio, max=PRIME_RL_RATIO_HIGH) * by_token(advantages, logp)


def _prime_rl_masked(ratio):
    """The tokens prime-rl's masked loss drops: ω_t outside [PRIME_RL_RATIO_LOW, PRIME_RL_RATIO_HIGH]."""
    return (ratio < PRIME_RL_RATIO_LOW) | (ratio > PRIME_RL_RATIO_HIGH)


def masked_is_surrogate(logp, old_logp, advantages):
    """prime-rl's policy loss from 16 October 2025: −ω_t·A on tokens with 1/8 ≤ ω_t ≤ 8, zero on the others
    (masked: no value, no gradient)."""
    import torch

    ratio = torch.exp(logp - old_logp.detach())
    return torch.where(_prime_rl_masked(ratio), torch.zeros_like(ratio), -ratio * by_token(advantages, logp))


# How the policy-gradient term weighs a token sampled by an older policy (train.policy_loss).
POLICY_LOSSES = ("ppo_clip", "truncated_is", "masked_is")


def policy_surrogate(name: str, logp, old_logp, advantages, epsilon_low: float, epsilon_high: float):
    """The per-token policy loss ``name`` (POLICY_LOSSES): TRL's clipped surrogate (ppo_clip, at 1 − ε_low and
    1 + ε_high), or prime-rl's truncated or masked importance weight. All three have gradient −A·∇log π_θ at
    ω_t = 1 (on-policy)."""
    if name == "ppo_clip":
        return clipped_surrogate(logp, old_logp, advantages, epsilon_low, epsilon_high)
    if name == "truncated_is":
        return truncated_is_surrogate(logp, old_logp, advantages)
    if name == "masked_is":
        return masked_is_surrogate(logp, old_logp, advantages)
    raise ValueError(f"policy loss {name!r} is not one of {POLICY_LOSSES}")


def inactive_tokens(name: str, ratio, advantages, epsilon_low: float, epsilon_high: float):
    """Where the policy loss ``name`` gives a token no gradient: clipped (ppo_clip), past the cap (truncated_is) or
    masked (masked_is). ``ratio`` ω_t per token, ``advantages`` broadcastable to it."""
    if name == "ppo_clip":
        return ((ratio < 1 - epsilon_low) & (advantages < 0)) | ((ratio > 1 + epsilon_high) & (advantages > 0))
    if name == "truncated_is":
        return ratio > PRIME_RL_RATIO_HIGH
    if name == "masked_is":
        return _prime_rl_masked(ratio)
    raise ValueError(f"policy loss {name!r} is not one of {POLICY_LOSSES}")


def rloo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """REINFORCE leave-one-out: A_i = R_i − mean_{j≠i} R_j within each group (the last dimension).

    The paper's on-policy baseline (Ahmadian et al., 2024). Unbiased: b_i does not depend on y_i.
    """
    group_size = rewards.shape[-1]
    if group_size < 2:
        raise ValueError("RLOO needs at least 2 samples per group")
    total = rewards.sum(-1, keepdim=True)
    return rewards - (total - rewards) / (group_size - 1)


def group_mean_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """Dr. GRPO; TRL's GRPO with scale_rewards="none": A_i = R_i − mean_j R_j = (G−1)/G times the RLOO advantage."""
    return rewards - rewards.mean(-1, keepdim=True)


STD_EPSILON = 1e-4  # TRL 1.16 adds it to the standard deviation, so that a group without spread gets A = 0


def _spread(values: torch.Tensor) -> torch.Tensor:
    """The Bessel-corrected standard deviation over the last dimension (kept), in TRL 1.16's order of operations
    (trl.trainer.utils.nanstd: the mean squared deviation × n/(n−1), then the root), so that the two agree bitwise in
    float32, TRL's rewards' dtype (TRL computes n/(n−1) in float32 whatever the rewards' dtype: from float64 rewards
    the two differ by up to 2e-8, relatively)."""
    return _spread_of_deviations(values - values.mean(-1, keepdim=True))


def _spread_of_deviations(deviation: torch.Tensor) -> torch.Tensor:
    """_spread from the deviations from the mean, which group_std_advantages has already computed."""
    count = deviation.shape[-1]
    return (deviation.square().mean(-1, keepdim=True) * (count / (count - 1))).sqrt()


def group_std_advantages(rewards: torch.Tensor, epsilon: float = STD_EPSILON) -> torch.Tensor:
    """GRPO; TRL's default scale_rewards="group"; verl's norm_adv_by_std_in_grpo: the group-mean advantage divided
    by the group's standard deviation (Bessel-corrected) + ``epsilon`` (TRL 1e-4; verl and SkyRL 1e-6, OpenRLHF
    1e-9). Scale-free: it reweights the task gradient by each prompt's spread of rewards, which the KL term in the
    loss does not share."""
    centred = group_mean_advantages(rewards)  # the deviations _spread takes: computed once
    return centred / (_spread_of_deviations(centred) + epsilon)


def batch_std_advantages(
    rewards: torch.Tensor, spread: torch.Tensor | None = None, epsilon: float = STD_EPSILON
) -> torch.Tensor:
    """TRL's scale_rewards="batch": the group-mean advantage divided by the standard deviation of every reward of the
    batch (Bessel-corrected) + STD_EPSILON. ``rewards`` is (..., groups, G): the batch is the last two dimensions.
    ``spread``: the standard deviation to divide by instead, broadcast against ``rewards`` (the toy's exact update
    takes a batch of many groups, whose standard deviation is the policy's own); ``epsilon`` as group_std's."""
    if spread is None:
        spread = _spread(rewards.flatten(-2)).unsqueeze(-1)
    return group_mean_advantages(rewards) / (spread + epsilon)


LOO_STD_EPSILON = 1e-6  # NeMo-RL adds it to the others' standard deviation


def loo_std_advantages(rewards: torch.Tensor, epsilon: float = LOO_STD_EPSILON) -> torch.Tensor:
    """NeMo-RL's GRPO (``use_leave_one_out_baseline`` and ``normalize_rewards``, its defaults;
    nemo_rl/algorithms/advantage_estimator.py, utils.calculate_baseline_and_std_per_prompt): the RLOO advantage
    R_i − mean_{j≠i} R_j divided by the standard deviation of the *other* G − 1 rewards (Bessel-corrected: over G − 2)
    + ``epsilon`` (LOO_STD_EPSILON), and left undivided where that deviation is 0 (always at G = 2). Baseline and
    divisor do not depend on R_i: A_i is increasing in R_i and unbiased (E[A_i·∇log π(y_i)] = E[w]·∇E[R], w = the
    divisor's reciprocal, or 1), but not zero-sum in a group."""
    import torch

    group_size = rewards.shape[-1]
    if group_size < 3:
        return rloo_advantages(rewards)
    index = torch.tensor([[j for j in range(group_size) if j != i] for i in range(group_size)], device=rewards.device)
    others = rewards[..., index]  # (..., G, G − 1): member i's others
    centred = rewards - others.mean(-1)
    agree = (others == others[..., :1]).all(-1)  # the others' std is 0 exactly, not a rounding residue
    return torch.where(agree, centred, centred / (others.std(-1) + epsilon))


WHITEN_EPSILON = 1e-8  # OpenRLHF (and ROLL) whiten with rsqrt(max(variance, 1e-8))


def whiten(values: torch.Tensor, mask: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """(values − m)/√max(v, WHITEN_EPSILON) with m and v the mean and the variance (not Bessel-corrected) of the
    unmasked entries over ``dims``: OpenRLHF 0.11's whitening of the advantages over every token of the batch
    (experience_maker.compute_advantages_and_returns). Masked entries are shifted and scaled too, as there."""
    count = mask.sum(dims, keepdim=True)
    mean = (values * mask).sum(dims, keepdim=True) / count
    variance = ((values - mean).square() * mask).sum(dims, keepdim=True) / count
    return (values - mean) * variance.clamp(min=WHITEN_EPSILON).rsqrt()


def _whitened(centre):
    """A whitening normalisation's sequence-level advantages: ``centre``'s advantages whitened over the batch (the last
    two dimensions), each sequence one entry: OpenRLHF's token whitening when every response has the same length
    and no per-token term is added (token_advantages does the general case)."""

    def advantages(rewards):
        import torch

        return whiten(ADVANTAGES[centre](rewards), torch.ones_like(rewards), (-2, -1))

    return advantages


# Advantage normalisations by name (config ``train.advantage``; the toy's ``normalisations``). Each maps shaped rewards
# (..., G) to advantages of the same shape; "none" (no baseline) is Figure 1's b = 0.
ADVANTAGES = {
    "rloo": rloo_advantages,
    "mean": group_mean_advantages,
    "group_std": group_std_advantages,
    "batch_std": batch_std_advantages,
    "loo_std": loo_std_advantages,
    "none": lambda r: r,
}
# Normalisations that whiten the per-token advantages over the whole batch after any per-token term is added, and the
# advantage they whiten: OpenRLHF's reinforce_baseline (the group mean) and reinforce (none; ROLL's reinforce with
# whiten_advantages too).
WHITENED = {"group_whiten": "mean", "whiten": "none"}
ADVANTAGES.update({name: _whitened(centre) for name, centre in WHITENED.items()})


# Each normalisation in a user's words (explain's output and the answer table's legend; docs/glossary.md): one name,
# one normalisation. "whiten" and "group_whiten" differ in what is subtracted before the whitening.
ADVANTAGE_WORDS = {
    "rloo": "R − the others' mean (leave-one-out)",
    "mean": "R − the group's mean, no ÷ std: Dr. GRPO's",
    "group_std": "GRPO's: − the group's mean, ÷ its std",
    "batch_std": "− the group's mean, ÷ the batch's std",
    "loo_std": "leave-one-out, ÷ the others' std",
    "group_whiten": "− the group's mean, every token's advantage whitened over the batch",
    "whiten": "no baseline, every token's advantage whitened over the batch",
}

STD_NORMALISATIONS = ("group_std", "batch_std", "loo_std")  # the ones that take a framework's ε


def token_advantages(rewards, penalty_to_go, mask, normalisation: str, epsilon: float | None = None) -> torch.Tensor:
    """The per-token advantages of a batch (..., G, T): the normalisation's advantage of the shaped rewards (..., G)
    minus ``penalty_to_go`` (advantage_penalty: the KL placed in the advantage; zeros otherwise), whitened over every
    unmasked token of the batch (the last three dimensions) for a WHITENED normalisation, after the penalty, as
    OpenRLHF does. Without a penalty and whitening, each token carries its sequence's advantage. ``epsilon``: a std
    normalisation's (STD_NORMALISATIONS), the framework's own; None: kl.py's default."""
    centre = WHITENED.get(normalisation, normalisation)
    options = {"epsilon": epsilon} if epsilon is not None and centre in STD_NORMALISATIONS else {}
    per_token = ADVANTAGES[centre](rewards, **options).unsqueeze(-1) - penalty_to_go
    if normalisation in WHITENED:
        per_token = whiten(per_token, mask, (-3, -2, -1))
    return per_token


# TRL 1.16's scale_rewards value that gives each normalisation (with the group mean as its baseline).
TRL_SCALE_REWARDS = {"mean": "none", "group_std": "group", "batch_std": "batch"}


def reinforce_loss(logp, ref_logp, mask, task_rewards, spec: KLSpec, advantage="rloo") -> torch.Tensor:
    """On-policy REINFORCE surrogate whose gradient is the paper's estimate (eqs. 8–9, with both terms).

    Shapes: ``logp``, ``ref_logp``, ``mask`` are (..., G, T) for groups of G responses sampled from
    π_θ; ``task_rewards`` is (..., G). Tokens are summed per sequence and sequences averaged per group,
    so ``-∇loss`` is an unbiased per-group estimate of the gradient of (R − β·KL) for the unbiased
    configurations. Returns one loss per group: shape (...,).
    """
    rewards = shaped_rewards(task_rewards, logp, ref_logp, mask, spec)
    penalty = advantage_penalty(logp, ref_logp, mask, spec)
    advantages = token_advantages(rewards, penalty, mask, advantage).detach()
    score_term = -(advantages * logp * mask).sum(-1)
    path_term = loss_penalty(logp, ref_logp, mask, spec).sum(-1)
    return (score_term + path_term).mean(-1)
