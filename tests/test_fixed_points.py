"""Where each KL configuration leads in the toy model (src/klstudy/analysis/fixed_points.py): exact fixed points against
the exact optimum of J_β = E[R] − β·KL, and Monte Carlo training through the trainer's loss ending where they say."""

import numpy as np
import pandas as pd
import pytest
import torch

from klstudy import claims_rule, kl
from klstudy.analysis import effective_beta, monte_carlo, toy
from klstudy.analysis import fixed_points as fp

REWARD = {"kind": "ones_at_least", "threshold": 3}
FLOW = {"step": 0.25, "steps": 200, "newton_every": 25}
PER_TOKEN_CORRECTIONS = [f"{e}-loss-{g}" for e in kl.ESTIMATORS for g in kl.LOSS_GRADIENTS[1:]]


def family(name, length=4):
    return fp.Family(name, length, -0.5, 0.1)


def end_point(name, config, beta, length=4, reward=REWARD):
    """(the configuration's exact end point as a one-row table, the family's exact optimum's log-probabilities)."""
    fam = family(name, length)
    rewards = fp.task_reward(fam.sequences, reward)
    row = fp.fixed_point_table(fam, reward, [config], [beta], FLOW).iloc[0]
    optimum = fam.sequence_logprobs(fp.optimum_sweep(fam, rewards, [beta])[beta])
    return row, fam, optimum


@pytest.mark.parametrize("name", fp.FAMILIES)
@pytest.mark.parametrize("beta", [0.3, 1.0])
def test_k1_in_the_reward_ends_at_the_exact_optimum(name, beta):
    row, fam, optimum = end_point(name, "k1-reward", beta)
    assert row.status == "stable"
    theta = torch.tensor([float(v) for v in row.theta.split()], dtype=fp.DTYPE)
    assert (fam.sequence_logprobs(theta).exp() - optimum.exp()).abs().max() < 1e-6
    assert abs(row.objective_gap) < 1e-6 and abs(row.kl_to_optimum) < 1e-6


def test_the_tabular_optimum_is_the_closed_form_one_and_beats_every_other_policy():
    fam = family("tabular")
    rewards = fp.task_reward(fam.sequences, REWARD)
    theta = fp.family_optimum(fam, rewards, 0.5, fam.reference_theta())
    closed = fp.optimum_logprobs(fam, rewards, 0.5)
    assert torch.allclose(fam.sequence_logprobs(theta), closed, atol=1e-10)
    best = fp.policy_metrics(fam, closed, rewards, 0.5)["objective"]
    assert best == pytest.approx(fp.unconstrained_objective(fam, rewards, 0.5), abs=1e-12)
    others = fam.reference_theta() + torch.randn(
        50, fam.n_params, generator=torch.Generator().manual_seed(0), dtype=fp.DTYPE
    )
    assert (fp._objective(fam, others, rewards, 0.5) < best).all()


@pytest.mark.parametrize("name", fp.FAMILIES)
def test_k1_in_the_loss_has_no_kl_s_expected_update_and_drifts_like_it(name):
    fam = family(name)
    rewards = fp.task_reward(fam.sequences, REWARD)
    thetas = fam.reference_theta() + torch.randn(
        5, fam.n_params, generator=torch.Generator().manual_seed(1), dtype=fp.DTYPE
    )
    k1_loss = fp.ExpectedUpdate(fam, rewards, kl.KLSpec.from_name("k1-loss", 1.0))(thetas)
    none = fp.ExpectedUpdate(fam, rewards, kl.KLSpec.from_name("none"))(thetas)
    assert torch.allclose(k1_loss, none, atol=1e-13)
    table = fp.fixed_point_table(fam, REWARD, ["none", "k1-loss"], [1.0], FLOW)
    assert list(table.status) == ["drifts", "drifts"]
    assert table.reward.iloc[0] == pytest.approx(table.reward.iloc[1], abs=1e-9)
    assert (table.reward > 0.999).all()


def table1_exact_bias(config: str, length: int) -> float:
    """Table 1's exact bias of the configuration's gradient of KL(A‖B) (toy.py, by enumeration)."""
    setting = toy.ToySetting("apart", 1.0, -0.1, -0.5, 0.1)
    spec = kl.KLSpec.from_name(config, 1.0)
    bias = toy.exact_estimator_mean(setting, length, spec) - toy.exact_reverse_kl_grad(setting, length)
    return float(np.abs(bias).max())


@pytest.mark.parametrize("config", PER_TOKEN_CORRECTIONS + ["k3-loss"])
def test_per_token_corrections_end_on_the_optimum_at_t1_where_table1_calls_them_unbiased_and_off_it_at_t4(config):
    """T = 1: a configuration Table 1 finds unbiased ends on the optimum. T = 4: one it finds biased ends off it (or
    has no fixed point). (A biased gradient may still vanish at the optimum: Table 1 measures it at other θ.)"""
    one = {"kind": "ones_at_least", "threshold": 1}
    if table1_exact_bias(config, 1) < 1e-9:
        row, _, _ = end_point("tabular", config, 1.0, length=1, reward=one)
        assert row.status == "stable" and abs(row.objective_gap) < 1e-8, (row.status, row.objective_gap)
    if table1_exact_bias(config, 4) > 1e-6:
        row, _, _ = end_point("tabular", config, 1.0, length=4)
        assert row.status != "stable" or row.objective_gap > 1e-5, row.objective_gap
    estimator_value_is_kl = kl.VALUE_IS_KL[config.split("-")[0]]
    assert config == "k3-loss" or table1_exact_bias(config, 1) < 1e-9 or not estimator_value_is_kl


def test_the_exact_update_does_not_depend_on_the_group_size():
    """RLOO's baseline leaves the expected update unchanged: groups of 2 and 3 enumerated; groups of 1 without it."""
    fam = family("tabular", 2)
    rewards = fp.task_reward(fam.sequences, {"kind": "ones_at_least", "threshold": 1})
    theta = fam.reference_theta() + 0.3
    for name in ("k3-reward", "k3-loss", "k1-both"):
        spec = kl.KLSpec.from_name(name, 0.7)
        pairs = fp.ExpectedUpdate(fam, rewards, spec, group=2)(theta)
        triples = fp.ExpectedUpdate(fam, rewards, spec, group=3)(theta)
        assert torch.allclose(pairs, triples, atol=1e-14)
        singles = -toy_style_expected_gradient(fam, rewards, spec, theta)
        assert torch.allclose(pairs, singles, atol=1e-14)


def toy_style_expected_gradient(fam, rewards, spec, theta):
    """Σ_y π(y)·∇ reinforce_loss(y) with no baseline: each sequence a group of one."""
    theta = theta.clone().requires_grad_(True)
    token_logp = fam.token_logprobs(theta).unsqueeze(-2)
    ref = fam.reference_logprobs().unsqueeze(-2)
    loss = kl.reinforce_loss(token_logp, ref, torch.ones_like(ref), rewards.unsqueeze(-1), spec, "none")
    weights = token_logp.sum((-1, -2)).exp().detach()
    (grad,) = torch.autograd.grad((weights * loss).sum() / fam.length, theta)
    return grad


@pytest.mark.parametrize("name", ["none", "k1-reward", "k2-both", "k3-loss-ratio", "k3-loss-isst", "k2-loss-st"])
def test_the_penalties_are_beta_times_their_value_at_beta_one(name):
    """What lets Monte Carlo training batch every β: kl's penalties are exactly linear in β."""
    generator = torch.Generator().manual_seed(2)
    logp, ref, old = (torch.randn(3, 4, 5, generator=generator, dtype=torch.float64) - 2 for _ in range(3))
    mask = torch.ones_like(logp)
    for beta in (0.1, 0.7, 3.0):
        scaled, unit = kl.KLSpec.from_name(name, beta), kl.KLSpec.from_name(name, 1.0)
        factor = 0.0 if name == "none" else beta
        assert torch.equal(
            kl.reward_penalty(logp, ref, mask, scaled), factor * kl.reward_penalty(logp, ref, mask, unit)
        )
        assert torch.allclose(
            kl.loss_penalty(logp, ref, mask, scaled, old), factor * kl.loss_penalty(logp, ref, mask, unit, old),
            rtol=1e-15, atol=0,
        )  # fmt: skip


def test_the_clipped_surrogate_on_policy_is_the_score_term_of_reinforce_loss():
    generator = torch.Generator().manual_seed(3)
    logp = (torch.randn(2, 4, 5, generator=generator, dtype=torch.float64) - 1).requires_grad_(True)
    advantages = torch.randn(2, 4, generator=generator, dtype=torch.float64)
    surrogate = kl.clipped_surrogate(logp, logp.detach(), advantages, 0.2, 0.2).sum()
    (ours,) = torch.autograd.grad(surrogate, logp)
    assert torch.allclose(ours, -advantages.unsqueeze(-1).expand_as(logp))


MC = dict(
    seeds=20, seed=0, steps=600, groups=8, group_size=4, learning_rate=0.1, decay_steps=50, updates_per_batch=4,
    epsilon=0.2,
)  # fmt: skip


@pytest.mark.parametrize(
    ("config", "mode"), [("k1-reward", "on-policy"), ("k3-loss", "on-policy"), ("k3-loss-ratio", "off-policy")]
)
def test_monte_carlo_training_ends_where_the_exact_fixed_point_says(config, mode):
    fam, betas = family("tabular"), [1.0, 3.0]
    points = fp.fixed_point_table(fam, REWARD, [config], betas, FLOW)
    runs = monte_carlo.train_monte_carlo(fam, REWARD, config, betas, MC, mode)
    agreed = monte_carlo.agreement(runs, points)
    assert (agreed.seeds == 20).all()
    assert agreed.agrees.astype(bool).all(), agreed[["beta", "mc_reward", "reward", "z_reward", "mc_kl", "kl", "z_kl"]]
    # and it tells configurations apart: K3 in the loss's end points are not the optimum's (K1 in the reward's)
    if config == "k3-loss":
        optimum = fp.fixed_point_table(fam, REWARD, ["k1-reward"], [1.0], FLOW).iloc[0]
        at_one = agreed[agreed.beta == 1.0].iloc[0]
        assert abs(at_one.mc_kl - optimum.kl) > 4 * at_one.mc_kl_se


@pytest.mark.deep  # the deep tier: `make test-deep` (docs/testing.md)
def test_the_numbers_are_the_same_run_after_run_and_thread_count():
    fam = family("parametric")
    threads = torch.get_num_threads()  # one (conftest)
    torch.set_num_threads(2)
    try:
        first = fp.fixed_point_table(fam, REWARD, ["k3-loss", "k3-reward"], [0.3, 1.0], FLOW)
    finally:
        torch.set_num_threads(threads)
    torch.set_num_threads(1)
    second = fp.fixed_point_table(fam, REWARD, ["k3-loss", "k3-reward"], [0.3, 1.0], FLOW)
    torch.set_num_threads(threads)
    pd.testing.assert_frame_equal(first, second, check_exact=True)
    small = dict(MC, seeds=3, steps=20)
    runs = [monte_carlo.train_monte_carlo(fam, REWARD, "k3-loss", [1.0], small, "off-policy") for _ in range(2)]
    pd.testing.assert_frame_equal(*runs, check_exact=True)


def test_a_bad_reward_kind_is_named():
    with pytest.raises(ValueError, match="toy.fixed_points.reward.kind"):
        fp.task_reward(torch.zeros(2, 3), {"kind": "longest_run", "threshold": 2})


DIRECTIONS = {"same": "ends at the optimum", "higher": "ends above it", "lower": "ends below it"}
TOLERANCE = 0.01  # the default toy.fixed_points.tolerance
RULE = {"alpha": 0.01, "min_z": 3, "q": 0.05, "fdr": "bh"}


@pytest.fixture(scope="module")
def default_runs():
    """The default's Monte Carlo runs, on- and off-policy at its three β, of a configuration on the optimum (K3 in
    both) and two off it (K3 in the loss; TRL's default), with their exact end points."""
    fam, configs, betas = family("tabular"), ["k3-both", "k3-loss", "k3-loss-ratio"], [0.3, 1.0, 3.0]
    points = fp.fixed_point_table(fam, REWARD, configs, betas, FLOW)
    runs = pd.concat(
        monte_carlo.train_monte_carlo(fam, REWARD, config, betas, MC, mode)
        for config in configs
        for mode in ("on-policy", "off-policy")
    )
    return points, runs


def test_every_toy_claim_can_fail_on_the_optimum_never_off_it_and_off_it_never_on_it(default_runs):
    """Against the optimum, at every β and in both modes: K3 in both (exactly on it) is never shown above or below it;
    K3 in the loss and TRL's default (off it) are never shown on it; and no row is shown both on it and off it."""
    points, runs = default_runs
    claims = {
        f"{config} {direction}": dict(
            text=f"{config} {words}", candidate=config, baseline="optimum", predicted=direction
        )
        for config in ("k3-both", "k3-loss", "k3-loss-ratio")
        for direction, words in DIRECTIONS.items()
    }
    table = monte_carlo.toy_claims(runs, points, claims, RULE, TOLERANCE)
    assert len(table) == 9 * 3 * 2 and (table.exact_status == "stable").all()
    shown = table[table.verdict == "shown"]
    assert not ((shown.candidate == "k3-both") & (shown.predicted != "same")).any(), shown
    assert not ((shown.candidate != "k3-both") & (shown.predicted == "same")).any(), shown
    per_row = shown.groupby(["candidate", "mode", "beta"]).predicted.agg(set)
    assert not per_row.map(lambda said: "same" in said and len(said) > 1).any(), per_row
    # the claims can pass too: K3 in the loss is below the optimum at β = 0.3 and TRL's default above it at β = 1
    assert set(shown.claim) >= {"k3-loss lower", "k3-loss-ratio higher"}


def test_runs_on_the_optimum_do_not_agree_with_a_fixed_point_off_it(default_runs):
    """K3 in both's runs (on the optimum, seeds spread as they are) taken for K3 in the loss's or TRL's default's: they
    agree with neither's fixed point at any β, while the runs of each agree with its own."""
    points, runs = default_runs
    on_optimum = runs[runs.config == "k3-both"]
    for biased in ("k3-loss", "k3-loss-ratio"):
        disguised = monte_carlo.agreement(on_optimum.assign(config=biased), points)
        assert not disguised.agrees.astype(bool).any(), disguised[["mode", "beta", "z_reward", "nearer_than_optimum"]]
        assert monte_carlo.agreement(runs[runs.config == biased], points).agrees.astype(bool).all()


def synthetic(statuses: dict, rewards: dict, seeds: int = 5):
    """(exact points, Monte Carlo end points) of one family at β = 1: each configuration's exact status and reward,
    its runs' rewards (a list per seed, or one value for every seed); optimum reward 0.5, reference 0.3."""
    points = pd.DataFrame(
        [dict(family="tabular", config=c, beta=1.0, status=s, reward=0.5, optimum_reward=0.5, reference_reward=0.3)
         for c, s in statuses.items()]
    )  # fmt: skip
    runs = pd.DataFrame(
        [dict(family="tabular", mode="on-policy", beta=1.0, config=c, seed=u, reward=r[u] if isinstance(r, list) else r)
         for c, r in rewards.items() for u in range(seeds if isinstance(r, float) else len(r))]
    )  # fmt: skip
    return points, runs


def test_toy_claims_go_through_the_claims_tables_judgement_with_every_reason_it_cannot_judge():
    """No fixed point on either side (drifts, still moving), identical differences and one seed are not testable,
    with the claims table's own words; a testable row's verdict is claims_rule.judged's."""
    points, runs = synthetic(
        {"none": "drifts", "k1-loss": "drifts", "k2-both": "still moving", "k1-reward": "stable", "k3-both": "stable"},
        {"none": [0.9, 0.95, 0.97], "k1-loss": [0.8, 0.9, 0.93], "k2-both": [0.6, 0.62, 0.61],
         "k1-reward": [0.5, 0.5, 0.5], "k3-both": [0.501, 0.499, 0.5005]},
    )  # fmt: skip
    claims = {
        "drift": dict(text="", candidate="k1-loss", baseline="none", predicted="same"),
        "moving": dict(text="", candidate="k2-both", baseline="optimum", predicted="higher"),
        "baseline drifts": dict(text="", candidate="k1-reward", baseline="none", predicted="lower"),
        "exact": dict(text="", candidate="k1-reward", baseline="optimum", predicted="same"),
        "judged": dict(text="", candidate="k3-both", baseline="optimum", predicted="same"),
    }
    table = monte_carlo.toy_claims(runs, points, claims, RULE, TOLERANCE).set_index("claim")
    assert table.verdict["drift"] == table.verdict["moving"] == table.verdict["baseline drifts"]
    assert table.verdict["drift"] == "not testable: no fixed point" and "no fixed point" in claims_rule.NOT_TESTABLE
    assert table.verdict["exact"] == "not testable: no error estimate"
    assert table.bound["judged"] == pytest.approx(TOLERANCE * 0.2)
    rows = table.loc[["judged"]].reset_index().drop(columns=["z", "critical", "p", "q_value", "verdict"])
    assert table.verdict["judged"] == claims_rule.judged(rows, RULE).verdict.iloc[0] == "not shown"
    points, runs = synthetic({"k3-both": "stable"}, {"k3-both": [0.5]})
    one = monte_carlo.toy_claims(runs, points, {"judged": claims["judged"]}, RULE, TOLERANCE)
    assert one.verdict.iloc[0] == "not testable: one seed"


def test_no_end_point_lies_above_the_frontier_and_the_optimum_lies_on_it():
    """below_frontier is ≥ 0 up to rounding for every stable end point of the default's tabular family, and 0 for K1
    in the reward (on the optimum); in the parametric family K2 in both at β = 1 ends 2e-5 in J off the optimum and
    near the frontier, where a frontier read between its β nodes put it 1e-6 above."""
    import yaml

    from klstudy import config as config_module

    config = config_module.validate_config(yaml.safe_load(open("config.yaml")))
    section = config["toy"]["fixed_points"]
    points, _ = fp.exact_tables(section, ["k1-reward", "k3-loss", "k3-both"], "tabular")
    parametric = fp.fixed_point_table(fp.family_of(section, "parametric"), section["reward"], ["k2-both"], [1.0],
                                      section["flow"]).assign(family="parametric")  # fmt: skip
    points = pd.concat([points, parametric], ignore_index=True)
    gaps = effective_beta.below_frontier(points, section)
    stable = points.status == "stable"
    assert gaps[stable].notna().all()
    assert (gaps[stable] > -1e-9).all(), gaps[stable].min()
    assert gaps[points.config == "k1-reward"].abs().max() < 1e-9
    assert (gaps[stable & (points.config == "k3-loss")] > 1e-7).all()
    assert gaps[points.config == "k2-both"].iloc[0] > 0


def test_the_fixed_points_table_is_written_in_words():
    """toy_fixed_points.md's table: configurations by their names, columns in words, '–' for an undefined reward below
    the frontier, no file path; the numbers as the table has them."""
    import re

    table = pd.DataFrame({"family": "tabular", "config": ["k1-reward", "k2-loss-isst", "none"], "beta": 0.3,
                          "status": ["stable", "stable", "drifts"], "reward": [0.86, 0.878, 1.0],
                          "kl": [1.1, 1.41, 2.74], "optimum_reward": 0.86, "optimum_kl": 1.1,
                          "objective_gap": [0.0, 0.076, 0.35], "kl_to_optimum": [0.0, 0.25, 1.2],
                          "below_frontier": [0.0, 0.065, np.nan]})  # fmt: skip
    from klstudy.report.figures.encoding import config_words

    text = monte_carlo.fixed_points_markdown(table, config_words)
    assert "K2 in loss, weighted K2-gradient" in text and "| no KL " in text and "reward below the frontier" in text
    assert "0.065" in text and "–" in text and "nan" not in text
    assert not re.search(r"\b[a-z]+_[a-z_]+\b|\bk\d-|\.md\b", text), text
