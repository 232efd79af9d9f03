"""The toy trained by sampling, as the trainer trains: where Monte Carlo runs end, whether that is the exact fixed
point (fixed_points.py), the toy's claims judged on those end points, and the section's tables.

Monte Carlo training follows the same update from sampled sequences, as the trainer does: the per-token loss is the
trainer's (``kl.clipped_surrogate`` plus ``kl.loss_penalty``, advantages from ``kl.shaped_rewards`` and RLOO),
on-policy (one update per batch) or off-policy (several minibatch updates per batch, clipped ratios, the reward's KL
taken from the sampling policy). Adam, as the trainer, with a step that decays as 1/(1 + k/k0), so that the last
iterate settles on a fixed point instead of hovering around it; many seeds at once.
β enters the shaped reward and the loss term only as a factor (kl.reward_penalty and kl.loss_penalty are β times
their value at β = 1: tests/test_fixed_points.py), which lets one batched step train every β of the grid together.

Agreement and claims compare the runs' end points with the exact ones (``agreement``, ``toy_claims``); the tables
(``write_tables``) put both side by side for the figure and docs/fixed-points.md.
"""

from __future__ import annotations

import zlib

import numpy as np
import pandas as pd
import torch

from klstudy import claims_rule, kl
from klstudy.analysis.fixed_points import (
    DRIFT_BOUND,
    DTYPE,
    Family,
    policy_metrics,
    task_reward,
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
    family: Family, reward: dict, config: str, betas, settings: dict, mode: str, normalisation: str = "rloo",
    clamp: float | None = None,
) -> pd.DataFrame:  # fmt: skip
    """Train the configuration from the reference by sampled updates, every β of ``betas`` × ``settings['seeds']``
    seeds in one batch; one row per (β, seed) with the end point (the last iterate). ``normalisation``: the
    advantage's (kl.token_advantages; batch_std and the whitening ones over each run's generation batch of groups ×
    group_size responses); ``clamp``: the KL estimator's (kl.KLSpec.clamp).

    ``mode``: "on-policy" (one update per generation batch) or "off-policy" (``settings['updates_per_batch']``
    minibatch updates per batch, the trainer's clipped ratios, the reward's KL from the sampling policy)."""
    updates = 1 if mode == "on-policy" else settings["updates_per_batch"]
    seeds, steps, groups, group_size = settings["seeds"], settings["steps"], settings["groups"], settings["group_size"]
    if groups % updates:
        raise ValueError(f"toy.fixed_points.monte_carlo.groups ({groups}) must split into {updates} minibatches")
    # β = 1: β itself is the factor below (kl's penalties are linear in it)
    spec = kl.KLSpec.from_name(config, 1.0, clamp=clamp)
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
            to_go = beta_tok * kl.advantage_penalty(old_logp, ref_logp, mask, spec)
            advantages = kl.token_advantages(shaped, to_go, mask, normalisation)
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


# ------------------------------------------------------------------------------------------------ agreement and claims


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
    (claims_rule.judged) on the Monte Carlo end points' task reward E_π[R]: per seed u, d_u = E[R] at the candidate's
    end point u − E[R] at the baseline (the family's optimum, exact; or another configuration's end point of the same
    seed index), with the exact fixed points' own difference beside it (``exact_effect``: what the seeds estimate).

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


# ------------------------------------------------------------------------------------------------ tables


FIXED_POINT_COLUMNS = {  # the table's columns, in words
    "family": "policy family",
    "config": "configuration",
    "beta": "β",
    "end": "end point",
    "reward": "task reward",
    "kl": "KL(π‖π_ref)",
    "optimum": "optimum's reward / KL",
    "gap": "gap J_β(optimum) − J_β(end)",
    "kl_to_optimum": "KL(π_end‖π_optimum)",
    "below_frontier": "reward below the frontier",
}


ROUND_OFF = 1e-12  # the table prints a value of smaller magnitude (round-off of a zero, either sign) as 0


def fixed_points_markdown(table: pd.DataFrame, name=str) -> str:
    """The fixed points' table for a reader (toy_fixed_points.md, after its figure's caption): each configuration by
    ``name`` (the figures' words for it: encoding.config_words, which this layer may not import), the columns in
    words, '–' where the reward below the frontier is undefined."""

    def number(style: str):  # round-off (below ROUND_OFF in magnitude, either sign) printed as 0: display only
        return lambda values: values.map(
            lambda v: "–" if pd.isna(v) else "0" if abs(v) < ROUND_OFF else format(v, style)
        )

    shown = table.assign(
        config=lambda t: t.config.map(name),
        end=lambda t: t.status,
        reward=lambda t: number(".3g")(t.reward),
        kl=lambda t: number(".3g")(t.kl),
        optimum=lambda t: [f"{r:.3g} / {k:.3g}" for r, k in zip(t.optimum_reward, t.optimum_kl, strict=True)],
        gap=lambda t: number(".2g")(t.objective_gap),
        kl_to_optimum=lambda t: number(".2g")(t.kl_to_optimum),
        below_frontier=lambda t: number(".2g")(t.below_frontier),
    )
    return (
        "**The table: where each configuration's expected update ends** (exact, float64), against the optimum of "
        "J_β = E[R] − β·KL in the same policy family: the task reward and KL(π‖π_ref) at the end point, the optimum's "
        "reward / KL, the gap J_β(optimum) − J_β(end), KL(π_end ‖ π_optimum) and the reward below the frontier at "
        "the end point's KL (0 on the frontier: the optimum of another β; –: the end point's KL lies beyond the "
        f"frontier's; a value below {ROUND_OFF:g} in magnitude, float64 round-off, is printed as 0). Drifts: no "
        "fixed point; the update drives a logit past "
        f"±{DRIFT_BOUND:g} (reward and KL where it stopped). The toy model's fixed-points page of the documentation "
        "explains the table.\n\n"
        + shown[list(FIXED_POINT_COLUMNS)].rename(columns=FIXED_POINT_COLUMNS).to_markdown(index=False)
        + "\n"
    )


def write_tables(points: pd.DataFrame, agreed: pd.DataFrame, claims: pd.DataFrame, out_dir, name=str) -> None:
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
    (out_dir / "toy_fixed_points.md").write_text(fixed_points_markdown(table, name))
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
        "The toy's claims, judged by the claims table's rule (config claims_rule; claims_rule.judged) on the Monte "
        "Carlo end points' task reward: effect = mean over seeds of E_π[R] at the candidate's end point − E_π[R] at "
        "the baseline, ± its standard error; 'exact': the same difference between the exact end points, which the "
        "seeds estimate; tolerance: ± toy.fixed_points.tolerance × the reward the optimum gains over the reference "
        "at that β (same: shown with the whole interval effect ± critical·se inside it; higher, lower: shown beyond "
        "it). exact_status: the candidate's (and a configuration baseline's) exact end point; one that is not stable "
        "has no fixed point to compare, and the claim is not testable. docs/fixed-points.md explains the table.\n\n"
        + readable[columns].to_markdown(index=False)
        + "\n"
    )
