"""The parametric autoregressive model of §3.3: where each KL configuration's gradient is measured exactly.

Two distributions over binary sequences y_1..y_T (eqs. 17–18), each token a Bernoulli whose logit
depends on the count of ones so far, c_{t-1} = Σ_{k<t} y_k:

    A (the policy, parameters θ = (a, b)):       p_t^A = σ(a + b·c_{t-1})
    B (the reference, fixed (a_ref, b_ref)):     p_t^B = σ(a_ref + b_ref·c_{t-1})

Because p_t depends on the prefix only through c_{t-1}, any sum over tokens of a token-level quantity
has an exact expectation by dynamic programming over the count (O(T²)); that gives the true reverse
KL(A‖B), its gradient (autograd through the recursion), and the token-level forward-KL gradient of
eq. (41). Expectations of whole-sequence quantities (the gradient estimators themselves) are exact by
enumerating the 2^T sequences for small T.

Monte Carlo follows the paper's §3.3: ``trials`` independent batches of ``sequences`` samples
from A. Each configuration's estimate is the autograd gradient of ``kl.reinforce_loss`` with zero task
reward and β = 1, so it estimates ∇_θ KL(A‖B) in whatever way that configuration does. Per-trial
gradients come from one backward pass: (a, b) are replicated once per trial, so trial i's loss
depends only on copy i.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from scipy.stats import norm

from klstudy import kl

DTYPE = torch.float64
PARAMS = ("a", "b")
CHUNK_ELEMENTS = 640_000


@dataclass(frozen=True)
class ToySetting:
    """Parameters of the policy A (a, b) and of the reference B (a_ref, b_ref)."""

    name: str
    a: float
    b: float
    a_ref: float
    b_ref: float


def bernoulli_logprobs(logits, y):
    """log p(y_t) of binary tokens y under Bernoulli(σ(logits)), stable for large logits."""
    return y * torch.nn.functional.logsigmoid(logits) + (1 - y) * torch.nn.functional.logsigmoid(-logits)


def token_logprobs(a, b, y, counts):
    """log p(y_t | c_{t-1}) for each token; a and b broadcast against y."""
    return bernoulli_logprobs(a + b * counts, y)


def counts_before(y):
    """c_{t-1} = number of ones strictly before position t."""
    return torch.cumsum(y, -1) - y


def sample_sequences(a: float, b: float, length: int, shape, generator) -> torch.Tensor:
    """Draw binary sequences from A(a, b): a tensor of shape ``shape + (length,)``."""
    y = torch.empty(*shape, length, dtype=DTYPE)
    count = torch.zeros(shape, dtype=DTYPE)
    for t in range(length):
        p = torch.sigmoid(a + b * count)
        y[..., t] = (torch.rand(shape, generator=generator, dtype=DTYPE) < p).to(DTYPE)
        count += y[..., t]
    return y


def all_sequences(length: int) -> torch.Tensor:
    """Every binary sequence of the given length: shape (2^length, length)."""
    codes = torch.arange(2**length).unsqueeze(-1)
    return ((codes >> torch.arange(length)) & 1).to(DTYPE)


def _bernoulli_kl(logit_p, logit_q):
    """KL(Bern(σ(logit_p)) ‖ Bern(σ(logit_q))), stable for large logits."""
    logsig = torch.nn.functional.logsigmoid
    p = torch.sigmoid(logit_p)
    return p * (logsig(logit_p) - logsig(logit_q)) + (1 - p) * (logsig(-logit_p) - logsig(-logit_q))


def expected_token_sum(a, b, a_ref, b_ref, length, token_term, detach_weights=False):
    """E_{Y~A}[Σ_t token_term(logit_A, logit_B)] exactly, by dynamic programming over the count.

    ``token_term`` maps the logits of A and B at each possible count to a per-count value. With
    ``detach_weights`` the distribution of the prefix is held fixed, so autograd differentiates the
    token terms only (the outer expectation of eq. (41)).
    """
    prob = torch.ones(1, dtype=DTYPE)  # P_A(c_{t-1} = k), k = 0..t-1
    total = torch.zeros((), dtype=DTYPE)
    for t in range(length):
        count = torch.arange(t + 1, dtype=DTYPE)
        logit_a, logit_b = a + b * count, a_ref + b_ref * count
        weights = prob.detach() if detach_weights else prob
        total = total + (weights * token_term(logit_a, logit_b)).sum()
        p_one = torch.sigmoid(logit_a)
        prob = torch.nn.functional.pad(prob * (1 - p_one), (0, 1)) + torch.nn.functional.pad(prob * p_one, (1, 0))
    return total


def _param_leaves(setting: ToySetting, shape=()):
    a = torch.full(shape, setting.a, dtype=DTYPE, requires_grad=True)
    b = torch.full(shape, setting.b, dtype=DTYPE, requires_grad=True)
    return a, b


def _grad(value, leaves):
    grads = torch.autograd.grad(value, leaves, allow_unused=True)
    return np.array([0.0 if g is None else g.item() for g in grads])


def exact_reverse_kl(setting: ToySetting, length: int) -> float:
    """KL(A‖B) = Σ_t E_{c_{t-1}~A}[KL(Bern(p_t^A) ‖ Bern(p_t^B))]."""
    return expected_token_sum(setting.a, setting.b, setting.a_ref, setting.b_ref, length, _bernoulli_kl).item()


def exact_reverse_kl_grad(setting: ToySetting, length: int) -> np.ndarray:
    """∇_(a,b) KL(A‖B): the gradient every configuration should estimate."""
    a, b = _param_leaves(setting)
    value = expected_token_sum(a, b, setting.a_ref, setting.b_ref, length, _bernoulli_kl)
    return _grad(value, (a, b))


def exact_forward_token_kl_grad(setting: ToySetting, length: int) -> np.ndarray:
    """Σ_t E_{y<t~A}[∇_θ KL(B(·|y<t) ‖ A(·|y<t))]: eq. (41), the expected gradient of K3 in the loss."""
    a, b = _param_leaves(setting)

    def forward_kl(logit_a, logit_b):
        return _bernoulli_kl(logit_b, logit_a)

    value = expected_token_sum(a, b, setting.a_ref, setting.b_ref, length, forward_kl, detach_weights=True)
    return _grad(value, (a, b))


def exact_token_reverse_kl_grad(setting: ToySetting, length: int) -> np.ndarray:
    """Σ_t E_{y<t~A}[∇_θ KL(A(·|y<t) ‖ B(·|y<t))] with the prefix's distribution held fixed: the gradient of
    each token's own reverse KL, which leaves out what token t does to the KL of the tokens after it. On-policy it
    is the expected gradient of every per-token correction in kl.LOSS_GRADIENTS (E[K1_t·∇log π_t | y<t])."""
    a, b = _param_leaves(setting)
    value = expected_token_sum(a, b, setting.a_ref, setting.b_ref, length, _bernoulli_kl, detach_weights=True)
    return _grad(value, (a, b))


def closed_form_reverse_kl_grad(setting: ToySetting, length: int) -> np.ndarray:
    """Eqs. (21)–(22) evaluated exactly by enumeration: E_A[Σ_t (y_t − p_t^A)(1, c_{t-1}) · log A/B]."""
    y = all_sequences(length)
    counts = counts_before(y)
    logp = token_logprobs(setting.a, setting.b, y, counts)
    ref_logp = token_logprobs(setting.a_ref, setting.b_ref, y, counts)
    prob = logp.sum(-1).exp()
    log_ratio = (logp - ref_logp).sum(-1)
    residual = y - torch.sigmoid(setting.a + setting.b * counts)
    d_a = (prob * residual.sum(-1) * log_ratio).sum()
    d_b = (prob * (residual * counts).sum(-1) * log_ratio).sum()
    return np.array([d_a.item(), d_b.item()])


def config_specs(estimators, placements, loss_gradients=()):
    """β = 1 specs of every estimator × placement; "none" once (its estimator is irrelevant); then every
    estimator in the loss with each of ``loss_gradients`` other than path-wise (the frameworks' variants)."""
    variants = [g for g in loss_gradients if g != kl.PATHWISE]
    return (
        [kl.KLSpec(e, p, 1.0) for p in placements for e in estimators if p != "none"]
        + ([kl.KLSpec(estimators[0], "none", 1.0)] if "none" in placements else [])
        + [kl.KLSpec(e, "loss", 1.0, g) for g in variants for e in estimators]
    )


def exact_estimator_mean(setting: ToySetting, length: int, spec: kl.KLSpec) -> np.ndarray:
    """E_{Y~A}[ĝ(Y)] exactly for one configuration's single-sequence gradient estimate (no baseline).

    Each of the 2^T sequences is its own group of one, weighted by its probability under A held
    fixed, so the autograd gradient is Σ_y A(y)·ĝ(y).
    """
    y = all_sequences(length).unsqueeze(-2)  # (2^T, 1, T): groups of one
    counts = counts_before(y)
    a, b = _param_leaves(setting)
    logp = token_logprobs(a, b, y, counts)
    ref_logp = token_logprobs(setting.a_ref, setting.b_ref, y, counts)
    prob = logp.sum(-1).squeeze(-1).exp().detach()
    losses = kl.reinforce_loss(logp, ref_logp, torch.ones_like(y), torch.zeros(y.shape[:-1], dtype=DTYPE), spec, "none")
    return _grad((prob * losses).sum(), (a, b))


def monte_carlo_estimates(setting, length, specs, trials, sequences, generator, advantage="none"):
    """Per-trial gradient estimates of every configuration: {config name: array (trials, 2)}.

    All configurations are evaluated on the same samples (common random numbers), as in the paper.
    """
    y = sample_sequences(setting.a, setting.b, length, (trials, sequences), generator)
    return estimates_from_samples(setting, y, specs, advantage)


def estimates_from_samples(setting, y, specs, advantage="none"):
    """Gradient estimates for sampled sequences ``y`` of shape (trials, sequences, T), one per trial.

    (a, b) are replicated once per trial, so one backward pass per configuration gives every trial's
    own gradient: trial i's loss depends only on copy i.
    """
    trials, sequences, _ = y.shape
    counts = counts_before(y)
    a, b = _param_leaves(setting, (trials, 1, 1))
    logp = token_logprobs(a, b, y, counts)
    ref_logp = token_logprobs(setting.a_ref, setting.b_ref, y, counts)
    mask = torch.ones_like(y)
    task_rewards = torch.zeros(trials, sequences, dtype=DTYPE)
    estimates = {}
    for spec in specs:
        loss = kl.reinforce_loss(logp, ref_logp, mask, task_rewards, spec, advantage).sum()
        grads = torch.autograd.grad(loss, (a, b), retain_graph=True, allow_unused=True)
        estimates[spec.name] = torch.stack(
            [torch.zeros(trials, dtype=DTYPE) if g is None else g.reshape(trials) for g in grads], -1
        ).numpy()
    return estimates


def _seed_for(seed: int, setting_name: str, length: int) -> int:
    return (seed * 1_000_003 + zlib.crc32(setting_name.encode()) * 7919 + length) % 2**63


EXACT_MAX_LENGTH = 16  # exact expectations by enumerating the 2^T sequences up to this T (65,536 sequences)


def bias_variance(
    setting: ToySetting,
    lengths,
    estimators=kl.ESTIMATORS,
    placements=kl.PLACEMENTS,
    trials=200,
    sequences=1000,
    seed=0,
    advantage="none",
    loss_gradients=(),
) -> pd.DataFrame:
    """The Figure 1 protocol for one setting: one row per (T, configuration, parameter).

    Columns: the true gradient, the Monte Carlo mean of the estimates, their bias, squared bias,
    variance across trials (one estimate per trial), the standard error of the mean and z = bias / SE; the
    gradient of the per-token reverse KL (``exact_token_reverse_kl_grad``); and, for T ≤ EXACT_MAX_LENGTH, the
    estimator's exact expectation by enumeration (``exact_mean``) and its exact bias (NaN beyond).
    """
    specs = config_specs(list(estimators), list(placements), list(loss_gradients))
    rows = []
    for length in lengths:
        true_grad = exact_reverse_kl_grad(setting, length)
        token_grad = exact_token_reverse_kl_grad(setting, length)
        exact = {
            spec.name: exact_estimator_mean(setting, length, spec) if length <= EXACT_MAX_LENGTH else np.full(2, np.nan)
            for spec in specs
        }
        generator = torch.Generator().manual_seed(_seed_for(seed, setting.name, length))
        # Trials in chunks of about CHUNK_ELEMENTS tokens: large CPU tensors cost page faults on
        # every allocation, and this is 5x faster than one (trials, sequences, T) batch.
        chunk = max(1, CHUNK_ELEMENTS // (sequences * length))
        chunks = [
            monte_carlo_estimates(setting, length, specs, min(chunk, trials - start), sequences, generator, advantage)
            for start in range(0, trials, chunk)
        ]
        for spec in specs:
            est = np.concatenate([c[spec.name] for c in chunks])
            mean, var = est.mean(0), est.var(0, ddof=1)
            for i, param in enumerate(PARAMS):
                bias = mean[i] - true_grad[i]
                se = np.sqrt(var[i] / trials)
                rows.append(
                    dict(
                        setting=setting.name,
                        T=length,
                        estimator=spec.estimator,
                        placement=spec.placement,
                        loss_gradient=spec.loss_gradient,
                        config=spec.name,
                        param=param,
                        true_grad=true_grad[i],
                        token_kl_grad=token_grad[i],
                        exact_mean=exact[spec.name][i],
                        exact_bias=exact[spec.name][i] - true_grad[i],
                        mean_estimate=mean[i],
                        bias=bias,
                        squared_bias=bias**2,
                        variance=var[i],
                        std_error=se,
                        z=_z_score(bias, se),
                        trials=trials,
                        sequences=sequences,
                    )
                )
    return pd.DataFrame(rows)


def _z_score(bias: float, se: float) -> float:
    """bias / SE; an estimator with no spread is exact (z = 0) or certainly biased (z = ±inf)."""
    if se > 0:
        return bias / se
    return 0.0 if abs(bias) < 1e-12 else float(np.sign(bias) * np.inf)


def _projections(group: pd.DataFrame) -> pd.Series:
    """Per (setting, T) with an exact expectation: <E[ĝ], ∇KL> / |∇KL|², how much of the KL's gradient the
    configuration's expected gradient carries (1: all of it; 0: none, e.g. K1 in the loss; < 0: it opposes it)."""
    if "exact_mean" not in group:
        return pd.Series(dtype=float)
    rows = group.dropna(subset=["exact_mean"])
    dot = (rows.exact_mean * rows.true_grad).groupby([rows.setting, rows["T"]]).sum()
    norm = (rows.true_grad**2).groupby([rows.setting, rows["T"]]).sum()
    return (dot / norm.where(norm > 0)).dropna()


def unbiasedness_tests(results: pd.DataFrame, alpha: float) -> pd.DataFrame:
    """Decide per configuration whether its gradient is unbiased, from the measured bias alone.

    H0 for each (setting, T, parameter): the expected estimate equals the true gradient; z = bias/SE
    is standard normal under H0 (200 trials). A configuration is declared biased when any of its m
    tests rejects at the Bonferroni level α/m (two-sided), so an unbiased configuration is wrongly
    called biased with probability at most α.

    Beside the test, the exact verdict where the toy enumerated the sequences: ``max_abs_exact_bias`` over the
    rows with T ≤ EXACT_MAX_LENGTH, overall and at T = 1 alone (NaN when no such row was run).
    """
    results = results.assign(loss_gradient=results.get("loss_gradient", kl.PATHWISE))
    rows = []
    for config, group in results.groupby("config", sort=False):
        estimator, placement, loss_gradient = group.iloc[0][["estimator", "placement", "loss_gradient"]]
        tests = len(group)
        critical = norm.ppf(1 - alpha / (2 * tests))
        max_abs_z = float(np.abs(group["z"]).max())
        worst = group.loc[np.abs(group["z"]).idxmax()]
        exact = group.get("exact_bias", pd.Series(dtype=float)).abs()
        projection = _projections(group)
        rows.append(
            dict(
                config=config,
                estimator=estimator,
                expression=kl.EXPRESSIONS[estimator],
                placement=placement,
                loss_gradient=loss_gradient,
                framework=kl.LOSS_GRADIENT_SOURCES[loss_gradient] if placement in ("loss", "both") else "",
                max_abs_exact_bias=exact.max() if exact.notna().any() else np.nan,
                min_projection=projection.min() if len(projection) else np.nan,
                max_projection=projection.max() if len(projection) else np.nan,
                max_abs_exact_bias_T1=exact[group["T"] == 1].max() if exact[group["T"] == 1].notna().any() else np.nan,
                tests=tests,
                alpha=alpha,
                z_critical=critical,
                max_abs_z=max_abs_z,
                worst_case=f"{worst['setting']}, T={worst['T']}, d/d{worst['param']}",
                unbiased=bool(max_abs_z <= critical),
                exact_unbiased=(
                    kl.exactly_zero(exact.max(), group["true_grad"].abs().max()) if exact.notna().any() else None
                ),
            )
        )
    return pd.DataFrame(rows)
