"""The pitfalls of docs/pitfalls.md, each shown: a sequence-level importance ratio times a ratio-weighted per-token KL
(TRL's `importance_sampling_level="sequence"` with `use_bias_correction_kl`) adds a gradient term no per-token
correction has, exactly, in the toy model; K3 overflows in float16, and a clamp on K3 then keeps its value but not
its gradient; a clamp on K3 gives a KL loss two stable end points; a KL loss computed without gradient trains as no
KL."""

import numpy as np
import pytest
import torch

from klstudy import kl
from klstudy.analysis import toy

SETTING = toy.ToySetting("apart", a=1.0, b=-0.1, a_ref=-0.5, b_ref=0.1)  # config.yaml's `apart`
BETA = 1.0


def expected_gradient(length: int, sequence_loss) -> np.ndarray:
    """E_{y~π}[∇ loss(y)] on-policy, exactly: every sequence's loss, weighted by its probability held fixed (as
    toy.exact_estimator_mean does); ``sequence_loss(logp, ref_logp)`` gives each sequence's loss from its tokens'."""
    y = toy.all_sequences(length)
    counts = toy.counts_before(y)
    a, b = toy._param_leaves(SETTING)
    logp = toy.token_logprobs(a, b, y, counts)
    loss = sequence_loss(logp, toy.token_logprobs(SETTING.a_ref, SETTING.b_ref, y, counts))
    return toy._grad((logp.sum(-1).exp().detach() * loss).sum(), (a, b))


def ratio_corrected_k3_gradient(length: int, level: str) -> np.ndarray:
    """E[∇ β·Σ_t ω·K3_t] with ω TRL's importance ratio at the given level: per token exp(log π_t − sg[log π_t]), or
    per sequence exp(mean_t(log π_t − sg[log π_t])) broadcast to every token (grpo_trainer.py at v1.9.0)."""

    def loss(logp, ref):
        log_omega = logp - logp.detach()
        if level == "sequence":
            log_omega = log_omega.mean(-1, keepdim=True)
        return BETA * (torch.exp(log_omega) * kl.token_kl(logp, ref, "k3")).sum(-1)

    return expected_gradient(length, loss)


def spurious_term(length: int) -> np.ndarray:
    """β·E[(Σ_t K3_t)·mean_s ∇log π_s − Σ_t K3_t·∇log π_t]: what the sequence-level ratio's gradient adds."""

    def loss(logp, ref):
        k3 = kl.token_kl(logp.detach(), ref, "k3")
        return BETA * (k3.sum(-1) * logp.mean(-1) - (k3 * logp).sum(-1))  # its gradient is the term, K3 held fixed

    return expected_gradient(length, loss)


@pytest.mark.parametrize("length", [1, 2, 4])
def test_a_sequence_level_ratio_adds_a_term_the_per_token_correction_does_not_have(length):
    token = ratio_corrected_k3_gradient(length, "token")
    sequence = ratio_corrected_k3_gradient(length, "sequence")
    np.testing.assert_allclose(token, toy.exact_token_reverse_kl_grad(SETTING, length), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(sequence, token + spurious_term(length), rtol=1e-10, atol=1e-12)
    if length == 1:  # one token: the sequence's mean is the token's own ratio
        np.testing.assert_allclose(sequence, token, rtol=1e-12, atol=1e-14)
    else:  # the term's expectation is not zero: a token's KL times the score of tokens before it
        assert np.abs(spurious_term(length)).max() > 1e-3, spurious_term(length)
        assert np.abs(sequence - toy.exact_reverse_kl_grad(SETTING, length)).max() > 1e-3


def k3_and_gradient(log_ratio: list[float], dtype, clamp=None):
    logp = torch.tensor(log_ratio, dtype=dtype, requires_grad=True)
    value = kl.token_kl(logp, torch.zeros_like(logp), "k3", clamp=clamp)
    (grad,) = torch.autograd.grad(value.sum(), logp)
    return value.float(), grad.float()


def test_k3_overflows_in_float16_and_a_clamp_on_k3_keeps_the_value_not_the_gradient():
    """K3 = exp(−x) − 1 + x with x = log π − log π_ref: in float16 exp(12) is beyond the format (65504), so a token
    12 nats less likely under π than under π_ref gives K3 = inf; clamped at 10 (verl's, OpenRLHF's), the value is 10
    but the gradient, 0 × inf, is NaN. In bfloat16 and float32 the clamped token's gradient is 0, as it is meant to
    be: a clamped token gets no KL gradient at all."""
    value, grad = k3_and_gradient([-12.0, 0.5], torch.float16)
    assert torch.isinf(value[0]) and torch.isfinite(value[1])
    value, grad = k3_and_gradient([-12.0, 0.5], torch.float16, clamp=10.0)
    assert value[0] == 10 and torch.isnan(grad[0]) and torch.isfinite(grad[1])
    for dtype in (torch.bfloat16, torch.float32):
        value, grad = k3_and_gradient([-12.0, 0.5], dtype, clamp=10.0)
        assert value[0] == 10 and grad[0] == 0 and grad[1] != 0, (dtype, value, grad)
    value, grad = k3_and_gradient([-12.0], torch.float32)  # unclamped: the gradient 1 − exp(−x) is large, not lost
    assert abs(grad[0] - (1 - np.exp(12.0))) < 1e-6 * np.exp(12.0)


def test_a_kl_loss_computed_without_gradient_trains_as_no_kl_exactly(monkeypatch):
    """SkyRL's KL loss was computed under torch.no_grad (every skyrl_train release to v0.4.0): β·K_t then enters the
    loss's value and not its gradient. In the toy's exact expected update, K3 in the loss with its term detached is
    no KL's update at every θ, so it has no KL's end (it drifts), and only the logged KL shows anything is wrong."""
    import yaml

    from klstudy.analysis import fixed_points as fp
    from klstudy.config import REPO_ROOT, validate_config

    section = validate_config(yaml.safe_load((REPO_ROOT / "config.yaml").read_text()))["toy"]["fixed_points"]
    family = fp.family_of(section, "tabular")
    rewards = fp.task_reward(family.sequences, section["reward"])
    theta = family.reference_theta() + 0.3 * torch.randn(4, family.n_params, generator=torch.Generator().manual_seed(2),
                                                         dtype=fp.DTYPE)  # fmt: skip
    none = fp.NormalisedUpdate(family, rewards, kl.KLSpec.from_name("none"), "rloo", 2)(theta)
    penalised = fp.NormalisedUpdate(family, rewards, kl.KLSpec.from_name("k3-loss", 1.0), "rloo", 2)
    assert (penalised(theta) - none).abs().max() > 1e-2  # with its gradient, the penalty moves the update
    original = kl.loss_penalty
    monkeypatch.setattr(kl, "loss_penalty", lambda *args, **kwargs: original(*args, **kwargs).detach())  # no_grad
    torch.testing.assert_close(penalised(theta), none, rtol=0, atol=1e-14)


def test_a_clamp_on_k3_lets_the_end_point_depend_on_the_path():
    """verl's KL loss (K3 clamped at 10, ÷ group std, G = 5) at β = 0.1 in the parametric toy has two stable end
    points: the branch followed down in β from the reference (A), and the one Newton's method reaches at β = 0.1 from
    the branch at β = 0.02 (B). At B the clamp binds (some responses have a token whose K3 passes 10, whose penalty
    then has no gradient) and the task reward is higher; without the clamp the update has no second point there."""
    import pandas as pd

    from klstudy.analysis import atlas
    from klstudy.analysis import fixed_points as fp

    family = fp.Family("parametric", 4, -0.5, 0.1)
    rewards = fp.task_reward(family.sequences, {"kind": "ones_at_least", "threshold": 3})
    flow = {"step": 0.25, "steps": 200, "newton_every": 25}

    def update(beta, clamp):
        return fp.NormalisedUpdate(family, rewards, kl.KLSpec.from_name("k3-loss", beta, clamp=clamp), "group_std", 5)

    def reward(theta):
        return fp.policy_metrics(family, family.sequence_logprobs(theta), rewards, 0.1)["reward"]

    branch = fp.fixed_point_branch(family, rewards, "k3-loss", [0.02, 0.1], flow, lambda s: update(s.beta, 10.0), 10.0)
    a = branch[0.1].theta
    b, converged = fp._newton(update(0.1, 10.0), branch[0.02].theta)
    assert branch[0.1].status == "stable" and converged and fp.is_stable(update(0.1, 10.0), b)
    assert reward(b) - reward(a) > 0.03, (reward(a), reward(b))
    rows = pd.DataFrame([dict(family="parametric", T=4, clamp=10.0, config="k3-loss",
                              theta=" ".join(f"{v:.17g}" for v in t.tolist())) for t in (a, b)])  # fmt: skip
    binds = atlas.with_clamp_binding(rows, {"a_ref": -0.5, "b_ref": 0.1}).clamp_binds
    assert binds[0] == 0 and binds[1] > 1e-4, binds
    unclamped, found = fp._newton(update(0.1, None), branch[0.02].theta)
    assert not (found and fp.is_stable(update(0.1, None), unclamped) and abs(reward(unclamped) - reward(a)) > 1e-6)
