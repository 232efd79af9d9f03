"""The §3.3 toy model: exact KL and gradients, and the bias of every configuration, exactly and by Monte Carlo.

Exact expectations come from enumerating all 2^T sequences, so the mathematical claims of §3 are
checked to rounding error rather than to a loose Monte Carlo tolerance.
"""

import numpy as np
import pytest
import torch

from klstudy import kl
from klstudy.analysis import toy

SETTINGS = [
    toy.ToySetting("close", 0.2, 0.05, 0.0, 0.0),
    toy.ToySetting("apart", 1.0, -0.1, -0.5, 0.1),
    toy.ToySetting("drifting", -0.5, 0.2, 0.0, -0.1),
    toy.ToySetting("steep", 2.0, -1.0, -1.0, 0.7),
]
LENGTHS = [1, 3, 6]
EXACT = dict(rtol=1e-9, atol=1e-11)


def enumerated_kl(setting, length):
    y = toy.all_sequences(length)
    counts = toy.counts_before(y)
    logp = toy.token_logprobs(setting.a, setting.b, y, counts).sum(-1)
    ref_logp = toy.token_logprobs(setting.a_ref, setting.b_ref, y, counts).sum(-1)
    return float((logp.exp() * (logp - ref_logp)).sum())


def expectation(setting, length, estimator, placement):
    return toy.exact_estimator_mean(setting, length, kl.KLSpec(estimator, placement, 1.0))


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.name)
@pytest.mark.parametrize("length", [1, 2, 5, 9])
def test_dynamic_programme_equals_enumeration(setting, length):
    assert np.isclose(toy.exact_reverse_kl(setting, length), enumerated_kl(setting, length), **EXACT)
    assert toy.all_sequences(length).shape == (2**length, length)


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.name)
@pytest.mark.parametrize("length", [1, 4, 12, 32])
def test_exact_gradient_matches_finite_differences(setting, length):
    step = 1e-6
    numeric = []
    for name in ("a", "b"):
        plus = toy.ToySetting(**{**setting.__dict__, name: getattr(setting, name) + step})
        minus = toy.ToySetting(**{**setting.__dict__, name: getattr(setting, name) - step})
        numeric.append((toy.exact_reverse_kl(plus, length) - toy.exact_reverse_kl(minus, length)) / (2 * step))
    assert np.allclose(toy.exact_reverse_kl_grad(setting, length), numeric, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.name)
@pytest.mark.parametrize("length", [1, 2, 5, 8])
def test_exact_gradient_matches_equations_21_22(setting, length):
    assert np.allclose(
        toy.exact_reverse_kl_grad(setting, length), toy.closed_form_reverse_kl_grad(setting, length), **EXACT
    )


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.name)
@pytest.mark.parametrize("length", LENGTHS)
def test_sequence_k1_and_k3_values_are_unbiased(setting, length):
    y = toy.all_sequences(length)
    counts = toy.counts_before(y)
    logp = toy.token_logprobs(setting.a, setting.b, y, counts)
    ref_logp = toy.token_logprobs(setting.a_ref, setting.b_ref, y, counts)
    prob = logp.sum(-1).exp()
    for estimator in ("k1", "k3"):
        value = (prob * kl.sequence_kl(logp, ref_logp, torch.ones_like(y), estimator)).sum()
        assert np.isclose(float(value), toy.exact_reverse_kl(setting, length), **EXACT), estimator


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.name)
@pytest.mark.parametrize("length", LENGTHS)
def test_k1_in_reward_gradient_is_unbiased(setting, length):
    truth = toy.exact_reverse_kl_grad(setting, length)
    assert np.allclose(expectation(setting, length, "k1", "reward"), truth, **EXACT)


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.name)
@pytest.mark.parametrize("length", LENGTHS)
def test_k1_in_loss_gradient_is_zero_in_expectation(setting, length):
    assert np.allclose(expectation(setting, length, "k1", "loss"), 0.0, atol=1e-12)


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.name)
@pytest.mark.parametrize("length", LENGTHS)
def test_k3_in_loss_gradient_is_the_token_level_forward_kl_gradient(setting, length):
    forward = toy.exact_forward_token_kl_grad(setting, length)
    assert np.allclose(expectation(setting, length, "k3", "loss"), forward, **EXACT)
    if setting.name != "close" or length > 1:
        # ... which is not the reverse-KL gradient: K3 in the loss is biased (eq. 16).
        assert not np.allclose(forward, toy.exact_reverse_kl_grad(setting, length), rtol=1e-3)


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.name)
@pytest.mark.parametrize("length", LENGTHS)
def test_k3_in_reward_gradient_is_biased_by_minus_the_forward_term(setting, length):
    truth = toy.exact_reverse_kl_grad(setting, length)
    mean = expectation(setting, length, "k3", "reward")
    # eq. (45): E[K3 ∇log π] = ∇KL − Σ_t E[∇ KL(π_ref‖π_θ)_t]
    assert np.allclose(mean, truth - toy.exact_forward_token_kl_grad(setting, length), **EXACT)
    assert np.abs(mean - truth).max() > 1e-2


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.name)
@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_both_placements_are_unbiased_on_policy(setting, length, estimator):
    assert np.allclose(
        expectation(setting, length, estimator, "both"), toy.exact_reverse_kl_grad(setting, length), **EXACT
    )


@pytest.mark.parametrize("setting", SETTINGS[1:], ids=lambda s: s.name)
def test_both_is_biased_for_an_estimator_biased_in_value(setting):
    # "both" gives ∇E[K], which is ∇KL only when E[K] = KL: not for K2.
    mean = expectation(setting, 4, "k2", "both")
    assert np.abs(mean - toy.exact_reverse_kl_grad(setting, 4)).max() > 1e-3


@pytest.mark.parametrize("estimator", ["k1", "k3"])
@pytest.mark.parametrize("loss_gradient", ["ratio", "score", "st", "isst"])
def test_both_with_a_frameworks_correction_of_the_loss_term_is_biased_even_at_t1(estimator, loss_gradient):
    """eq. (6) needs the path-wise ∇K_t beside the reward's score-function term; every correction replaces it."""
    setting = SETTINGS[1]
    spec = kl.KLSpec.from_name(f"{estimator}-both-{loss_gradient}", 1.0)
    bias = toy.exact_estimator_mean(setting, 1, spec) - toy.exact_reverse_kl_grad(setting, 1)
    assert np.abs(bias).max() > 1e-2


def test_no_kl_gives_no_gradient():
    assert np.array_equal(expectation(SETTINGS[1], 4, "k1", "none"), [0.0, 0.0])


def test_replicated_parameters_give_each_trials_own_gradient():
    setting = SETTINGS[2]
    generator = torch.Generator().manual_seed(3)
    y = toy.sample_sequences(setting.a, setting.b, 7, (4, 50), generator)
    specs = toy.config_specs(["k1", "k3"], ["reward", "loss", "both"])
    together = toy.estimates_from_samples(setting, y, specs, "rloo")
    for i in range(4):
        alone = toy.estimates_from_samples(setting, y[i : i + 1], specs, "rloo")
        for spec in specs:
            assert np.allclose(together[spec.name][i], alone[spec.name][0], rtol=1e-12, atol=1e-12)


def test_sampler_draws_from_the_model():
    setting = SETTINGS[3]
    y = toy.sample_sequences(setting.a, setting.b, 3, (200_000,), torch.Generator().manual_seed(0))
    codes = (y * torch.tensor([1.0, 2.0, 4.0])).sum(-1).long()
    frequency = torch.bincount(codes, minlength=8).double() / len(codes)
    all_y = toy.all_sequences(3)
    prob = toy.token_logprobs(setting.a, setting.b, all_y, toy.counts_before(all_y)).sum(-1).exp()
    assert torch.allclose(frequency, prob, atol=4 * (0.25 / 200_000) ** 0.5)


FRAMEWORK_VARIANTS = [  # ratio or score with an estimator whose value is not the KL (K2) is biased at T = 1 too
    kl.KLSpec(e, "loss", 1.0, g)
    for g in kl.LOSS_GRADIENTS[1:]
    for e in kl.ESTIMATORS
    if kl.VALUE_IS_KL[e] or g in ("st", "isst")
]


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.name)
@pytest.mark.parametrize("spec", FRAMEWORK_VARIANTS, ids=lambda s: s.name)
def test_framework_corrections_estimate_the_per_token_kl_gradient_not_the_sequences(setting, spec):
    """TRL's use_bias_correction_kl, slime, NeMo-RL, verl k1+/k3+ and OpenRLHF's unbiased_gradient, on-policy: the
    expected gradient is the per-token reverse KL's (prefix distribution held fixed), exactly; that is the sequence
    KL's gradient for T = 1 and not beyond, where a token changes the distribution of the tokens after it."""
    for length in LENGTHS:
        mean = toy.exact_estimator_mean(setting, length, spec)
        assert np.allclose(mean, toy.exact_token_reverse_kl_grad(setting, length), **EXACT), length
        true = toy.exact_reverse_kl_grad(setting, length)
        if length == 1:
            assert np.allclose(mean, true, **EXACT)
        else:
            assert np.abs(mean - true).max() > 1e-3 * np.abs(true).max(), (length, mean, true)


@pytest.mark.parametrize("gradient", ["ratio", "score"])
def test_k2_with_a_score_correction_is_biased_even_for_one_token(gradient):
    """K2 is not unbiased in value, so adding K2·∇log π to its (already per-token unbiased) gradient biases it."""
    setting = SETTINGS[1]
    mean = toy.exact_estimator_mean(setting, 1, kl.KLSpec("k2", "loss", 1.0, gradient))
    assert np.abs(mean - toy.exact_reverse_kl_grad(setting, 1)).max() > 1e-2


def test_table1_rows_carry_the_exact_verdict_and_the_framework():
    import pandas as pd

    results = toy.bias_variance(
        SETTINGS[1], [1, 4], estimators=["k1", "k3"], placements=["reward", "loss"], trials=20, sequences=50,
        loss_gradients=["ratio", "st"],
    )  # fmt: skip
    assert results.exact_mean.notna().all()
    tests = toy.unbiasedness_tests(pd.concat([results]), alpha=0.01).set_index("config")
    assert list(tests.index) == ["k1-reward", "k3-reward", "k1-loss", "k3-loss", "k1-loss-ratio", "k3-loss-ratio",
                                 "k1-loss-st", "k3-loss-st"]  # fmt: skip
    assert tests.exact_unbiased.to_dict() == {name: name == "k1-reward" for name in tests.index}
    assert tests.loc["k3-loss-ratio", "max_abs_exact_bias_T1"] < 1e-12 < tests.loc["k3-loss", "max_abs_exact_bias_T1"]
    assert "use_bias_correction_kl=True" in tests.loc["k3-loss-ratio", "framework"]
    assert tests.loc["k1-reward", "framework"] == ""


@pytest.mark.parametrize("baseline", ["none", "rloo"])
def test_monte_carlo_protocol_classifies_every_configuration(baseline):
    """The statistical test of Table 1 recovers the exact verdicts above from samples alone."""
    results = [
        toy.bias_variance(s, [2, 8], trials=100, sequences=200, seed=1, advantage=baseline) for s in SETTINGS[1:3]
    ]
    import pandas as pd

    tests = toy.unbiasedness_tests(pd.concat(results), alpha=0.01)
    verdict = {r.config: r.unbiased for r in tests.itertuples()}
    # K1 as reward-to-go in the advantage is K1 in the reward by causality: unbiased too, here without std scaling.
    unbiased = [verdict.pop(c) for c in ("k1-reward", "k1-both", "k3-both", "k1-advantage")]
    assert all(unbiased), unbiased
    assert not any(verdict.values()), verdict
    configurations = 4 * len(kl.ESTIMATORS) + 1  # every estimator × reward, loss, both, advantage; and none
    assert len(results[0]) == 2 * configurations * 2  # lengths × configurations × parameters


def test_unbiasedness_test_flags_a_small_planted_bias():
    """The test must be able to fail: a bias of 6 standard errors is caught, one of 1 is not."""
    import pandas as pd

    rows = pd.DataFrame(
        dict(setting="s", T=[2, 4], config="k1-reward", estimator="k1", placement="reward", param="a", z=[1.0, 6.0])
    )
    assert not toy.unbiasedness_tests(rows, 0.01).unbiased.item()
    assert toy.unbiasedness_tests(rows.assign(z=[1.0, -1.5]), 0.01).unbiased.item()
