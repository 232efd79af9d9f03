"""Where each KL configuration leads: the toy model of §3.3 trained to its fixed point, against the exact optimum.

Table 1 says which way each configuration's gradient points at one policy. This module says where training with it
*ends*. The objective a KL penalty is meant to optimise is

    J_β(π) = E_π[R] − β·KL(π ‖ π_ref),

with R(y) a task reward on the toy's binary sequences y_1..y_T (config ``toy.fixed_points.reward``). Its optimum over
all distributions is π*_β(y) ∝ π_ref(y)·exp(R(y)/β), with J_β(π*) = β·log E_ref[exp(R/β)].

Two policy families, both starting from the reference (RL fine-tuning starts from the base model):

    parametric   §3.3's model, θ = (a, b): p_t = σ(a + b·c_{t−1}); π*_β is out of its reach, so its own optimum
                 argmax_θ J_β is found numerically (Newton's method on the exact gradient, float64).
    tabular      a free Bernoulli logit for each of the 2^T − 1 prefixes: every distribution with full support,
                 so π*_β itself is its optimum.

A configuration's *expected update* u(θ) is minus the gradient of the exact expectation of ``kl.reinforce_loss``
(RLOO over groups of G = 2 sequences, every group enumerated, divided by T as the trainer's token-sum normalisation
divides it): the mean of what the trainer's on-policy step does. Its *fixed point* is where u vanishes. They are
found by continuation in β: Newton's method on u from the reference at the largest β, then from each β's fixed point
at the next smaller one, so each branch is the one connected to the reference; each is checked to be stable (every
eigenvalue of ∂u/∂θ has a negative real part, so the update's flow is drawn to it). Where Newton's method finds no
stable zero, the update is followed (Euler steps of the flow) from the reference and the result says where it goes
(``status``): a configuration whose expected update never vanishes (no KL; K1 in the loss, whose term has mean zero)
drifts towards the reward's maximum, its logits growing without bound. KL(π‖π_ref) does not: on a finite space it is
at most max_y −log π_ref(y), and along no KL's flow it converges (2.74145 in the default's tabular family, 3.53959 =
−log π_ref(1111) in the parametric one), so J_β there tends to 1 − β·KL∞.

Monte Carlo training follows the same update from sampled sequences, as the trainer does: the per-token loss is the
trainer's (``kl.clipped_surrogate`` plus ``kl.loss_penalty``, advantages from ``kl.shaped_rewards`` and RLOO),
on-policy (one update per batch) or off-policy (several minibatch updates per batch, clipped ratios, the reward's KL
taken from the sampling policy). Adam, as the trainer, with a step that decays as 1/(1 + k/k0), so that the last
iterate settles on a fixed point instead of hovering around it; many seeds at once.
β enters the shaped reward and the loss term only as a factor (kl.reward_penalty and kl.loss_penalty are β times
their value at β = 1: tests/test_fixed_points.py), which lets one batched step train every β of the grid together.
"""

from __future__ import annotations

import itertools
import math
import zlib
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pandas as pd
import torch

from klstudy import kl, toy

DTYPE = torch.float64
FAMILIES = ("tabular", "parametric")
EXACT_GROUP = 2  # RLOO's group size in the exact expectation (every pair enumerated); the expectation is G-free
NEWTON_STEP = 1e-10  # the largest Newton step |Δθ| at an accepted fixed point
# A token logit beyond this (p within 2e-9 of 0 or 1) is at the boundary: the update vanishes there to rounding error
# without a fixed point, so a zero found beyond it is not accepted and a followed update that passes it "drifts".
DRIFT_BOUND = 20.0


# ------------------------------------------------------------------------------------------------ the task reward


def task_reward(sequences: torch.Tensor, reward: dict) -> torch.Tensor:
    """R(y) for binary sequences (..., T), as config ``toy.fixed_points.reward`` names it.

    ``ones_at_least``: 1 when the sequence has at least ``threshold`` ones, else 0 (a verifiable reward: right or
    wrong, as the paper's MATH reward)."""
    if reward["kind"] == "ones_at_least":
        return (sequences.sum(-1) >= reward["threshold"]).to(DTYPE)
    raise ValueError(f"toy.fixed_points.reward.kind {reward['kind']!r} is not one of ['ones_at_least']")


# ------------------------------------------------------------------------------------------------ the two families


@dataclass(frozen=True)
class Family:
    """A policy family over binary sequences of length ``length`` with the reference p_t = σ(a_ref + b_ref·c_{t−1}).

    θ has shape (..., n_params); every sequence's token logits are ``token_logits(θ)``: (..., 2^T, T)."""

    name: str
    length: int
    a_ref: float
    b_ref: float

    def __post_init__(self):
        if self.name not in FAMILIES:
            raise ValueError(f"toy family {self.name!r} is not one of {FAMILIES}")

    @cached_property
    def sequences(self) -> torch.Tensor:
        """Every sequence, (2^T, T); sampled sequences are indices into it."""
        return toy.all_sequences(self.length)

    @cached_property
    def _counts(self) -> torch.Tensor:
        return toy.counts_before(self.sequences)  # c_{t−1}: ones strictly before t

    @cached_property
    def _prefix_index(self) -> torch.Tensor:
        """The tabular parameter of each (sequence, position): prefixes of length t are numbered from 2^t − 1."""
        t = torch.arange(self.length)
        bits_before = torch.tril(torch.ones(self.length, self.length), -1)  # (t, k): 1 where k < t
        code = (self.sequences.long() * (1 << t)) @ bits_before.long().T  # Σ_{k<t} y_k 2^k
        return (1 << t) - 1 + code

    @property
    def n_params(self) -> int:
        return 2 if self.name == "parametric" else 2**self.length - 1

    def token_logits(self, theta: torch.Tensor) -> torch.Tensor:
        if self.name == "parametric":
            return theta[..., 0, None, None] + theta[..., 1, None, None] * self._counts
        return theta[..., self._prefix_index]

    def reference_theta(self) -> torch.Tensor:
        """θ of the reference policy: where training starts."""
        if self.name == "parametric":
            return torch.tensor([self.a_ref, self.b_ref], dtype=DTYPE)
        prefix_ones = torch.zeros(self.n_params, dtype=DTYPE)
        prefix_ones[self._prefix_index] = self._counts
        return self.a_ref + self.b_ref * prefix_ones

    def token_logprobs(self, theta: torch.Tensor) -> torch.Tensor:
        """log π(y_t | y_<t) of every token of every sequence: (..., 2^T, T)."""
        logits = self.token_logits(theta)
        y = self.sequences
        return toy.bernoulli_logprobs(logits, y)

    def reference_logprobs(self) -> torch.Tensor:
        return self.token_logprobs(self.reference_theta())

    def sequence_logprobs(self, theta: torch.Tensor) -> torch.Tensor:
        return self.token_logprobs(theta).sum(-1)


# ------------------------------------------------------------------------------------------------ exact quantities


def policy_metrics(family: Family, seq_logp: torch.Tensor, rewards: torch.Tensor, beta: float) -> dict:
    """E_π[R], KL(π‖π_ref) and J_β of a distribution over the sequences given by its log-probabilities (2^T,)."""
    prob = seq_logp.exp()
    kl_ref = float((prob * (seq_logp - family.reference_logprobs().sum(-1))).sum())
    reward = float((prob * rewards).sum())
    return {"reward": reward, "kl": kl_ref, "objective": reward - beta * kl_ref}


def optimum_logprobs(family: Family, rewards: torch.Tensor, beta: float) -> torch.Tensor:
    """log π*_β(y) = log π_ref(y) + R(y)/β − log E_ref[exp(R/β)]: the optimum over every distribution."""
    unnormalised = family.reference_logprobs().sum(-1) + rewards / beta
    return unnormalised - torch.logsumexp(unnormalised, 0)


def unconstrained_objective(family: Family, rewards: torch.Tensor, beta: float) -> float:
    """J_β(π*_β) = β·log E_ref[exp(R/β)]: the best any policy can do."""
    return beta * float(torch.logsumexp(family.reference_logprobs().sum(-1) + rewards / beta, 0))


def kl_between(seq_logp: torch.Tensor, other_logp: torch.Tensor) -> float:
    """KL(p ‖ q) of two distributions over the sequences, from their log-probabilities."""
    return float((seq_logp.exp() * (seq_logp - other_logp)).sum())


def _objective(family: Family, theta: torch.Tensor, rewards: torch.Tensor, beta: float) -> torch.Tensor:
    """J_β(π_θ), exact; θ may carry batch dimensions (one value each)."""
    seq_logp = family.sequence_logprobs(theta)
    prob = seq_logp.exp()
    return (prob * (rewards - beta * (seq_logp - family.reference_logprobs().sum(-1)))).sum(-1)


def family_optimum(family: Family, rewards: torch.Tensor, beta: float, start: torch.Tensor) -> torch.Tensor:
    """θ of argmax J_β within the family. Tabular: π*_β itself (the family holds every distribution with full
    support), each prefix's logit read from π*_β's marginals. Parametric: Newton's method on ∇J_β from ``start``
    (the optimum of the previous β in a sweep)."""
    if family.name == "tabular":
        return _tabular_theta(family, optimum_logprobs(family, rewards, beta))

    ascent = ObjectiveAscent(family, rewards, beta)
    theta, converged = _newton(ascent, start)
    if not converged:
        raise RuntimeError(f"no optimum of J_β found in the parametric family at β = {beta}")
    return theta.detach()


class ObjectiveAscent:
    """∇_θ J_β(π_θ), exact by enumeration; the parametric family's optimum is where it vanishes."""

    def __init__(self, family: Family, rewards: torch.Tensor, beta: float):
        self.family, self.rewards, self.beta = family, rewards, beta

    def __call__(self, theta: torch.Tensor) -> torch.Tensor:
        theta = theta.detach().requires_grad_(True)
        (grad,) = torch.autograd.grad(_objective(self.family, theta, self.rewards, self.beta).sum(), theta)
        return grad


def _tabular_theta(family: Family, seq_logp: torch.Tensor) -> torch.Tensor:
    """Each prefix's logit log P(prefix, 1) − log P(prefix, 0) under a distribution over the sequences."""
    theta = torch.empty(family.n_params, dtype=DTYPE)
    index, y = family._prefix_index, family.sequences
    for prefix in range(family.n_params):
        rows, position = (index == prefix).nonzero(as_tuple=True)
        ones = y[rows, position] == 1
        theta[prefix] = torch.logsumexp(seq_logp[rows[ones]], 0) - torch.logsumexp(seq_logp[rows[~ones]], 0)
    return theta


# ------------------------------------------------------------------------------------------------ expected updates


class ExpectedUpdate:
    """u(θ) = −∇_θ E[loss]/T for one configuration: kl.reinforce_loss with RLOO (or ``advantage``), every group of
    ``group`` sequences enumerated and weighted by its probability under π_θ (held fixed: it is the sampling
    distribution). θ may carry leading batch dimensions (..., n_params): each row's update is its own."""

    def __init__(
        self, family: Family, rewards: torch.Tensor, spec: kl.KLSpec, group: int = EXACT_GROUP, advantage: str = "rloo"
    ):
        self.family, self.spec, self.advantage = family, spec, advantage
        n = 2**family.length
        self.groups = torch.cartesian_prod(*[torch.arange(n)] * group).reshape(-1, group)  # (n^G, G)
        self.rewards = rewards[self.groups]
        self.ref_logp = family.reference_logprobs()[self.groups]
        self.mask = torch.ones_like(self.ref_logp)

    def __call__(self, theta: torch.Tensor) -> torch.Tensor:
        theta = theta.detach().requires_grad_(True)
        token_logp = self.family.token_logprobs(theta)[..., self.groups, :]  # (..., n^G, G, T)
        weights = token_logp.sum((-1, -2)).exp().detach()
        loss = kl.reinforce_loss(token_logp, self.ref_logp, self.mask, self.rewards, self.spec, self.advantage)
        (grad,) = torch.autograd.grad((weights * loss).sum() / self.family.length, theta)
        return -grad


# Normalisations whose advantage is linear in the other members' rewards: E[A_1 | y_1] is their advantage with every
# other member's reward replaced by its mean (batch_std with the policy's own spread, that of a batch of many groups).
LINEAR_NORMALISATIONS = ("rloo", "grpo", "batch_std")
ENUMERATION_LIMIT = 2_000_000  # (classes × multisets × G) per θ beyond which a non-linear one is not enumerated


class NormalisedUpdate:
    """u(θ) = −∇_θ E[loss]/T for one configuration with the advantage normalisation ``normalisation`` (kl.ADVANTAGES)
    and groups of ``group`` sequences, exact by exchangeability: the group's loss is the mean of its members', so

        E[loss] = Σ_y π(y)·(−a(y)·log π(y) + Σ_t β·K_t(y)),   a(y) = E[A_1 | y_1 = y],

    where A_1 is the normalisation's advantage of the group's first member and the other G − 1 are drawn from π.
    a(y) is computed with kl.ADVANTAGES itself: for a normalisation linear in the other rewards, on the group whose
    other members all have the mean shaped reward; for the others (group_std, loo_std), on every multiset of the
    others' rewards, weighted by its multinomial probability. Without the KL in the reward the shaped reward is the
    task reward, so the multisets run over its values (2 for a 0/1 reward, any G); with it, over the sequences (2^T
    classes). batch_std is the limit of a batch of many groups, whose standard deviation is that of the shaped reward
    under π.
    θ may carry leading batch dimensions (..., n_params)."""

    def __init__(self, family: Family, rewards: torch.Tensor, spec: kl.KLSpec, normalisation: str, group: int):
        if normalisation not in kl.ADVANTAGES or normalisation == "none" or group < 2:
            raise ValueError(f"normalisation {normalisation!r} with groups of {group}: not an exact update")
        self.family, self.spec, self.normalisation, self.group = family, spec, normalisation, group
        self.task, self.ref_logp = rewards, family.reference_logprobs()
        self.mask = torch.ones_like(self.ref_logp)
        if spec.in_reward:  # every sequence its own shaped reward
            self.classes = torch.arange(len(rewards))
        else:
            self.classes = torch.unique(rewards, return_inverse=True)[1]
        classes = int(self.classes.max()) + 1
        self.first = torch.tensor([int((self.classes == c).nonzero()[0, 0]) for c in range(classes)])  # a member each
        if normalisation in LINEAR_NORMALISATIONS:
            self.others = None
            return
        others = torch.tensor(list(itertools.combinations_with_replacement(range(classes), group - 1)))
        if classes * len(others) * group > ENUMERATION_LIMIT:
            raise ValueError(f"{normalisation} at G = {group} with {classes} classes: too many groups to enumerate")
        self.others = others  # (M, G − 1) class indices of the other members
        self.counts = torch.nn.functional.one_hot(others, classes).sum(-2).to(DTYPE)  # (M, classes)
        log_g_factorial = torch.lgamma(torch.tensor(float(group), dtype=DTYPE))  # log (G − 1)!
        self.log_multinomial = log_g_factorial - torch.lgamma(self.counts + 1).sum(-1)

    def conditional_advantages(self, token_logp: torch.Tensor) -> torch.Tensor:
        """a(y) = E[A_1 | y_1 = y] for every sequence under the policy of ``token_logp`` (..., 2^T, T), detached."""
        token_logp = token_logp.detach()
        prob = token_logp.sum(-1).exp()
        shaped = kl.shaped_rewards(self.task, token_logp, self.ref_logp, self.mask, self.spec)  # (..., 2^T)
        mean = (prob * shaped).sum(-1, keepdim=True)
        if self.others is None:
            own = shaped.unsqueeze(-1)
            groups = torch.cat([own, mean.unsqueeze(-1).expand(*own.shape[:-1], self.group - 1)], -1)
            if self.normalisation == "batch_std":
                spread = (prob * (shaped - mean).square()).sum(-1, keepdim=True).sqrt().unsqueeze(-1)
                return kl.batch_std_advantages(groups.unsqueeze(-2), spread.unsqueeze(-1)).squeeze(-2)[..., 0]
            return kl.ADVANTAGES[self.normalisation](groups)[..., 0]
        classes = self.counts.shape[-1]
        class_prob = torch.zeros(*prob.shape[:-1], classes, dtype=DTYPE).index_add_(-1, self.classes, prob)
        value = shaped[..., self.first]  # each class's shaped reward (one value per class)
        others = value[..., self.others]  # (..., M, G − 1)
        own = value[..., :, None, None].expand(*value.shape, len(self.others), 1)
        groups = torch.cat([own, others.unsqueeze(-3).expand(*value.shape, *others.shape[-2:])], -1)
        log_weight = self.log_multinomial + (torch.xlogy(self.counts, class_prob.unsqueeze(-2))).sum(-1)  # (..., M)
        advantage = (kl.ADVANTAGES[self.normalisation](groups)[..., 0] * log_weight.exp().unsqueeze(-2)).sum(-1)
        return advantage[..., self.classes]

    def __call__(self, theta: torch.Tensor) -> torch.Tensor:
        theta = theta.detach().requires_grad_(True)
        token_logp = self.family.token_logprobs(theta)  # (..., 2^T, T)
        seq_logp = token_logp.sum(-1)
        score = -self.conditional_advantages(token_logp) * seq_logp
        path = kl.loss_penalty(token_logp, self.ref_logp, self.mask, self.spec).sum(-1)
        loss = (seq_logp.exp().detach() * (score + path)).sum(-1)
        (grad,) = torch.autograd.grad(loss.sum() / self.family.length, theta)
        return -grad


def jacobian(field, theta: torch.Tensor, step: float = 1e-6) -> torch.Tensor:
    """∂field/∂θ by central differences, every column in one batched call. Not autograd: u(θ) is built from
    stop-gradients (the reward's KL, the advantages, the sampling weights), constants for u itself but functions of θ
    for its Jacobian."""
    shifts = step * torch.eye(len(theta), dtype=DTYPE)
    values = field(torch.cat([theta + shifts, theta - shifts]))
    return ((values[: len(theta)] - values[len(theta) :]) / (2 * step)).T


def _newton(update, theta: torch.Tensor, iterations: int = 40) -> tuple[torch.Tensor, bool]:
    """A zero of ``update`` by Newton's method with backtracking on ‖u‖; (θ, converged). Converged means the Newton
    step itself is below NEWTON_STEP in every coordinate: a criterion in θ, since near the boundary u is below any
    absolute tolerance without vanishing (there the step stays of order one, along the drift)."""
    value = update(theta)
    for _ in range(iterations):
        try:
            step = torch.linalg.solve(jacobian(update, theta), value)
        except RuntimeError:  # singular: no isolated zero here
            return theta, False
        if not torch.isfinite(step).all():
            return theta, False
        if step.abs().max() < NEWTON_STEP:
            return theta, not _saturated(update.family, theta)
        scale = 1.0
        while scale > 1e-4:
            candidate = theta - scale * step
            candidate_value = update(candidate)
            if candidate_value.norm() < value.norm():
                theta, value = candidate, candidate_value
                break
            scale /= 2
        else:
            return theta, False
        if _saturated(update.family, theta):
            return theta, False
    return theta, False


def _saturated(family: Family, theta: torch.Tensor) -> bool:
    return bool(family.token_logits(theta).abs().max() > DRIFT_BOUND)


def is_stable(update: ExpectedUpdate, theta: torch.Tensor) -> bool:
    """Every eigenvalue of ∂u/∂θ has a negative real part: the expected update's flow is drawn to θ."""
    return bool(torch.linalg.eigvals(jacobian(update, theta)).real.max() < 0)


def follow(update, theta: torch.Tensor, flow: dict) -> tuple[torch.Tensor, str]:
    """Follow the expected update's flow from θ along its path, ``flow['step']`` in the largest logit a step (the
    flow slows as logits grow, so the path, not the clock, is followed), trying Newton's method every
    ``flow['newton_every']`` steps. "stable": it reached a stable zero; "drifts": a logit passed DRIFT_BOUND;
    "still moving": neither within ``flow['steps']`` steps."""
    for step in range(flow["steps"]):
        if step % flow["newton_every"] == 0:
            candidate, converged = _newton(update, theta, iterations=12)
            if converged and is_stable(update, candidate):
                return candidate, "stable"
        value = update(theta)
        theta = theta + flow["step"] * value / value.abs().max()
        if _saturated(update.family, theta):
            return theta, "drifts"
    return theta, "still moving"


@dataclass
class FixedPoint:
    theta: torch.Tensor
    status: str  # "stable" (a stable zero of u), or where the followed update goes: "drifts" / "still moving"


def beta_ladder(betas, rungs: int = 13) -> list[float]:
    """The β grid with rungs from strong regularisation (β ≥ 30, where every end point neighbours the reference)
    down to its smallest β, largest first: the path of a continuation."""
    return sorted(set(np.geomspace(max(30.0, *betas), min(betas), rungs).tolist()) | set(betas), reverse=True)


def fixed_point_branch(
    family: Family, rewards: torch.Tensor, spec_name: str, betas, flow: dict, update_of=None
) -> dict:
    """{β: FixedPoint} for one configuration, by continuation from the reference down ``beta_ladder(betas)``:
    Newton's method from the previous rung's fixed point. At a β of ``betas`` where it finds no stable zero, the
    update is followed from the reference instead (``follow``). ``update_of(spec)``: the expected update of a spec
    (default: ExpectedUpdate, RLOO)."""
    update_of = update_of or (lambda spec: ExpectedUpdate(family, rewards, spec))
    points, start = {}, family.reference_theta()
    for beta in beta_ladder(betas):
        update = update_of(kl.KLSpec.from_name(spec_name, beta))
        theta, converged = _newton(update, start)
        if converged and is_stable(update, theta):
            points[beta], start = FixedPoint(theta, "stable"), theta
        elif beta in betas:
            theta, status = follow(update, family.reference_theta(), flow)
            points[beta] = FixedPoint(theta, status)
            if status == "stable":
                start = theta
    return {beta: points[beta] for beta in betas}


def fixed_point_table(family: Family, reward: dict, configs, betas, flow: dict, update_of=None) -> pd.DataFrame:
    """One row per (configuration, β): the fixed point (or where the update goes) against the family's optimum.

    Columns: reward, kl (to the reference), objective J_β, the optimum's reward, kl and objective, the reference's
    reward, the gap J_β(optimum) − J_β(fixed point) and KL(π_fixed ‖ π_optimum); with the status and the
    unconstrained optimum's objective (π*_β, which the parametric family cannot reach)."""
    rewards = task_reward(family.sequences, reward)
    optima = optimum_sweep(family, rewards, betas)
    reference_reward = policy_metrics(family, family.reference_logprobs().sum(-1), rewards, 1.0)["reward"]
    rows = []
    for config in configs:
        for beta, point in fixed_point_branch(family, rewards, config, betas, flow, update_of).items():
            seq_logp = family.sequence_logprobs(point.theta).detach()
            fixed = policy_metrics(family, seq_logp, rewards, beta)
            optimum_logp = family.sequence_logprobs(optima[beta])
            best = policy_metrics(family, optimum_logp, rewards, beta)
            rows.append(
                dict(
                    family=family.name,
                    config=config,
                    beta=beta,
                    status=point.status,
                    reward=fixed["reward"],
                    kl=fixed["kl"],
                    objective=fixed["objective"],
                    optimum_reward=best["reward"],
                    optimum_kl=best["kl"],
                    optimum_objective=best["objective"],
                    reference_reward=reference_reward,
                    objective_gap=best["objective"] - fixed["objective"],
                    kl_to_optimum=kl_between(seq_logp, optimum_logp),
                    unconstrained_objective=unconstrained_objective(family, rewards, beta),
                    theta=" ".join(f"{v:.6g}" for v in point.theta.tolist()),
                )
            )
    return pd.DataFrame(rows)


def optimum_sweep(family: Family, rewards: torch.Tensor, betas) -> dict:
    """{β: θ of the family's optimum}, by continuation down ``beta_ladder(betas)``, each search started from the
    previous rung's optimum."""
    optima, start = {}, family.reference_theta()
    for beta in beta_ladder(betas, rungs=25):
        optima[beta] = start = family_optimum(family, rewards, beta, start)
    return {beta: optima[beta] for beta in betas}


def frontier(family: Family, reward: dict, betas) -> pd.DataFrame:
    """The exact reward–KL frontier: the family's optimum for each β."""
    rewards = task_reward(family.sequences, reward)
    return pd.DataFrame(
        [
            dict(
                family=family.name, beta=beta, **policy_metrics(family, family.sequence_logprobs(theta), rewards, beta)
            )
            for beta, theta in optimum_sweep(family, rewards, betas).items()
        ]
    )


# ------------------------------------------------------------------------------------------------ Monte Carlo training


def _gather_tokens(per_sequence: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """(..., 2^T, T) token values of every sequence, at the sampled sequence indices (..., n): (..., n, T)."""
    return torch.gather(per_sequence, -2, index.unsqueeze(-1).expand(*index.shape, per_sequence.shape[-1]))


def _run_seed(seed: int, family: str, config: str, mode: str, normalisation: str = "rloo") -> int:
    """Each run's stream; RLOO's is the one the toy's default always had (its name is not hashed)."""
    name = f"{family}/{config}/{mode}" + ("" if normalisation == "rloo" else f"/{normalisation}")
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63


def train_monte_carlo(
    family: Family, reward: dict, config: str, betas, settings: dict, mode: str, normalisation: str = "rloo"
) -> pd.DataFrame:
    """Train the configuration from the reference by sampled updates, every β of ``betas`` × ``settings['seeds']``
    seeds in one batch; one row per (β, seed) with the end point (the last iterate). ``normalisation``: the
    advantage's (kl.ADVANTAGES; batch_std over each run's generation batch of groups × group_size rewards).

    ``mode``: "on-policy" (one update per generation batch) or "off-policy" (``settings['updates_per_batch']``
    minibatch updates per batch, the trainer's clipped ratios, the reward's KL from the sampling policy)."""
    updates = 1 if mode == "on-policy" else settings["updates_per_batch"]
    seeds, steps, groups, group_size = settings["seeds"], settings["steps"], settings["groups"], settings["group_size"]
    if groups % updates:
        raise ValueError(f"toy.fixed_points.monte_carlo.groups ({groups}) must split into {updates} minibatches")
    spec = kl.KLSpec.from_name(config, 1.0)  # β = 1: β itself is the factor below (kl's penalties are linear in it)
    beta = torch.tensor(sorted(betas), dtype=DTYPE)
    beta_seq, beta_tok = beta.view(-1, 1, 1, 1), beta.view(-1, 1, 1, 1, 1)
    rewards = task_reward(family.sequences, reward)
    ref_token_logp = family.reference_logprobs()
    generator = torch.Generator().manual_seed(_run_seed(settings["seed"], family.name, config, mode, normalisation))
    theta = family.reference_theta().expand(len(beta), seeds, -1).clone().requires_grad_(True)
    # Adam, as the trainer (element-wise, so every (β, seed) run is its own), with a step that decays as 1/(1 + k/k0)
    # so that the last iterate settles on a fixed point instead of hovering around it.
    optimizer = torch.optim.Adam([theta], lr=settings["learning_rate"])
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 / (1 + step / settings["decay_steps"]))
    per_update = groups // updates
    for _ in range(steps):
        with torch.no_grad():
            token_logp = family.token_logprobs(theta)  # (B, S, 2^T, T)
            probs = token_logp.sum(-1).exp().reshape(-1, token_logp.shape[-2])
            index = torch.multinomial(probs, groups * group_size, True, generator=generator)
            index = index.reshape(len(beta), seeds, groups * group_size)
            old_logp = _gather_tokens(token_logp, index).reshape(len(beta), seeds, groups, group_size, -1)
            ref_logp = ref_token_logp[index].reshape(old_logp.shape)
            mask = torch.ones_like(old_logp)
            task = rewards[index].reshape(old_logp.shape[:-1])
            shaped = task - beta_seq * kl.reward_penalty(old_logp, ref_logp, mask, spec)
            advantages = kl.ADVANTAGES[normalisation](shaped)
        for update in range(updates):
            part = slice(update * per_update, (update + 1) * per_update)
            logp = _gather_tokens(family.token_logprobs(theta), index).reshape(old_logp.shape)[:, :, part]
            old = old_logp[:, :, part] if updates > 1 else None  # on-policy: π_old = sg[π_θ], as the trainer
            per_token = kl.clipped_surrogate(
                logp, logp.detach() if old is None else old, advantages[:, :, part], *[settings["epsilon"]] * 2
            ) + beta_tok * kl.loss_penalty(logp, ref_logp[:, :, part], mask[:, :, part], spec, old_logp=old)
            tokens = per_token[0, 0].numel()  # the trainer's token-sum normalisation: all tokens of the minibatch
            optimizer.zero_grad()
            (per_token.sum() / tokens).backward()
            optimizer.step()
        schedule.step()
    return _end_points(family, rewards, config, mode, beta, theta.detach())


def _end_points(family, rewards, config, mode, beta, theta) -> pd.DataFrame:
    rows = []
    for b, value in enumerate(beta.tolist()):
        for seed, end in enumerate(theta[b]):
            metrics = policy_metrics(family, family.sequence_logprobs(end), rewards, value)
            rows.append(dict(family=family.name, config=config, mode=mode, beta=value, seed=seed, **metrics))
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------------ the whole section


def family_of(section: dict, name: str) -> Family:
    """The family ``name`` of config ``toy.fixed_points``."""
    return Family(name, section["length"], **section["reference"])


def frontier_betas(section: dict) -> list[float]:
    """The drawn frontier's β grid with the fixed points' own β in it, so that in the figure an end point on the
    optimum sits on a node of the line rather than on a chord (which a concave frontier leaves below the curve); the
    tables read the frontier exactly (below_frontier)."""
    grid = section["frontier_betas"]
    return sorted(set(np.geomspace(grid["min"], grid["max"], grid["points"]).tolist()) | set(section["betas"]))


def exact_tables(section: dict, configs, family_name: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(fixed points of every configuration × β, the frontier) for one family."""
    family = family_of(section, family_name)
    points = fixed_point_table(family, section["reward"], configs, section["betas"], section["flow"])
    return points, frontier(family, section["reward"], frontier_betas(section))


# Agreement of a Monte Carlo end point with the exact fixed point: the seeds' mean within AGREEMENT_Z standard errors
# of it (or within ROUNDING: the seeds of K1 in the reward sit on the optimum to float64 rounding, where their standard
# error is of that size too), and, where the fixed point is off the family's optimum, nearer it than the optimum in
# reward. The second clause is what lets agreement tell a biased configuration from an unbiased one: runs sitting on
# the optimum with seeds spread wide enough would otherwise be within AGREEMENT_Z errors of a fixed point close to it.
AGREEMENT_Z, ROUNDING = 4.0, 1e-9


def agreement(end_points: pd.DataFrame, points: pd.DataFrame) -> pd.DataFrame:
    """Per (family, mode, configuration, β): the seeds' mean end reward and KL with their standard errors, the exact
    fixed point's, z and whether they agree (only where the exact update has a stable fixed point)."""
    keys = ["family", "config", "beta"]
    summary = end_points.groupby(["family", "mode", "config", "beta"]).agg(
        seeds=("seed", "nunique"),
        mc_reward=("reward", "mean"),
        mc_reward_se=("reward", "sem"),
        mc_kl=("kl", "mean"),
        mc_kl_se=("kl", "sem"),
    )
    exact = points[keys + ["status", "reward", "kl", "optimum_reward"]]
    merged = summary.reset_index().merge(exact, on=keys, how="left")
    for metric in ("reward", "kl"):
        difference = merged[f"mc_{metric}"] - merged[metric]
        with np.errstate(divide="ignore", invalid="ignore"):
            merged[f"z_{metric}"] = difference / merged[f"mc_{metric}_se"]
        merged[f"agrees_{metric}"] = (merged[f"z_{metric}"].abs() <= AGREEMENT_Z) | (difference.abs() <= ROUNDING)
    on_optimum = (merged.reward - merged.optimum_reward).abs() <= ROUNDING
    merged["nearer_than_optimum"] = on_optimum | (
        (merged.mc_reward - merged.reward).abs() < (merged.mc_reward - merged.optimum_reward).abs()
    )
    stable = merged.status == "stable"
    agrees = merged.agrees_reward & merged.agrees_kl & merged.nearer_than_optimum
    merged["agrees"] = np.where(stable, agrees, np.nan)
    return merged.drop(columns="optimum_reward")


def toy_claims(end_points: pd.DataFrame, points: pd.DataFrame, claims: dict, rule: dict, tolerance: float):
    """The toy's claims (config ``toy.fixed_points.claims``), judged by the claims table's own function
    (claims.judged) on the Monte Carlo end points' task reward E_π[R]: per seed u, d_u = E[R] at the candidate's end
    point u − E[R] at the baseline (the family's optimum, exact; or another configuration's end point of the same seed
    index), with the exact fixed points' own difference beside it (``exact_effect``: what the seeds estimate).

    Why the reward. It is linear in π, so the seeds' mean is the reward of their mean end point: the scatter of the
    runs around their fixed point averages out. J_β is maximal at the optimum, so every run's scatter lowers it (it
    is second order in the distance, as KL(π‖π*_β) is, and KL(π‖π_ref) is convex): a one-sided test of "below the
    optimum in J" is shown for runs that sit on it. On the frontier the reward fixes the point; off it, a point with
    the optimum's reward has more KL, so "the optimum's reward" is what a same claim here says, no more.

    Why the tolerance. Every claim is judged against ± tolerance × (E[R] at the optimum − E[R] at π_ref), the reward
    the optimum gains over the reference at that β, so that the bound shrinks with β as the gain does: a same claim is
    shown when the whole interval lies inside it, a higher or lower one when it lies beyond it on the predicted side.
    With one bound for both, "ends at the optimum" and "ends above / below it" can never both be shown for one row.

    A configuration whose exact update has no stable fixed point (status "drifts" or "still moving"), on either side
    of a claim, is not testable: its runs stop wherever the step count leaves them, and no end point is there to
    compare."""
    from klstudy import claims as claims_rule

    exact = points.set_index(["family", "config", "beta"])
    rows = []
    for (family, mode, beta), runs in end_points.groupby(["family", "mode", "beta"]):
        by_config = runs.set_index(["config", "seed"]).reward
        optimum = points[(points.family == family) & (points.beta == beta)].iloc[0]  # every row has the optimum's
        gain = optimum.optimum_reward - optimum.reference_reward
        for name, claim in claims.items():
            sides = [claim["candidate"]] + ([] if claim["baseline"] == "optimum" else [claim["baseline"]])
            if not all(side in by_config.index.get_level_values(0) for side in sides):
                continue
            candidate = by_config.loc[claim["candidate"]]
            if claim["baseline"] == "optimum":
                exact_baseline = optimum.optimum_reward
                baseline = pd.Series(exact_baseline, index=candidate.index)
            else:
                exact_baseline = exact.loc[(family, sides[1], beta), "reward"]
                baseline = by_config.loc[claim["baseline"]]
            differences = (candidate - baseline).dropna()
            statuses = [exact.loc[(family, side, beta), "status"] for side in sides]
            seeds, se = len(differences), differences.sem()
            rows.append(
                dict(
                    claim=name, text=claim["text"], family=family, mode=mode, beta=beta, candidate=claim["candidate"],
                    baseline=claim["baseline"], predicted=claim["predicted"], bound=tolerance * gain,
                    candidate_mean=candidate.mean(), baseline_mean=baseline.mean(), effect=differences.mean(), se=se,
                    seeds=seeds, df=seeds - 1, exact_status=" / ".join(statuses),
                    exact_effect=exact.loc[(family, claim["candidate"], beta), "reward"] - exact_baseline,
                    why=None if set(statuses) == {"stable"} else "no fixed point",
                )
            )  # fmt: skip
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    untestable = [claims_rule.why_untestable(n, se) for n, se in zip(table.seeds, table.se, strict=True)]
    table["why"] = table.why.where(table.why.notna(), untestable)
    return claims_rule.judged(table, rule)


# ------------------------------------------------------------------------------------------------ figure and tables

EFFECTIVE_BETA_RANGE = (1e-2, 1e2)  # β_eff is searched in it; an end point whose KL is beyond it has none


class OptimumCurve:
    """KL(π*_β ‖ π_ref) of the family's optimum against β, and its inverse (``effective_beta``)."""

    def __init__(self, family: Family, rewards: torch.Tensor, points: int = 25):
        self.family, self.rewards = family, rewards
        # Down from the largest β, each optimum from the previous; the curve stops where the family has no interior
        # optimum any more (parametric, small β: the optimum's logits leave for the boundary).
        self.optima, start = {}, family.reference_theta()
        for beta in np.geomspace(*EFFECTIVE_BETA_RANGE, points)[::-1].tolist():
            try:
                self.optima[beta] = start = family_optimum(family, rewards, beta, start)
            except RuntimeError:
                break
        self.betas = np.array(sorted(self.optima))
        self.kls = np.array([self.kl_at(b, self.optima[b]) for b in self.betas])

    def kl_at(self, beta: float, start: torch.Tensor) -> float:
        return self.metrics_at(beta, start)["kl"]

    def metrics_at(self, beta: float, start: torch.Tensor) -> dict:
        theta = family_optimum(self.family, self.rewards, beta, start)
        return policy_metrics(self.family, self.family.sequence_logprobs(theta), self.rewards, beta)

    def frontier_reward(self, beta: float) -> float:
        """E[R] of the optimum at ``beta``: the most task reward any policy of the family has at that optimum's KL
        (the reward–KL frontier at KL = KL(π*_β ‖ π_ref)). NaN for a NaN β."""
        if not np.isfinite(beta):
            return float("nan")
        nearest = self.betas[np.argmin(np.abs(np.log(self.betas) - math.log(beta)))]
        return self.metrics_at(beta, self.optima[nearest])["reward"]

    def effective_beta(self, kl_value: float) -> float:
        """The β whose optimum has KL ``kl_value`` (NaN outside the curve's range of KL)."""
        if not self.kls.min() < kl_value < self.kls.max():
            return float("nan")
        # KL falls with β: the bracket is the last grid β whose KL is still above kl_value, and the next.
        i = int(np.nonzero(self.kls > kl_value)[0].max())
        low, high = self.betas[i], self.betas[i + 1]

        def gap(log_beta):
            beta = math.exp(log_beta)  # Newton's method from the nearer of the two grid optima
            start = self.optima[low if abs(log_beta - math.log(low)) < abs(log_beta - math.log(high)) else high]
            return self.kl_at(beta, start) - kl_value

        from scipy.optimize import brentq

        try:
            return math.exp(brentq(gap, math.log(low), math.log(high), xtol=1e-12, rtol=1e-12))
        except (ValueError, RuntimeError):  # the family's optimum not found between the two (parametric, small β)
            return float("nan")


def below_frontier(points: pd.DataFrame, section: dict) -> pd.Series:
    """How far below the frontier each end point lies: the most task reward any policy of its family has at the end
    point's KL, minus its reward. Exact: that policy is the family's optimum at the β whose optimum has this KL
    (OptimumCurve.effective_beta, Brent's method to 1e-12), so an end point on the optimum reads 0 to
    rounding. NaN beyond the optimum curve's range of KL (a point that drifted there is off it by construction: the
    frontier's reward is 1 at finite KL) and where the end point has no KL."""
    gaps = pd.Series(np.nan, index=points.index)
    for name, rows in points.groupby("family"):
        family = family_of(section, name)
        curve = OptimumCurve(family, task_reward(family.sequences, section["reward"]))
        for index, row in rows.iterrows():
            beta = curve.effective_beta(row.kl) if np.isfinite(row.kl) else float("nan")
            gaps[index] = curve.frontier_reward(beta) - row.reward
    return gaps


def write_tables(points: pd.DataFrame, agreed: pd.DataFrame, claims: pd.DataFrame, out_dir) -> None:
    """figures/toy_fixed_points.{csv,md} (every configuration × β × family against the optimum, with the Monte Carlo
    agreement) and figures/toy_claims.{csv,md}."""
    from pathlib import Path

    out_dir = Path(out_dir)
    table = points.merge(
        agreed.pivot_table(index=["family", "config", "beta"], columns="mode", values="agrees", aggfunc="first")
        .add_prefix("mc_agrees_")
        .reset_index(),
        on=["family", "config", "beta"],
        how="left",
    )
    table.to_csv(out_dir / "toy_fixed_points.csv", index=False)
    agreed.to_csv(out_dir / "toy_monte_carlo.csv", index=False)
    shown = table.assign(
        end=lambda t: t.status,
        reward=lambda t: t.reward.map("{:.3g}".format),
        kl=lambda t: t.kl.map("{:.3g}".format),
        optimum=lambda t: [f"{r:.3g} / {k:.3g}" for r, k in zip(t.optimum_reward, t.optimum_kl, strict=True)],
        gap=lambda t: t.objective_gap.map("{:.2g}".format),
        kl_to_optimum=lambda t: t.kl_to_optimum.map("{:.2g}".format),
        below_frontier=lambda t: t.below_frontier.map("{:.2g}".format),
    )
    columns = ["family", "config", "beta", "end", "reward", "kl", "optimum", "gap", "kl_to_optimum", "below_frontier"]
    (out_dir / "toy_fixed_points.md").write_text(
        "Where each configuration's expected update ends (exact, float64), against the optimum of J_β = E[R] − β·KL "
        "in the same family: reward and KL(π‖π_ref) at the end point, the optimum's reward / KL, the gap "
        "J_β(optimum) − J_β(end), KL(π_end ‖ π_optimum) and the reward below the frontier at the end point's KL (0 on "
        "the frontier: the optimum of another β). 'drifts': no fixed point; the update drives a logit past "
        f"±{DRIFT_BOUND:g} (reward and KL where it stopped). docs/fixed-points.md explains the table.\n\n"
        + shown[columns].to_markdown(index=False)
        + "\n"
    )
    claims.to_csv(out_dir / "toy_claims.csv", index=False)
    readable = claims.assign(
        effect=lambda t: [f"{e:+.2g} ± {s:.1g}" for e, s in zip(t.effect, t.se, strict=True)],
        exact=lambda t: t.exact_effect.map("{:+.2g}".format),
        tolerance=lambda t: t.bound.map("±{:.2g}".format),
        z=lambda t: t.z.map("{:.3g}".format),
    )
    columns = ["claim", "family", "mode", "beta", "candidate", "baseline", "predicted", "exact_status", "effect",
               "exact", "tolerance", "z", "seeds", "verdict"]  # fmt: skip
    (out_dir / "toy_claims.md").write_text(
        "The toy's claims, judged by the claims table's rule (config claims_rule; claims.judged) on the Monte Carlo "
        "end points' task reward: effect = mean over seeds of E_π[R] at the candidate's end point − E_π[R] at the "
        "baseline, ± its standard error; 'exact': the same difference between the exact end points, which the seeds "
        "estimate; tolerance: ± toy.fixed_points.tolerance × the reward the optimum gains over the reference at that "
        "β (same: shown with the whole interval effect ± critical·se inside it; higher, lower: shown beyond it). "
        "exact_status: the candidate's (and a configuration baseline's) exact end point; one that is not stable has "
        "no fixed point to compare, and the claim is not testable. docs/fixed-points.md explains the table.\n\n"
        + readable[columns].to_markdown(index=False)
        + "\n"
    )
