"""The atlas (src/klstudy/analysis/atlas.py): the expected update with every advantage normalisation and group size,
exact against enumerating every group, the rule that a normalisation rescales β, and the effective β."""

import math

import pytest
import torch

from klstudy import kl
from klstudy.analysis import atlas, effective_beta
from klstudy.analysis import fixed_points as fp

FLOW = {"step": 0.25, "steps": 200, "newton_every": 25}
ONE = {"kind": "ones_at_least", "threshold": 1}


def small(name="tabular", length=2):
    family = fp.Family(name, length, -0.5, 0.1)
    return family, fp.task_reward(family.sequences, ONE)


@pytest.mark.parametrize("normalisation", ["rloo", "mean", "group_std", "loo_std"])
@pytest.mark.parametrize("group", [2, 3])
@pytest.mark.parametrize(
    "config",
    ["k1-reward", "k3-reward", "k3-loss", "k1-both", "k3-loss-ratio", "k3-loss-score", "k1-advantage", "k3-advantage"],
)
def test_the_exchangeable_update_is_every_group_enumerated(normalisation, group, config):
    """E[A_1 | y_1] from the multisets of the others (or the mean-field group of a linear normalisation) gives the
    same expected update as kl.reinforce_loss over all n^G groups, to rounding."""
    family, rewards = small()
    theta = family.reference_theta() + torch.tensor([0.3, -0.2, 0.5], dtype=fp.DTYPE)
    spec = kl.KLSpec.from_name(config, 0.7)
    brute = fp.ExpectedUpdate(family, rewards, spec, group=group, advantage=normalisation)(theta)
    exact = fp.NormalisedUpdate(family, rewards, spec, normalisation, group)(theta)
    # ÷ the others' std amplifies rounding where the others' shaped rewards nearly agree: relative there.
    tolerance = 1e-13 * float(brute.abs().max()) if normalisation == "loo_std" else 1e-15
    assert torch.allclose(brute, exact, atol=tolerance, rtol=0)


@pytest.mark.parametrize("config", ["k1-reward", "k3-loss-score"])
def test_the_leave_one_out_std_update_is_every_group_enumerated_at_g4(config):
    """NeMo-RL's loo_std is not linear in the others' rewards: its E[A_1 | y_1] needs the multisets; at G = 4 they
    give the update of all 4^4 groups."""
    family, rewards = small()
    theta = family.reference_theta() + torch.tensor([0.3, -0.2, 0.5], dtype=fp.DTYPE)
    spec = kl.KLSpec.from_name(config, 0.7)
    brute = fp.ExpectedUpdate(family, rewards, spec, group=4, advantage="loo_std")(theta)
    exact = fp.NormalisedUpdate(family, rewards, spec, "loo_std", 4)(theta)
    assert torch.allclose(brute, exact, atol=1e-14 * max(1.0, float(brute.abs().max())), rtol=0)


def _whitened_brute_force(family, rewards, spec, normalisation, group, theta):
    """The expected update of a whitening normalisation in the limit of a batch of many groups, by enumerating every
    one of the n^G groups with its probability: the batch's token mean and variance are their expectations over a
    group, and each member's whitened per-token advantage enters the loss as kl.reinforce_loss's score term does."""
    n, length = len(rewards), family.length
    groups = torch.cartesian_prod(*[torch.arange(n)] * group).reshape(-1, group)
    theta = theta.detach().requires_grad_(True)
    token_logp = family.token_logprobs(theta)[groups]  # (n^G, G, T)
    ref_logp = family.reference_logprobs()[groups]
    weights = token_logp.sum((-1, -2)).exp().detach()
    ones = torch.ones_like(ref_logp)
    shaped = kl.shaped_rewards(rewards[groups], token_logp.detach(), ref_logp, ones, spec)
    raw = kl.ADVANTAGES[kl.WHITENED[normalisation]](shaped).unsqueeze(-1) - kl.advantage_penalty(
        token_logp, ref_logp, ones, spec
    )
    mean = (weights * raw.mean((-1, -2))).sum()
    variance = (weights * raw.square().mean((-1, -2))).sum() - mean**2
    advantages = ((raw - mean) / variance.clamp(min=kl.WHITEN_EPSILON).sqrt()).detach()
    per_group = (-(advantages * token_logp).sum(-1) + kl.loss_penalty(token_logp, ref_logp, ones, spec).sum(-1))
    (grad,) = torch.autograd.grad((weights * per_group.mean(-1)).sum() / length, theta)
    return -grad


@pytest.mark.parametrize("normalisation", sorted(kl.WHITENED))
@pytest.mark.parametrize("config", ["k1-advantage", "k3-advantage", "k2-loss", "k3-loss", "k1-reward"])
def test_the_whitened_update_is_every_group_enumerated(normalisation, config):
    """OpenRLHF's whitening over a batch of many groups: NormalisedUpdate's mean-field whitening (the other members'
    variance added for the group mean) against every group of 3 enumerated with its probability, to rounding."""
    family, rewards = small()
    theta = family.reference_theta() + torch.tensor([0.3, -0.2, 0.5], dtype=fp.DTYPE)
    spec = kl.KLSpec.from_name(config, 0.7)
    brute = _whitened_brute_force(family, rewards, spec, normalisation, 3, theta)
    exact = fp.NormalisedUpdate(family, rewards, spec, normalisation, 3)(theta)
    assert torch.allclose(brute, exact, atol=1e-14 * max(1.0, float(brute.abs().max())), rtol=0), (brute, exact)


def test_whitening_with_the_kl_in_the_advantage_only_rescales_the_group_mean_update():
    """The KL and the task term both whitened: the update is the group mean's times a positive number (the mean's
    shift has no expected gradient), so the two have the same fixed points."""
    family, rewards = small("tabular", 3)
    spec = kl.KLSpec.from_name("k1-advantage", 0.4)
    for shift in (0.0, 0.3, -0.7):
        theta = family.reference_theta() + shift + torch.linspace(-0.5, 0.5, family.n_params, dtype=fp.DTYPE)
        whitened = fp.NormalisedUpdate(family, rewards, spec, "group_whiten", 4)(theta)
        centred = fp.NormalisedUpdate(family, rewards, spec, "mean", 4)(theta)
        ratio = whitened / centred
        assert (ratio > 0).all() and (ratio.max() - ratio.min()) < 1e-10 * float(ratio.mean())


@pytest.mark.parametrize("normalisation, group", [("rloo", 2), ("group_std", 4), ("group_std", 2), ("mean", 8)])
def test_k1_in_the_advantage_ends_on_the_optimum_at_beta_over_c(normalisation, group):
    """K1 to go is exact and unscaled, the task term c_G(p)·∇p: K1 in the advantage ends on the tabular optimum of
    J at β / c_G(p_end) (at β itself with RLOO), on the reward–KL frontier whatever the normalisation."""
    family, rewards = small("tabular", 3)
    beta = 0.5
    row = fp.fixed_point_table(
        family, ONE, ["k1-advantage"], [beta], FLOW,
        lambda spec: fp.NormalisedUpdate(family, rewards, spec, normalisation, group),
    ).iloc[0]  # fmt: skip
    assert row.status == "stable"
    scaled = beta / atlas.task_scale(normalisation, group, row.reward)
    optimum = fp.family_optimum(family, rewards, scaled, family.reference_theta())
    best = fp.policy_metrics(family, family.sequence_logprobs(optimum), rewards, scaled)
    assert row.reward == pytest.approx(best["reward"], abs=1e-9) and row.kl == pytest.approx(best["kl"], abs=1e-9)


def test_the_leave_one_out_std_task_scale():
    """loo_std's c_G(p) = E[w], w = 1/(the others' std + 1e-6), or 1 where the others agree: not zero-sum, so
    E[A_1 | R_1 = 1]/(1 − p) would be wrong; 1 at G = 2 (RLOO), → 1 as p → 0 (the others all fail)."""
    for p in (0.02, 0.3, 0.5, 0.9):
        weights = [math.comb(7, k) * p**k * (1 - p) ** (7 - k) for k in range(8)]
        spread = [math.sqrt(k * (7 - k) / (7 * 6)) for k in range(8)]
        expected = sum(w * (1 / (s + 1e-6) if s > 0 else 1.0) for w, s in zip(weights, spread, strict=True))
        assert atlas.task_scale("loo_std", 8, p) == pytest.approx(expected, rel=1e-12)
        assert atlas.task_scale("loo_std", 2, p) == pytest.approx(1, abs=1e-12)
    assert atlas.task_scale("loo_std", 8, 1e-4) == pytest.approx(1, abs=0.01)


def test_the_task_scale_of_each_normalisation():
    """c_G(p) for a 0/1 reward: RLOO 1, group mean (G − 1)/G, group std 1/√2 at G = 2 (whatever p) and within
    [1.39, 1.50] at G = 4, batch std (G − 1)/(G·√(p(1 − p))), each up to TRL's + 1e-4 in the denominator."""
    for p in (0.05, 0.3, 0.5, 0.8, 0.97):
        assert atlas.task_scale("rloo", 4, p) == pytest.approx(1, abs=1e-12)
        assert atlas.task_scale("mean", 8, p) == pytest.approx(7 / 8, abs=1e-12)
        assert atlas.task_scale("group_std", 2, p) == pytest.approx(0.5 / (2**-0.5 + 1e-4), abs=1e-12)
        assert 1.39 <= atlas.task_scale("group_std", 4, p) <= 1.5
        assert atlas.task_scale("group_std", 8, p) > 1
        batch = (3 / 4) / (math.sqrt(p * (1 - p)) + 1e-4)
        assert atlas.task_scale("batch_std", 4, p) == pytest.approx(batch, rel=1e-12)
        # Whitening: the centred advantage ÷ its own spread over the batch (√((G − 1)/G·p(1 − p)) for the group mean)
        assert atlas.task_scale("group_whiten", 4, p) == pytest.approx(math.sqrt(3 / 4 / (p * (1 - p))), rel=1e-12)
        assert atlas.task_scale("whiten", 4, p) == pytest.approx(1 / math.sqrt(p * (1 - p)), rel=1e-12)


@pytest.mark.parametrize(
    "normalisation, group",
    [("mean", 2), ("group_std", 2), ("group_std", 4), ("batch_std", 4), ("loo_std", 4), ("group_whiten", 4),
     ("whiten", 8)],
)  # fmt: skip
def test_a_normalisation_with_the_kl_in_the_loss_ends_where_rloo_ends_at_beta_over_c(normalisation, group):
    """With a 0/1 reward and the KL in the loss only, the task term is c_G(p)·∇p: the fixed point at β is RLOO's at
    β / c_G(p_end) (docs/atlas.md)."""
    family, rewards = small()
    beta = 0.5
    table = fp.fixed_point_table(
        family, ONE, ["k3-loss"], [beta], FLOW,
        lambda spec: fp.NormalisedUpdate(family, rewards, spec, normalisation, group),
    )  # fmt: skip
    row = table.iloc[0]
    assert row.status == "stable"
    scaled = beta / atlas.task_scale(normalisation, group, row.reward)
    rloo = fp.fixed_point_table(
        family, ONE, ["k3-loss"], [scaled], FLOW, lambda spec: fp.NormalisedUpdate(family, rewards, spec, "rloo", 2)
    ).iloc[0]
    assert rloo.reward == pytest.approx(row.reward, abs=1e-9) and rloo.kl == pytest.approx(row.kl, abs=1e-9)


@pytest.mark.parametrize("normalisation, group", [("rloo", 2), ("mean", 4), ("group_std", 2), ("group_std", 3)])
def test_k1_in_the_reward_has_a_zero_update_at_the_tabular_optimum(normalisation, group):
    """The tabular derivation: at π*_β the shaped reward R − β·K1 is the same for every sequence, so every
    zero-mean advantage vanishes there, whatever the normalisation; off it, the update does not."""
    family, rewards = small()
    optimum = fp.family_optimum(family, rewards, 0.4, family.reference_theta())
    update = fp.NormalisedUpdate(family, rewards, kl.KLSpec.from_name("k1-reward", 0.4), normalisation, group)
    assert update(optimum).abs().max() < 1e-12
    assert update(optimum + 0.1).abs().max() > 1e-4


@pytest.mark.parametrize("name", fp.FAMILIES)
def test_the_effective_beta_of_an_optimum_is_its_own_beta(name):
    family, rewards = small(name, 3)
    curve = effective_beta.OptimumCurve(family, rewards)
    for beta in (0.07, 0.4, 2.5):
        theta = fp.family_optimum(family, rewards, beta, curve.optima[min(curve.optima, key=lambda b: abs(b - beta))])
        k = fp.policy_metrics(family, family.sequence_logprobs(theta), rewards, beta)["kl"]
        assert curve.effective_beta(k) == pytest.approx(beta, rel=1e-8)
    assert math.isnan(curve.effective_beta(curve.kls.max() * 2))  # beyond every optimum's KL: none


def test_below_the_frontier_is_zero_on_the_optimum_and_positive_off_it():
    """K1 in the reward with RLOO ends on the tabular optimum: nothing below the frontier; K3 in the loss with ÷ group
    std at G = 2 ends off it, below the frontier by more than rounding, and no setting lies above it."""
    family, _ = small("tabular", 3)
    settings = [{"setting": s, "config": s.split("/")[0], "normalisation": s.split("/")[1], "group": 2}
                for s in ("k1-reward/rloo/G2", "k3-loss/group_std/G2")]  # fmt: skip
    table = atlas.end_points(family, ONE, settings, [0.3, 1.0], FLOW).set_index(["setting", "beta"])
    assert table.loc["k1-reward/rloo/G2"].below_frontier.abs().max() < 1e-9
    off = table.loc["k3-loss/group_std/G2"].below_frontier
    assert (off > 1e-6).all(), off


def test_the_summary_reads_each_presets_row_at_each_beta():
    """The summary the run's atlas.md (docs/atlas/atlas.md) leads with: the grid's β, the preset's own β and the
    field's range, each read from its own row (a resolved ratio, a bound beyond the curve, a drift, an unsettled flow,
    the clamp's mark)."""
    import pandas as pd

    section = {"presets": ["verl-0.7-kl-loss"], "betas": [1.0], "frameworks_betas": [0.001, 0.01, 0.04]}
    base = dict(preset="verl-0.7-kl-loss", family="parametric", beta_eff_ratio=float("nan"), curve_beta_min=0.001,
                beyond_curve=False, clamp_binds=0.0)  # fmt: skip
    rows = pd.DataFrame([
        {**base, "beta": 1.0, "resolution": "β_eff", "status": "stable", "beta_eff_ratio": 0.62},
        {**base, "beta": 0.001, "resolution": "no", "status": "still moving"},
        {**base, "beta": 0.01, "resolution": "no", "status": "stable", "beyond_curve": True},
        {**base, "beta": 0.04, "resolution": "β_eff", "status": "stable", "beta_eff_ratio": 1.76, "clamp_binds": 0.2},
    ])  # fmt: skip
    row = atlas.summary_table(rows, section).iloc[0]
    assert row["preset (its name for explain)"] == "`verl-0.7-kl-loss`: verl 0.7.0"
    assert row["setting"] == "k3-loss ±10, group_std, G = 5"  # its clamp
    assert row["parametric: β_eff/β at β = 1"] == "0.62"
    assert row["parametric: at its own β"] == "unsettled (β = 0.001)"  # the recipe's β; the default is off
    assert row["parametric: β = 0.001–0.04"] == "1.76–1.76; 2 of 3 not resolved"
    assert atlas.ratio_text(rows.iloc[2]) == "< 0.1" and atlas.ratio_text(rows.iloc[3]) == "1.76" + atlas.CLAMP_MARK
    assert "tabular: at its own β" not in row  # the tabular family cannot resolve the field's small β
    trl = atlas.summary_table(rows.assign(preset="trl-1.16"), dict(section, presets=["trl-1.16"])).iloc[0]
    assert trl["parametric: at its own β"] == "– (off by default)"  # TRL's β is 0 by default, no recipe β



def test_the_optimum_curve_reaches_where_the_family_s_optimum_ends_not_a_grid_step_above():
    """Parametric, T = 11, reward at 9 ones (the length sweep's): Newton's method fails at the grid's β = 0.22 from
    the optimum at 0.32, though the interior optimum exists down to about 0.22. The curve halves its step there
    instead of stopping, so the optimum at β = 0.3 (where K1 in the reward ends) has β_eff = β; before, none: every
    setting of the length figure read × at T = 11."""
    family = fp.Family("parametric", 11, -0.5, 0.1)
    rewards = fp.task_reward(family.sequences, {"kind": "ones_at_least", "threshold": 9})
    curve = effective_beta.OptimumCurve(family, rewards)
    theta = fp.family_optimum(family, rewards, 0.3, curve.optima[min(b for b in curve.optima if b > 0.3)])
    k = fp.policy_metrics(family, family.sequence_logprobs(theta), rewards, 0.3)["kl"]
    assert curve.effective_beta(k) == pytest.approx(0.3, rel=1e-8)
