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
−log π_ref(1111) in the parametric one), so J_β there tends to 1 − β·KL∞. The optimum's KL against β, and the
effective β of an end point: effective_beta.py.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pandas as pd
import torch

from klstudy import kl
from klstudy.analysis import toy

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
        if advantage in kl.WHITENED:  # the enumerated groups are not a batch to whiten over: NormalisedUpdate is exact
            raise ValueError(f"ExpectedUpdate enumerates groups, not batches: {advantage!r} needs NormalisedUpdate")
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
# other member's reward replaced by its mean (batch_std with the policy's own spread, that of a batch of many groups;
# the whitening ones, kl.WHITENED, are their centre's advantage whitened with the batch's mean and spread, the same
# limit).
LINEAR_NORMALISATIONS = ("rloo", "mean", "batch_std", *kl.WHITENED)
ENUMERATION_LIMIT = 2_000_000  # (classes × multisets × G) per θ beyond which a non-linear one is not enumerated


@functools.cache
def _multisets(classes: int, group: int) -> tuple[torch.Tensor, ...]:
    """What NormalisedUpdate enumerates for groups of ``group`` members drawn from ``classes`` classes (shared by every
    β and configuration with them): the others' multisets ``others`` (M, G − 1) of class indices, their class
    ``counts`` (M, classes) and log multinomial coefficients (M,); and, since a member of class c with the others m
    is in the group {c} ∪ m, and every normalisation gives members of one class the same advantage, the groups to
    compute advantages on, each multiset of G classes once (``groups``, (K, G) sorted class indices: 1/4 of the
    (c, m) pairs at 16 classes and G = 5) with ``member`` (classes, M): where (c, m)'s own advantage is in the
    flattened (K, G) table."""
    others = list(itertools.combinations_with_replacement(range(classes), group - 1))
    counts = torch.nn.functional.one_hot(torch.tensor(others), classes).sum(-2).to(DTYPE)
    log_multinomial = torch.lgamma(torch.tensor(float(group), dtype=DTYPE)) - torch.lgamma(counts + 1).sum(-1)
    groups = list(itertools.combinations_with_replacement(range(classes), group))
    position = {members: k for k, members in enumerate(groups)}

    def where(c: int, rest: tuple) -> int:
        members = tuple(sorted((c, *rest)))
        return position[members] * group + members.index(c)

    member = torch.tensor([[where(c, rest) for rest in others] for c in range(classes)])
    return torch.tensor(others), counts, log_multinomial, torch.tensor(groups), member


class NormalisedUpdate:
    """u(θ) = −∇_θ E[loss]/T for one configuration with the advantage normalisation ``normalisation`` (kl.ADVANTAGES)
    and groups of ``group`` sequences, exact by exchangeability: the group's loss is the mean of its members', so

        E[loss] = Σ_y π(y)·Σ_t (−a_t(y)·log π_t(y) + β·K_t(y)),   a_t(y) = E[A_1,t | y_1 = y],

    where A_1,t is the normalisation's advantage of the group's first member at token t and the other G − 1 are drawn
    from π: the sequence's a(y) = E[A_1 | y_1 = y] at every token, less β·Σ_{s≥t} K_s(y) where the KL is placed in the
    advantage (kl.advantage_penalty), whitened for a WHITENED normalisation with the batch's token mean and spread in
    the limit of many groups (``_whitened``).
    a(y) is computed with kl.ADVANTAGES itself: for a normalisation linear in the other rewards, on the group whose
    other members all have the mean shaped reward; for the others (group_std, loo_std), on every multiset of the
    others' rewards, weighted by its multinomial probability. Without the KL in the reward the shaped reward is the
    task reward, so the multisets run over its values (2 for a 0/1 reward, any G); with it, over the sequences (2^T
    classes). batch_std is the limit of a batch of many groups, whose standard deviation is that of the shaped reward
    under π; so are the whitening normalisations.
    θ may carry leading batch dimensions (..., n_params)."""

    def __init__(self, family: Family, rewards: torch.Tensor, spec: kl.KLSpec, normalisation: str, group: int):
        if normalisation not in kl.ADVANTAGES or normalisation == "none" or group < 2:
            raise ValueError(f"normalisation {normalisation!r} with groups of {group}: not an exact update")
        self.family, self.spec, self.normalisation, self.group = family, spec, normalisation, group
        self.centre = kl.WHITENED.get(normalisation, normalisation)  # the advantage before any whitening
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
        if classes * math.comb(classes + group - 2, group - 1) * group > ENUMERATION_LIMIT:  # × the others' multisets
            raise ValueError(f"{normalisation} at G = {group} with {classes} classes: too many groups to enumerate")
        self.others, self.counts, self.log_multinomial, self.groups, self.member = _multisets(classes, group)
        # Without the KL in the reward the classes' shaped rewards are the task reward's values, whatever θ: so are
        # the advantages, computed here once.
        self.fixed_advantages = None if spec.in_reward else self._member_advantages(rewards[self.first])

    def _member_advantages(self, value: torch.Tensor) -> torch.Tensor:
        """A_1 of the group of a first member of class c and the others m, for every class c and multiset m:
        (..., classes, M), from each class's shaped reward ``value`` (..., classes)."""
        groups = value.index_select(-1, self.groups.flatten()).unflatten(-1, self.groups.shape)  # (..., K, G)
        advantages = kl.ADVANTAGES[self.normalisation](groups).flatten(-2)
        return advantages.index_select(-1, self.member.flatten()).unflatten(-1, self.member.shape)

    def conditional_advantages(self, token_logp: torch.Tensor) -> torch.Tensor:
        """a_t(y) = E[A_1,t | y_1 = y] for every token of every sequence under the policy of ``token_logp``
        (..., 2^T, T), detached."""
        token_logp = token_logp.detach()
        shaped = kl.shaped_rewards(self.task, token_logp, self.ref_logp, self.mask, self.spec)  # (..., 2^T)
        own = self._sequence_advantages(token_logp, shaped).unsqueeze(-1)
        per_token = own - kl.advantage_penalty(token_logp, self.ref_logp, self.mask, self.spec)
        if self.normalisation in kl.WHITENED:
            return self._whitened(per_token, token_logp.sum(-1).exp(), shaped)
        return per_token

    def _whitened(self, per_token: torch.Tensor, prob: torch.Tensor, shaped: torch.Tensor) -> torch.Tensor:
        """kl.whiten over a batch of many groups: (a_t − m)/√max(v, ε) with m and v the token mean and variance of
        A_1,t under π. E[A_1,t² | y] is a_t(y)² plus, for the group mean's centre, the variance the other members
        add, (G − 1)/G²·Var_π(shaped reward) (A_1 = (G − 1)/G·R_1 − Σ_{j>1} R_j/G)."""
        mean = (prob * per_token.mean(-1)).sum(-1)
        second = (prob * per_token.square().mean(-1)).sum(-1)
        if self.centre == "mean":
            centred = shaped - (prob * shaped).sum(-1, keepdim=True)
            second = second + (self.group - 1) / self.group**2 * (prob * centred.square()).sum(-1)
        variance = (second - mean.square()).clamp(min=kl.WHITEN_EPSILON)
        return (per_token - mean[..., None, None]) * variance.rsqrt()[..., None, None]

    def _sequence_advantages(self, token_logp: torch.Tensor, shaped: torch.Tensor) -> torch.Tensor:
        """a(y) = E[A_1 | y_1 = y] of the centre normalisation (before any per-token term or whitening): (..., 2^T)."""
        prob = token_logp.sum(-1).exp()
        mean = (prob * shaped).sum(-1, keepdim=True)
        if self.others is None:
            own = shaped.unsqueeze(-1)
            groups = torch.cat([own, mean.unsqueeze(-1).expand(*own.shape[:-1], self.group - 1)], -1)
            if self.centre == "batch_std":
                spread = (prob * (shaped - mean).square()).sum(-1, keepdim=True).sqrt().unsqueeze(-1)
                return kl.batch_std_advantages(groups.unsqueeze(-2), spread.unsqueeze(-1)).squeeze(-2)[..., 0]
            return kl.ADVANTAGES[self.centre](groups)[..., 0]
        classes = self.counts.shape[-1]
        class_prob = torch.zeros(*prob.shape[:-1], classes, dtype=DTYPE).index_add_(-1, self.classes, prob)
        advantages = self.fixed_advantages
        if advantages is None:
            advantages = self._member_advantages(shaped[..., self.first])  # each class's shaped reward: one value
        log_weight = self.log_multinomial + (torch.xlogy(self.counts, class_prob.unsqueeze(-2))).sum(-1)  # (..., M)
        advantage = (advantages * log_weight.exp().unsqueeze(-2)).sum(-1)
        return advantage[..., self.classes]

    def __call__(self, theta: torch.Tensor) -> torch.Tensor:
        theta = theta.detach().requires_grad_(True)
        token_logp = self.family.token_logprobs(theta)  # (..., 2^T, T)
        seq_logp = token_logp.sum(-1)
        score = -(self.conditional_advantages(token_logp) * token_logp).sum(-1)
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
    theta, slope = _newton_slope(update, theta, iterations)
    return theta, slope is not None


def stable_zero(update, theta: torch.Tensor, iterations: int = 40) -> tuple[torch.Tensor, bool]:
    """_newton's (θ, found), found only where it converged to a stable zero (is_stable's test, on the Jacobian its
    last step took at that θ: the same matrix, not computed twice)."""
    theta, slope = _newton_slope(update, theta, iterations)
    return theta, slope is not None and _attracting(slope)


def _newton_slope(update, theta: torch.Tensor, iterations: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """_newton's iterations: (θ, ∂u/∂θ at θ where it converged, else None)."""
    value = update(theta)
    for _ in range(iterations):
        slope = jacobian(update, theta)
        try:
            step = torch.linalg.solve(slope, value)
        except RuntimeError:  # singular: no isolated zero here
            return theta, None
        if not torch.isfinite(step).all():
            return theta, None
        if step.abs().max() < NEWTON_STEP:
            return theta, None if _saturated(update.family, theta) else slope
        scale = 1.0
        while scale > 1e-4:
            candidate = theta - scale * step
            candidate_value = update(candidate)
            if candidate_value.norm() < value.norm():
                theta, value = candidate, candidate_value
                break
            scale /= 2
        else:
            return theta, None
        if _saturated(update.family, theta):
            return theta, None
    return theta, None


def _saturated(family: Family, theta: torch.Tensor) -> bool:
    return bool(family.token_logits(theta).abs().max() > DRIFT_BOUND)


def is_stable(update: ExpectedUpdate, theta: torch.Tensor) -> bool:
    """Every eigenvalue of ∂u/∂θ has a negative real part: the expected update's flow is drawn to θ."""
    return _attracting(jacobian(update, theta))


def _attracting(slope: torch.Tensor) -> bool:
    return bool(torch.linalg.eigvals(slope).real.max() < 0)


def follow(update, theta: torch.Tensor, flow: dict) -> tuple[torch.Tensor, str]:
    """Follow the expected update's flow from θ along its path, ``flow['step']`` in the largest logit a step (the
    flow slows as logits grow, so the path, not the clock, is followed), trying Newton's method every
    ``flow['newton_every']`` steps. "stable": it reached a stable zero; "drifts": a logit passed DRIFT_BOUND;
    "still moving": neither within ``flow['steps']`` steps."""
    for step in range(flow["steps"]):
        if step % flow["newton_every"] == 0:
            candidate, found = stable_zero(update, theta, iterations=12)
            if found:
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
    family: Family, rewards: torch.Tensor, spec_name: str, betas, flow: dict, update_of=None, clamp=None
) -> dict:
    """{β: FixedPoint} for one configuration, by continuation from the reference down ``beta_ladder(betas)``:
    Newton's method from the previous rung's fixed point. At a β of ``betas`` where it finds no stable zero, the
    update is followed from the reference instead (``follow``). ``update_of(spec)``: the expected update of a spec
    (default: ExpectedUpdate, RLOO); ``clamp``: the spec's (a framework's clamp of the estimator's value)."""
    update_of = update_of or (lambda spec: ExpectedUpdate(family, rewards, spec))
    points, start = {}, family.reference_theta()
    for beta in beta_ladder(betas):
        update = update_of(kl.KLSpec.from_name(spec_name, beta, clamp=clamp))
        theta, found = stable_zero(update, start)
        if found:
            points[beta], start = FixedPoint(theta, "stable"), theta
        elif beta in betas:
            theta, status = follow(update, family.reference_theta(), flow)
            points[beta] = FixedPoint(theta, status)
            if status == "stable":
                start = theta
    return {beta: points[beta] for beta in betas}


def fixed_point_table(
    family: Family, reward: dict, configs, betas, flow: dict, update_of=None, clamp=None
) -> pd.DataFrame:
    """One row per (configuration, β): the fixed point (or where the update goes) against the family's optimum.

    Columns: reward, kl (to the reference), objective J_β, the optimum's reward, kl and objective, the reference's
    reward, the gap J_β(optimum) − J_β(fixed point) and KL(π_fixed ‖ π_optimum); with the status and the
    unconstrained optimum's objective (π*_β, which the parametric family cannot reach)."""
    rewards = task_reward(family.sequences, reward)
    optima = optimum_sweep(family, rewards, betas)
    reference_reward = policy_metrics(family, family.reference_logprobs().sum(-1), rewards, 1.0)["reward"]
    rows = []
    for config in configs:
        for beta, point in fixed_point_branch(family, rewards, config, betas, flow, update_of, clamp).items():
            seq_logp = family.sequence_logprobs(point.theta).detach()
            fixed = policy_metrics(family, seq_logp, rewards, beta)
            if optima[beta] is None:  # no optimum in the family at this β (optimum_sweep): its columns are NaN
                optimum_logp = torch.full_like(seq_logp, math.nan)
                best = dict.fromkeys(("reward", "kl", "objective"), math.nan)
            else:
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
    previous rung's optimum; None below the β where the parametric family's optimum leaves for the boundary (Newton's
    method finds none: its logits grow without bound as β → 0). Computed once per family, reward and β (the atlas
    asks for it with every setting)."""
    return dict(_optimum_sweep(family, tuple(rewards.tolist()), tuple(betas)))


@functools.lru_cache(maxsize=16)
def _optimum_sweep(family: Family, rewards: tuple, betas: tuple) -> dict:
    rewards = torch.tensor(rewards, dtype=DTYPE)
    optima, start = {}, family.reference_theta()
    for beta in beta_ladder(betas, rungs=25):
        try:
            optima[beta] = start = family_optimum(family, rewards, beta, start)
        except RuntimeError:
            optima[beta] = None
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
