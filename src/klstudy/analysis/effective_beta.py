"""The optimum's KL against β, and its inverse: the effective β of an end point, and how far below the reward–KL
frontier it lies (the atlas's β_eff; docs/atlas.md). The family's optimum of J_β is fixed_points.family_optimum.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch

from klstudy.analysis.fixed_points import Family, family_of, family_optimum, policy_metrics, task_reward

# β_eff is searched in it, down to the field's smallest β; an end point whose KL is beyond the curve has none.
EFFECTIVE_BETA_RANGE = (1e-3, 1e2)
# The optimum's KL stops growing where it changes by less than this between two points of the curve: below that β
# the optimum is the reference conditioned on success to float64's resolution (tabular: below β ≈ 0.04, where the
# failures keep e^{−1/β} < 1e-10 of their weight), and no KL there tells one β from another.
KL_RESOLUTION = 1e-9
# How many times the curve's step in log β is halved where the family's optimum is not found (OptimumCurve).
REFINE = 6


class OptimumCurve:
    """KL(π*_β ‖ π_ref) of the family's optimum against β, and its inverse (``effective_beta``)."""

    def __init__(self, family: Family, rewards: torch.Tensor, points: int = 31):
        self.family, self.rewards = family, rewards
        # Down from the largest β, each optimum from the previous; the curve stops where the family has no interior
        # optimum any more (parametric, small β: the optimum's logits leave for the boundary), or where its KL stops
        # growing (KL_RESOLUTION). Where Newton's method fails, the step in log β is halved (REFINE times at most)
        # before the curve stops: the grid's factor of 1.6 would otherwise end it up to that factor above where the
        # interior optimum ends (parametric, T = 11: at β = 0.32 where it exists down to 0.23).
        self.optima, start, last_kl = {}, family.reference_theta(), -math.inf
        top, bottom = (math.log(b) for b in EFFECTIVE_BETA_RANGE[::-1])
        log_beta, step, halvings = top, (top - bottom) / (points - 1), 0
        while log_beta >= bottom - 1e-9:
            beta = math.exp(log_beta)
            try:
                theta = family_optimum(family, rewards, beta, start)
            except RuntimeError:
                if not self.optima or halvings == REFINE:
                    break
                step, halvings = step / 2, halvings + 1
                log_beta = math.log(min(self.optima)) - step
                continue
            kl_value = self.kl_at(beta, theta)
            if kl_value - last_kl < KL_RESOLUTION:
                break
            self.optima[beta], start, last_kl = theta, theta, kl_value
            log_beta -= step
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
