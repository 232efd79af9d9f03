"""kl.py: estimator values, placements, advantages. Exact checks on small categorical distributions."""

import itertools
import math
from pathlib import Path

import pytest
import torch

from klstudy import kl

F64 = torch.float64


def categorical_pair(seed, size=5):
    generator = torch.Generator().manual_seed(seed)
    logp = torch.log_softmax(torch.randn(size, generator=generator, dtype=F64) * 1.5, -1)
    ref_logp = torch.log_softmax(torch.randn(size, generator=generator, dtype=F64) * 1.5, -1)
    return logp, ref_logp


def exact_kl(logp, ref_logp):
    return (logp.exp() * (logp - ref_logp)).sum()


def test_estimator_formulas_on_known_values():
    logp, ref_logp = torch.tensor([-1.0, -0.2], dtype=F64), torch.tensor([-0.5, -0.2], dtype=F64)
    log_ratio = logp - ref_logp  # [-0.5, 0]
    assert torch.allclose(kl.token_kl(logp, ref_logp, "k1"), log_ratio)
    assert torch.allclose(kl.token_kl(logp, ref_logp, "k2"), torch.tensor([0.125, 0.0], dtype=F64))
    r = torch.exp(ref_logp - logp)
    assert torch.allclose(kl.token_kl(logp, ref_logp, "k3"), r - 1 - torch.log(r))
    assert kl.token_kl(logp, ref_logp, "k3")[1] == 0


def test_k3_matches_trl_expression_bitwise():
    # TRL 1.16 GRPOTrainer: torch.exp(ref - logp) - (ref - logp) - 1
    generator = torch.Generator().manual_seed(0)  # unseeded, the draw depended on the tests run before it
    logp, ref_logp = torch.randn(64, dtype=F64, generator=generator), torch.randn(64, dtype=F64, generator=generator)
    trl_k3 = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
    assert torch.allclose(kl.token_kl(logp, ref_logp, "k3"), trl_k3, rtol=0, atol=1e-15)


@pytest.mark.parametrize("seed", range(5))
def test_k1_and_k3_are_unbiased_for_the_kl_value_exactly(seed):
    logp, ref_logp = categorical_pair(seed)
    truth = exact_kl(logp, ref_logp)
    for estimator in ("k1", "k3"):
        expectation = (logp.exp() * kl.token_kl(logp, ref_logp, estimator)).sum()
        assert torch.isclose(expectation, truth, rtol=1e-12, atol=1e-14), estimator
    k2 = (logp.exp() * kl.token_kl(logp, ref_logp, "k2")).sum()
    assert not torch.isclose(k2, truth, rtol=1e-3), "K2 is biased for the KL value"


def test_k3_is_nonnegative():
    logp, ref_logp = torch.randn(1000) * 3, torch.randn(1000) * 3
    assert (kl.token_kl(logp, ref_logp, "k3") >= 0).all()


def test_unknown_estimator_is_an_error():
    with pytest.raises(ValueError, match="k9"):
        kl.token_kl(torch.zeros(1), torch.zeros(1), "k9")


@pytest.mark.parametrize(
    "estimator,placement,beta,message",
    [("k9", "reward", 0.1, "estimator"), ("k1", "penalty", 0.1, "placement"), ("k1", "loss", -0.1, "beta")],
)
def test_klspec_rejects_bad_values(estimator, placement, beta, message):
    with pytest.raises(ValueError, match=message):
        kl.KLSpec(estimator, placement, beta)


def test_placement_flags():
    table = {
        (p, b): (kl.KLSpec("k1", p, b).in_reward, kl.KLSpec("k1", p, b).in_loss)
        for p, b in itertools.product(kl.PLACEMENTS, (0.0, 0.5))
    }
    assert table[("reward", 0.5)] == (True, False)
    assert table[("loss", 0.5)] == (False, True)
    assert table[("both", 0.5)] == (True, True)
    assert table[("none", 0.5)] == (False, False)
    assert table[("advantage", 0.5)] == (False, False)
    assert all(table[(p, 0.0)] == (False, False) for p in kl.PLACEMENTS), "beta = 0 means no KL anywhere"
    assert [p for p in kl.PLACEMENTS if kl.KLSpec("k1", p, 0.5).in_advantage] == ["advantage"]
    assert not kl.KLSpec("k1", "advantage", 0.0).in_advantage


def batch(seed=0, groups=3, group_size=4, length=6):
    generator = torch.Generator().manual_seed(seed)
    logp = -torch.rand(groups, group_size, length, generator=generator, dtype=F64).requires_grad_()
    ref_logp = -torch.rand(groups, group_size, length, generator=generator, dtype=F64)
    mask = (torch.rand(groups, group_size, length, generator=generator, dtype=F64) > 0.2).double()
    rewards = (torch.rand(groups, group_size, generator=generator, dtype=F64) > 0.5).double()
    return logp, ref_logp, mask, rewards


def test_reward_penalty_is_stop_gradient_masked_sum():
    logp, ref_logp, mask, _ = batch()
    spec = kl.KLSpec("k3", "reward", 0.3)
    penalty = kl.reward_penalty(logp, ref_logp, mask, spec)
    assert not penalty.requires_grad
    expected = 0.3 * ((torch.exp(ref_logp - logp) - 1 - (ref_logp - logp)) * mask).sum(-1)
    assert torch.allclose(penalty, expected.detach())
    assert torch.equal(
        kl.reward_penalty(logp, ref_logp, mask, kl.KLSpec("k3", "loss", 0.3)), torch.zeros(3, 4, dtype=F64)
    )


def test_to_go_sums_each_token_and_the_tokens_after_it():
    values = torch.tensor([[1.0, 2.0, 3.0, 4.0]], dtype=F64)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]], dtype=F64)
    torch.testing.assert_close(kl.to_go(values, mask), torch.tensor([[6.0, 5.0, 3.0, 0.0]], dtype=F64))


def test_advantage_penalty_is_the_stop_gradient_kl_to_go():
    """OpenRLHF's reward −β·K_t per token summed to go (γ = 1): β·Σ_{s≥t} sg[K_s] on unmasked tokens."""
    logp, ref_logp, mask, _ = batch()
    spec = kl.KLSpec("k1", "advantage", 0.3, clamp=0.2)
    penalty = kl.advantage_penalty(logp, ref_logp, mask, spec)
    assert not penalty.requires_grad
    k1 = ((logp - ref_logp).clamp(-0.2, 0.2) * mask).detach()
    expected = 0.3 * torch.stack([k1[..., t:].sum(-1) for t in range(k1.shape[-1])], -1)
    torch.testing.assert_close(penalty, expected, rtol=0, atol=1e-15)
    assert (penalty[..., 0] - 0.3 * k1.sum(-1)).abs().max() < 1e-15, "the first token carries the sequence's KL"
    for placement in ("reward", "loss", "both", "none"):
        assert not kl.advantage_penalty(logp, ref_logp, mask, kl.KLSpec("k1", placement, 0.3)).any()


def test_whitening_is_openrlhfs_by_hand():
    """OpenRLHF 0.11 (experience_maker.compute_advantages_and_returns): the mean and the variance (÷ n, no Bessel) of
    the unmasked tokens, (A − mean)·rsqrt(max(var, 1e-8)), masked tokens shifted and scaled as well."""
    values = torch.tensor([[[1.0, 3.0], [5.0, 100.0]]], dtype=F64)
    mask = torch.tensor([[[1.0, 1.0], [1.0, 0.0]]], dtype=F64)
    mean, variance = 3.0, 8.0 / 3.0
    expected = (values - mean) / variance**0.5
    torch.testing.assert_close(kl.whiten(values, mask, (-3, -2, -1)), expected, rtol=0, atol=1e-15)
    flat = torch.full((1, 2, 2), 7.0, dtype=F64)  # no spread: the variance's floor, not a division by zero
    assert kl.whiten(flat, torch.ones_like(flat), (-3, -2, -1)).abs().max() == 0


def test_token_advantages_add_the_penalty_before_whitening():
    logp, ref_logp, mask, rewards = batch(groups=4)
    spec = kl.KLSpec("k1", "advantage", 0.5)
    penalty = kl.advantage_penalty(logp, ref_logp, mask, spec)
    for name in ("rloo", "mean", "group_std", "loo_std"):  # no whitening: the sequence's advantage minus the penalty
        expected = kl.ADVANTAGES[name](rewards).unsqueeze(-1) - penalty
        torch.testing.assert_close(kl.token_advantages(rewards, penalty, mask, name), expected, rtol=0, atol=0)
    got = kl.token_advantages(rewards, penalty, mask, "group_whiten")
    expected = kl.whiten(kl.group_mean_advantages(rewards).unsqueeze(-1) - penalty, mask, (-3, -2, -1))
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    unmasked = got[mask == 1]
    assert abs(float(unmasked.mean())) < 1e-12 and abs(float(unmasked.var(unbiased=False)) - 1) < 1e-12
    # Without a penalty and with every token unmasked, token whitening is the sequence-level whitening of ADVANTAGES.
    ones, zeros = torch.ones_like(mask), torch.zeros_like(penalty)
    for name in kl.WHITENED:
        torch.testing.assert_close(
            kl.token_advantages(rewards, zeros, ones, name), kl.ADVANTAGES[name](rewards).unsqueeze(-1).expand_as(ones)
        )


def test_k1_in_the_advantage_has_the_sequence_kls_gradient_exactly():
    """The reward-to-go of K1 is unbiased: E[Σ_t ∇log π_t·Σ_{s≥t} K1_s] = ∇KL(π‖π_ref) over whole sequences, by
    enumeration of every binary sequence of length 3 under a tabular autoregressive policy; K3's is not."""
    length, generator = 3, torch.Generator().manual_seed(5)
    sequences = torch.tensor(list(itertools.product([0.0, 1.0], repeat=length)), dtype=F64)  # (8, T)
    prefix = [[int("".join(str(int(b)) for b in y[:t]) or "0", 2) + 2**t - 1 for t in range(length)] for y in sequences]
    prefix = torch.tensor(prefix)  # each (sequence, t): the index of its prefix's logit
    theta = torch.randn(2**length - 1, generator=generator, dtype=F64).requires_grad_()
    ref_theta = torch.randn(2**length - 1, generator=generator, dtype=F64)

    def token_logp(logits):
        return -torch.nn.functional.softplus(torch.where(sequences == 1, -1.0, 1.0) * logits[prefix])

    logp, ref_logp = token_logp(theta), token_logp(ref_theta)
    weights = logp.sum(-1).exp().detach()
    exact_kl_value = (logp.sum(-1).exp() * (logp - ref_logp).sum(-1)).sum()
    (kl_gradient,) = torch.autograd.grad(exact_kl_value, theta, retain_graph=True)
    gradients = {}
    for estimator in ("k1", "k3"):
        spec, ones = kl.KLSpec(estimator, "advantage", 1.0), torch.ones_like(logp)
        loss = kl.reinforce_loss(logp.unsqueeze(-2), ref_logp.unsqueeze(-2), ones.unsqueeze(-2),
                                 torch.zeros(8, 1, dtype=F64), spec, "none")  # fmt: skip
        (gradients[estimator],) = torch.autograd.grad((weights * loss).sum(), theta, retain_graph=True)
    torch.testing.assert_close(gradients["k1"], kl_gradient, rtol=0, atol=1e-14)
    assert (gradients["k3"] - kl_gradient).abs().max() > 1e-3


def test_loss_penalty_is_differentiable_masked_and_weighted():
    logp, ref_logp, mask, _ = batch()
    spec = kl.KLSpec("k1", "loss", 0.2)
    per_token = kl.loss_penalty(logp, ref_logp, mask, spec)
    assert per_token.requires_grad
    assert torch.allclose(per_token, 0.2 * (logp - ref_logp) * mask)
    assert (per_token[mask == 0] == 0).all()
    (grad,) = torch.autograd.grad(per_token.sum(), logp)
    assert torch.allclose(grad, 0.2 * mask), "d(beta*K1)/dlogp = beta on unmasked tokens"
    assert not kl.loss_penalty(logp, ref_logp, mask, kl.KLSpec("k1", "reward", 0.2)).any()


def _logp_gradient(per_token, logp):
    (grad,) = torch.autograd.grad(per_token.sum(), logp)
    return grad


@pytest.mark.parametrize("estimator", kl.ESTIMATORS)
def test_each_loss_gradient_has_the_value_and_gradient_its_framework_gives(estimator):
    """Value β·K_t on-policy for every way of differentiating the loss term; d/dlog π per token as kl.py's table:
    pathwise ∇K, ratio and score ∇K + K, st and isst K1 (the gradient of K2). Off-policy (π_old given): ratio is
    ω·K with gradient ω·(∇K + K), isst keeps the value K with gradient sg[ω]·K1, score and st ignore π_old."""
    logp, ref_logp, mask, _ = batch()
    beta = 0.3
    k = kl.token_kl(logp, ref_logp, estimator).detach()
    k1 = (logp - ref_logp).detach()
    dk = {"k1": torch.ones_like(k), "k2": k1, "k3": 1 - torch.exp(ref_logp - logp).detach()}[estimator]
    on_policy = {"pathwise": dk, "ratio": dk + k, "score": dk + k, "st": k1, "isst": k1}
    old_logp = logp.detach() + 0.2 * torch.randn(logp.shape, generator=torch.Generator().manual_seed(3), dtype=F64)
    omega = torch.exp(logp.detach() - old_logp)
    off_policy = {"pathwise": (k, dk), "ratio": (omega * k, omega * (dk + k)), "score": (k, dk + k), "st": (k, k1),
                  "isst": (k, omega * k1)}  # fmt: skip
    for gradient in kl.LOSS_GRADIENTS:
        spec = kl.KLSpec(estimator, "loss", beta, gradient)
        per_token = kl.loss_penalty(logp, ref_logp, mask, spec)
        torch.testing.assert_close(per_token, beta * k * mask, msg=f"{spec.name}: value on-policy")
        torch.testing.assert_close(_logp_gradient(per_token, logp), beta * on_policy[gradient] * mask)
        per_token = kl.loss_penalty(logp, ref_logp, mask, spec, old_logp=old_logp)
        value, grad = off_policy[gradient]
        torch.testing.assert_close(per_token, beta * value * mask, msg=f"{spec.name}: value off-policy")
        torch.testing.assert_close(_logp_gradient(per_token, logp), beta * grad * mask)


def test_rloo_is_leave_one_out_mean():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0, 1.0], [0.3, -2.0, 5.0, 0.0, 1.0]], dtype=F64)
    advantages = kl.rloo_advantages(rewards)
    for g in range(2):
        for i in range(5):
            others = torch.cat([rewards[g, :i], rewards[g, i + 1 :]])
            assert torch.isclose(advantages[g, i], rewards[g, i] - others.mean())
    assert torch.allclose(kl.group_mean_advantages(rewards), advantages * 4 / 5)
    with pytest.raises(ValueError):
        kl.rloo_advantages(torch.ones(3, 1))


def test_rloo_includes_the_reward_kl_penalty():
    logp, ref_logp, mask, rewards = batch()
    spec = kl.KLSpec("k1", "reward", 0.5)
    shaped = kl.shaped_rewards(rewards, logp, ref_logp, mask, spec)
    k1 = ((logp - ref_logp) * mask).sum(-1).detach()
    assert torch.allclose(kl.rloo_advantages(shaped), kl.rloo_advantages(rewards - 0.5 * k1))


def test_reinforce_loss_gradient_is_the_papers_estimate():
    """-∇loss = mean_i (R_i - β K_i - b_i) ∇log π(y_i) - β mean_i Σ_t ∇K_t, for 'both' with RLOO."""
    logp, ref_logp, mask, rewards = batch()
    beta = 0.4
    loss = kl.reinforce_loss(logp, ref_logp, mask, rewards, kl.KLSpec("k3", "both", beta), "rloo").sum()
    (grad,) = torch.autograd.grad(loss, logp)
    k3 = (torch.exp(ref_logp - logp) - 1 - (ref_logp - logp)).detach()
    advantage = kl.rloo_advantages(rewards - beta * (k3 * mask).sum(-1))
    group_size = logp.shape[1]
    # d/dlogp of the score term: -A_i mask / G ; of the path term: β (1 - r) mask / G
    expected = (-advantage.unsqueeze(-1) + beta * (1 - torch.exp(ref_logp - logp).detach())) * mask / group_size
    assert torch.allclose(grad, expected)


def test_a_configuration_name_is_read_in_one_place():
    assert kl.KLSpec.from_name("k3-loss", 0.1) == kl.KLSpec("k3", "loss", 0.1)
    none = kl.KLSpec.from_name("none", 0.5)  # no KL: β is 0 whatever the grid says
    assert (none.estimator, none.placement, none.beta) == (None, "none", 0.0)
    assert not none.in_reward and not none.in_loss
    assert none.name == "none" and kl.KLSpec.from_name("k1-both", 1).name == "k1-both"
    assert kl.KLSpec.from_name("k3-loss-ratio", 0.1) == kl.KLSpec("k3", "loss", 0.1, "ratio")
    for name in ("k1-both-st", "k3-loss-isst", "k2-loss-score"):
        assert kl.KLSpec.from_name(name, 1).name == name
    bad_names = ("k9-loss", "k1-none", "k1", "none-loss", "K1-loss", "k1-loss ", "k1-reward-ratio",
                 "k3-loss-pathwise", "k3-loss-ratio-st", "k3-loss-")  # fmt: skip
    for bad in bad_names:
        with pytest.raises(ValueError, match="is not 'none' or"):
            kl.KLSpec.from_name(bad, 0.1)
    with pytest.raises(ValueError, match="needs a loss term"):
        kl.KLSpec("k1", "reward", 0.1, "ratio")
    with pytest.raises(ValueError, match="estimator None"):
        kl.KLSpec(None, "loss", 0.1)


def test_the_schema_and_the_workflow_take_the_grammar_from_kl():
    from klstudy.config import load_schema

    definitions = load_schema()["$defs"]
    assert definitions["kl_config"]["pattern"] == f"^({kl.NAME_PATTERN})$"
    assert definitions["estimator"]["enum"] == list(kl.ESTIMATORS)
    assert definitions["placement"]["enum"] == list(kl.PLACEMENTS)
    assert definitions["loss_gradient"]["enum"] == list(kl.LOSS_GRADIENTS)
    assert definitions["normalisation"]["enum"] == [name for name in kl.ADVANTAGES if name != "none"]
    assert set(kl.LOSS_GRADIENT_SOURCES) == set(kl.LOSS_GRADIENTS)
    common = (Path(__file__).resolve().parents[1] / "workflow/rules/common.smk").read_text()
    assert "kl=NAME_PATTERN" in common


def test_each_normalisation_by_hand():
    """Group mean, ÷ the group's std and ÷ the batch's std (Bessel-corrected, + 1e-4 as TRL), on two groups."""
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 5.0]], dtype=torch.float64)
    centred = torch.tensor([[0.5, -0.5, -0.5, 0.5], [-0.75, -0.75, -0.75, 2.25]], dtype=torch.float64)
    torch.testing.assert_close(kl.group_mean_advantages(rewards), centred)
    group_std = torch.tensor([[(1 / 3) ** 0.5], [1.5]], dtype=torch.float64)
    torch.testing.assert_close(kl.group_std_advantages(rewards), centred / (group_std + 1e-4))
    batch_std = rewards.flatten().std()
    torch.testing.assert_close(kl.batch_std_advantages(rewards), centred / (batch_std + 1e-4))
    # A group without spread has no advantage under any normalisation.
    for name in ("rloo", "mean", "group_std", "batch_std", "loo_std"):
        assert kl.ADVANTAGES[name](torch.ones(1, 3)).abs().max() == 0


def test_the_leave_one_out_std_by_hand():
    """NeMo-RL's: RLOO ÷ (the Bessel-corrected std of the other G − 1 rewards + 1e-6), undivided where the others
    agree; RLOO itself at G = 2. Increasing in the own reward, but not zero-sum: [1, 0, 0, 0] sums to 1 − √3."""
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0], [2.0, 2.0, 2.0, 5.0]], dtype=torch.float64)
    third = (1 / 3) ** 0.5  # std of [1, 0, 0]
    expected = torch.tensor(
        [[1.0, -(1 / 3) / (third + 1e-6), -(1 / 3) / (third + 1e-6), -(1 / 3) / (third + 1e-6)],
         [-1 / (3**0.5 + 1e-6), -1 / (3**0.5 + 1e-6), -1 / (3**0.5 + 1e-6), 3.0]],
        dtype=torch.float64,
    )  # fmt: skip
    torch.testing.assert_close(kl.loo_std_advantages(rewards), expected, rtol=0, atol=1e-15)
    assert float(kl.loo_std_advantages(rewards)[0].sum()) == pytest.approx(1 - 3**0.5, abs=1e-5)
    pair = torch.tensor([[0.3, 1.7], [1.0, 1.0]], dtype=torch.float64)
    torch.testing.assert_close(kl.loo_std_advantages(pair), kl.rloo_advantages(pair), rtol=0, atol=0)


def test_batch_std_takes_the_last_two_dimensions_as_the_batch():
    """Leading dimensions are independent runs (the toy trains many at once): each has its own batch std."""
    rewards = torch.rand(3, 5, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    together = kl.batch_std_advantages(rewards)
    for run in range(3):
        torch.testing.assert_close(together[run], kl.batch_std_advantages(rewards[run]))


@pytest.mark.parametrize("name", ["rloo", "mean", "group_std", "batch_std", "loo_std"])
def test_every_normalisation_is_zero_mean_and_increasing_in_the_own_reward(name):
    """What the tabular fixed-point derivation of docs/record/atlas-derivations.md needs of an
    advantage: Σ_i A_i = 0 in each group (RLOO
    and loo_std: not in a group), and A_1 strictly increasing in R_1 with the others fixed."""
    generator = torch.Generator().manual_seed(1)
    others = torch.rand(200, 1, 3, generator=generator, dtype=torch.float64)
    own = torch.linspace(-3, 3, 61, dtype=torch.float64).view(1, -1, 1)
    groups = torch.cat([own.expand(200, -1, 1), others.expand(-1, 61, -1)], -1)  # (200 draws, 61 values of R_1, G)
    advantages = kl.ADVANTAGES[name](groups.unsqueeze(-2)).squeeze(-2)  # batch_std: a batch of one group
    assert (advantages[..., 0].diff(dim=-1) > 0).all()
    if name not in ("rloo", "loo_std"):
        assert advantages.sum(-1).abs().max() < 1e-9 * max(1.0, float(advantages.abs().max()))


def _verl_low_var_kl(logprob, ref_logprob):
    """verl's kl_penalty "low_var_kl" (verl/trainer/ppo/core_algos.py), as it writes it, log-ratio clamp included."""
    kl_value = torch.clamp(ref_logprob - logprob, min=-20, max=20)
    return torch.clamp((torch.exp(kl_value) - kl_value - 1).contiguous(), min=-10, max=10)


def test_a_clamped_k3_is_verls_low_var_kl_in_value_and_gradient():
    """A clamp of 10 on K3: verl's (and OpenRLHF's) K3 to float rounding, extreme log-ratios included, and no gradient
    where the clamp binds; without a clamp, K3 as before (bitwise)."""
    generator = torch.Generator().manual_seed(0)
    logp = (torch.randn(4, 50, generator=generator, dtype=torch.float64) * 6).requires_grad_()
    ref = torch.randn(4, 50, generator=generator, dtype=torch.float64) * 6
    ours = kl.token_kl(logp, ref, "k3", clamp=10.0)
    theirs = _verl_low_var_kl(logp, ref)
    assert torch.allclose(ours, theirs, rtol=1e-12, atol=1e-12)
    clamped = ours.detach() >= 10
    assert 20 < int(clamped.sum()) < 180  # both sides of the clamp are exercised
    (gradient,) = torch.autograd.grad(ours.sum(), logp)
    (expected,) = torch.autograd.grad(theirs.sum(), logp)
    assert torch.allclose(gradient, expected) and (gradient[clamped] == 0).all() and (gradient[~clamped] != 0).all()
    assert torch.equal(kl.token_kl(logp, ref, "k3"), kl.token_kl(logp, ref, "k3", clamp=None))
    # K1 and K2 are clamped too where a clamp is given (OpenRLHF, AReaL and NeMo-RL clamp every estimator at 10)
    assert torch.equal(kl.token_kl(logp, ref, "k1", clamp=10.0), (logp - ref).clamp(-10, 10))
    assert torch.equal(kl.token_kl(logp, ref, "k2", clamp=10.0), (0.5 * (logp - ref).square()).clamp(max=10))


def test_the_clamp_reaches_the_reward_and_the_loss_and_is_checked():
    logp = torch.tensor([[0.0, -30.0, -1.0]], requires_grad=True)
    ref, mask = torch.tensor([[0.0, 0.0, 0.0]]), torch.ones(1, 3)
    spec = kl.KLSpec.from_name("k3-both", 0.5, clamp=10.0)
    expected = 0.5 * (0.0 + 10.0 + (math.exp(1.0) - 2.0))
    assert kl.reward_penalty(logp, ref, mask, spec).item() == pytest.approx(expected)
    assert kl.loss_penalty(logp, ref, mask, spec).sum().item() == pytest.approx(expected)
    (gradient,) = torch.autograd.grad(kl.loss_penalty(logp, ref, mask, spec).sum(), logp)
    assert gradient[0, 1] == 0 and gradient[0, 2] != 0
    with pytest.raises(ValueError, match="clamp"):
        kl.KLSpec.from_name("k3-loss", 0.1, clamp=0.0)


def _nemo_rl_calculate_kl(logprobs, logprobs_reference, kl_type, weights, input_clamp=20.0, output_clamp=10.0):
    """NeMo-RL v0.7.0's calculate_kl (nemo_rl/algorithms/utils.py), as it writes it: the log-ratio clamped, the weight
    detached where that clamp binds, the weight multiplied into the KL, then the output clamp."""
    logr = logprobs_reference - logprobs
    logr_clamped = logr.clamp(min=-input_clamp, max=input_clamp)
    weights = torch.where(logr == logr_clamped, weights, weights.detach())
    logr = logr_clamped
    value = {"k1": -logr, "k2": torch.square(logr) / 2, "k3": torch.exp(logr) - 1 - logr}[kl_type]
    return (weights * value).clamp(min=-output_clamp, max=output_clamp)


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])  # NeMo-RL's estimators (not every one kl.py may gain)
def test_a_weighted_correction_is_clamped_after_its_weight_as_nemo_rl_does(estimator):
    """NeMo-RL ≥ 0.7's score-form KL loss with its clamps (±20 on the log-ratio, ±10 on the weighted KL) is kl's
    ``score`` with clamp 10, in value and gradient, log-ratios far beyond both clamps included."""
    generator = torch.Generator().manual_seed(3)
    logp = (torch.randn(4, 40, generator=generator, dtype=F64) * 8).requires_grad_()
    ref = torch.randn(4, 40, generator=generator, dtype=F64) * 8
    spec = kl.KLSpec(estimator, "loss", 1.0, "score", clamp=10.0)
    ours = kl.loss_penalty(logp, ref, torch.ones_like(ref), spec)
    theirs = _nemo_rl_calculate_kl(logp, ref, estimator, torch.exp(logp - logp.detach()))
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12)
    gradient = _logp_gradient(ours, logp)
    torch.testing.assert_close(gradient, _logp_gradient(theirs, logp), rtol=0, atol=1e-12)
    binds = theirs.detach().abs() >= 10
    assert 10 < int(binds.sum()) < 150 and (gradient[binds] == 0).all()


# prime-rl's policy losses for stale batches, as its trainer wrote them (src/prime_rl/trainer/rl/loss.py): the
# "ratio" loss of commit e819f8a31 (August 2025, its default until 16 October 2025) and the masked loss of
# 7e2f0273f (16 October 2025), per token, before its masking and sum.
def prime_rl_ratio_loss(logprobs, old_logprobs, advantages, clip_ratio=8.0):
    importance_ratio = torch.exp(logprobs - old_logprobs)
    clipped_importance_ratio = torch.clamp(importance_ratio, 0, clip_ratio)
    return -clipped_importance_ratio * advantages


def prime_rl_masked_loss(logprobs, old_logprobs, advantages, mask_ratio_low=0.125, mask_ratio_high=8.0):
    importance_ratio = torch.exp(logprobs - old_logprobs)
    is_masked = (importance_ratio < mask_ratio_low) | (importance_ratio > mask_ratio_high)
    return (-importance_ratio * advantages) * ~is_masked


def stale_tokens():
    """Log-probs of 2 sequences × 6 tokens whose ratios ω = π_θ/π_old span both sides of every bound (0.05 … 12)."""
    ratios = torch.tensor([[0.05, 0.5, 0.9, 1.0, 1.1, 3.0], [12.0, 0.1, 6.0, 0.7, 9.0, 0.2]], dtype=torch.float64)
    old = torch.log(torch.rand(2, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 0.5 + 0.1)
    logp = (old + ratios.log()).requires_grad_()
    return logp, old, torch.tensor([1.5, -0.7], dtype=torch.float64)


@pytest.mark.parametrize("name, prime_rl", [("truncated_is", prime_rl_ratio_loss), ("masked_is", prime_rl_masked_loss)])
def test_prime_rls_losses_are_its_own_in_value_and_gradient(name, prime_rl):
    logp, old, advantages = stale_tokens()
    ours = kl.policy_surrogate(name, logp, old, advantages, 0.2, 0.2)
    theirs = prime_rl(logp, old, advantages.unsqueeze(-1))
    torch.testing.assert_close(ours, theirs)
    (ours_grad,) = torch.autograd.grad(ours.sum(), logp)
    (theirs_grad,) = torch.autograd.grad(theirs.sum(), logp)
    torch.testing.assert_close(ours_grad, theirs_grad)
    # The tokens it gives no gradient are the ones inactive_tokens names, and only those.
    inactive = kl.inactive_tokens(name, torch.exp(logp - old), advantages.unsqueeze(-1), 0.2, 0.2)
    assert inactive.any() and not inactive.all()
    assert torch.equal(ours_grad == 0, inactive)


def test_the_policy_losses_part_only_off_policy():
    logp, old, advantages = stale_tokens()
    losses = {name: kl.policy_surrogate(name, logp, old, advantages, 0.2, 0.2) for name in kl.POLICY_LOSSES}
    assert not torch.allclose(losses["ppo_clip"], losses["truncated_is"])  # stale: PPO clips at 1.2, prime-rl at 8
    on_policy = old.clone().requires_grad_()
    gradients = []
    for name in kl.POLICY_LOSSES:
        (grad,) = torch.autograd.grad(kl.policy_surrogate(name, on_policy, old, advantages, 0.2, 0.2).sum(), on_policy)
        gradients.append(grad)
    for grad in gradients:  # ω = 1: −A·∇log π_θ for every token, whichever loss
        torch.testing.assert_close(grad, -advantages.unsqueeze(-1).expand(2, 6))
    with pytest.raises(ValueError, match="policy loss 'ppo' is not one of"):
        kl.policy_surrogate("ppo", logp, old, advantages, 0.2, 0.2)


@pytest.mark.parametrize("estimator", kl.ESTIMATORS)
def test_value_is_kl_says_whether_the_estimators_expectation_is_the_kl(estimator):
    """kl.VALUE_IS_KL, which the toy's tests read, is true exactly where E_π[K] = KL(π‖π_ref) (random distributions)."""
    generator = torch.Generator().manual_seed(5)
    logp = torch.log_softmax(torch.randn(20, 6, generator=generator, dtype=F64), -1)
    ref = torch.log_softmax(torch.randn(20, 6, generator=generator, dtype=F64), -1)
    expected = (logp.exp() * kl.token_kl(logp, ref, estimator)).sum(-1)
    exact = (logp.exp() * (logp - ref)).sum(-1)
    assert torch.allclose(expected, exact, rtol=0, atol=1e-12) == kl.VALUE_IS_KL[estimator]
    assert set(kl.VALUE_IS_KL) == set(kl.ESTIMATORS)
