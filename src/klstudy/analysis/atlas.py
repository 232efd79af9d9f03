"""The atlas: where the KL setups practitioners run end in the toy model, with advantage normalisation and group size,
in the user's units (the effective β), and against the answer's length.

A *setting* is a Table 1 configuration (kl.py's grammar) with an advantage normalisation (kl.ADVANTAGES) and a group
size G; a *preset* is a setting a framework ships at a version, with the files and lines it was read from, its clamp
and its default β (frameworks.py; config ``toy.atlas.presets`` chooses which). With ``frameworks_betas`` a
preset is evaluated there and at its own default and recipe β as well.
Each setting's exact end point is the stable fixed point of fixed_points.NormalisedUpdate, found as the toy's fixed
points are (fixed_points.fixed_point_branch); RLOO's expected update does not depend on G, so it is computed once.

Effective β. For an end point with KL(π‖π_ref) = k, β_eff is the β whose optimum (the family's) has that KL: the
optimum's KL falls from −log π_ref(R = 1) at β → 0 (the reference conditioned on success) to 0 at β → ∞, strictly,
so β_eff exists and is unique for 0 < k < −log π_ref(R = 1). β_eff/β < 1: the setting regularises less than the β the
user set asks for; > 1: more. A drifting setting has none; nor has an end point with more KL than any optimum.

Why a 0/1 reward with the KL in the loss only gives an exact rule. The shaped reward is then the task reward itself,
and any advantage that sums to zero in a group has E[A_1 | R_1] = c_G(p)·(R_1 − p) with p = P_π(R = 1): the task term
of the expected update is c_G(p)·∇p, while the KL term is the normalisation's own. So the setting's fixed point at β
is the RLOO fixed point (c = 1) at β / c_G(p_end): RLOO c = 1, group mean c = (G − 1)/G, batch std (many groups)
c = (G − 1)/(G·σ), σ = √(p(1 − p)), group std c_G(p) = E[A_1 | R_1 = 1]/(1 − p), which is 1/√2 at G = 2 for every p
and lies in [1.39, 1.50] at G = 4 (1.3995 at p = 1/2;
docs/record/atlas-derivations.md derives it). NeMo-RL's loo_std is not zero-sum,
but E[A_1 | R_1] is affine in the binary R_1 all the same: c = E[A_1 | R_1 = 1] − E[A_1 | R_1 = 0], the mean of the
reciprocal of the others' std (+ 1e-6; 1 where they agree). ``task_scale`` computes c_G(p) from kl.ADVANTAGES.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch

from klstudy import kl
from klstudy.analysis import fixed_points as fp
from klstudy.analysis.effective_beta import OptimumCurve
from klstudy.analysis.monte_carlo import agreement, toy_claims, train_monte_carlo
from klstudy.frameworks import presets_of


def label(config: str, normalisation: str, group: int) -> str:
    """A setting's name: ``<configuration>/<normalisation>/G<group size>``."""
    return f"{config}/{normalisation}/G{group}"


def preset_betas(section: dict, preset: dict) -> list[float] | None:
    """The β a preset is evaluated at beyond the section's: with ``frameworks_betas``, those and its own default and
    recipe β (a framework's 0 is its KL turned off: not a β); None without (the section's β only)."""
    if not section.get("frameworks_betas"):
        return None
    own = {b for b in (preset["default_beta"], preset["recipe_beta"]) if b}
    return sorted(set(section["betas"]) | set(section["frameworks_betas"]) | own)


def grid_settings(section: dict) -> list[dict]:
    """Every configuration × normalisation × G of config ``toy.atlas``, then the presets (with their names, clamps and
    β)."""
    settings = [
        dict(setting=label(c, n, g), config=c, normalisation=n, group=g, preset="", clamp=None, betas=None)
        for c in section["configs"]
        for n in section["normalisations"]
        for g in section["group_sizes"]
    ]  # fmt: skip
    for name, preset in presets_of(section).items():
        settings.append(
            dict(setting=name, config=preset["kl"], normalisation=preset["normalisation"], group=preset["group"],
                 preset=name, clamp=preset["clamp"], betas=preset_betas(section, preset))
        )  # fmt: skip
    return settings


def exactness(family: fp.Family, rewards: torch.Tensor, config: str, normalisation: str, group: int) -> str:
    """How the setting's expected update is known: "enumerated" (every group's multiset, or exact by linearity),
    "many groups" (batch_std: the limit of a batch of many groups), or "not enumerated" (too many groups)."""
    try:
        fp.NormalisedUpdate(family, rewards, kl.KLSpec.from_name(config, 1.0), normalisation, group)
    except ValueError:
        return "not enumerated"
    return "many groups" if normalisation == "batch_std" else "enumerated"


def end_points(family: fp.Family, reward: dict, settings: list[dict], betas, flow: dict) -> pd.DataFrame:
    """One row per (setting, β): the exact end point against the family's optimum (fixed_points.fixed_point_table's
    columns), how it is known, β_eff, and what the end point says at that β (``resolution``). A setting's own β
    (``setting['betas']``) replace ``betas``. RLOO's update is G-free: computed once per configuration."""
    rewards = fp.task_reward(family.sequences, reward)
    curve = OptimumCurve(family, rewards)
    cache, rows = {}, []
    for setting in settings:
        config, normalisation, group = setting["config"], setting["normalisation"], setting["group"]
        clamp, own_betas = setting.get("clamp"), tuple(setting.get("betas") or betas)
        how = exactness(family, rewards, config, normalisation, group)
        key = (config, normalisation, 2 if normalisation == "rloo" else group, clamp, own_betas)
        if how == "not enumerated":
            table = pd.DataFrame({"beta": list(own_betas), "status": how})
        elif key in cache:
            table = cache[key]
        else:

            def update_of(spec, normalisation=normalisation, group=group):
                return fp.NormalisedUpdate(family, rewards, spec, normalisation, group)

            table = cache[key] = fp.fixed_point_table(family, reward, [config], own_betas, flow, update_of, clamp)
        columns = {k: v for k, v in setting.items() if k != "betas"}
        table = table.assign(**columns, exact=how, family=family.name, T=family.length)
        rows.append(table)
    table = pd.concat(rows, ignore_index=True)
    for column in ("kl", "reward"):  # a row not enumerated has no end point; with no row enumerated, no such column
        if column not in table:
            table[column] = np.nan
    table["beta_eff"] = [
        curve.effective_beta(k) if status == "stable" else np.nan
        for k, status in zip(table.kl, table.status, strict=True)
    ]
    table["beta_eff_ratio"] = table.beta_eff / table.beta
    # Where β_eff is beyond the curve: an end point with more KL than the optimum at the curve's smallest β
    # regularises like a β below it ("< β_min"), drifting or not.
    table["beyond_curve"] = (table.status == "stable") & (table.kl >= curve.kls.max())
    table["curve_beta_min"] = curve.betas.min()
    # The reward below the frontier at the end point's KL: the optimum at β_eff has that KL and the most reward there
    # (none beyond the curve: no optimum the curve holds has that much KL).
    table["below_frontier"] = np.array([curve.frontier_reward(b) for b in table.beta_eff]) - table.reward
    table["resolution"] = [resolution(row, curve) for row in table.itertuples()]
    return table


def with_clamp_binding(points: pd.DataFrame, reference: dict) -> pd.DataFrame:
    """``points`` with ``clamp_binds``: the probability, under each end point, that a response has a token whose KL
    estimate passes the setting's clamp. There the token's penalty has no gradient, so a policy that has moved it
    far from the reference is no longer pulled back: the end point depends on the path (docs/pitfalls.md). NaN
    without a clamp or an end point. ``reference``: config toy.fixed_points.reference."""
    binds = []
    for row in points.itertuples():
        clamp, theta = getattr(row, "clamp", None), getattr(row, "theta", None)
        if clamp is None or pd.isna(clamp) or not isinstance(theta, str):
            binds.append(float("nan"))
            continue
        family = fp.Family(row.family, int(row.T), **reference)
        token_logp = family.token_logprobs(torch.tensor([float(v) for v in theta.split()], dtype=fp.DTYPE))
        value = kl.token_kl(token_logp, family.reference_logprobs(), kl.KLSpec.from_name(row.config).estimator)
        binds.append(float((token_logp.sum(-1).exp() * (value.abs() > clamp).any(-1)).sum()))
    return points.assign(clamp_binds=binds)


def resolution(row, curve: OptimumCurve) -> str:
    """What the end point at this β says, in words: "β_eff" where it has an effective β; otherwise why not."""
    if row.status == "stable" and np.isfinite(row.beta_eff):
        return "β_eff"
    if row.status == "stable" and row.beyond_curve:
        return (f"more KL than any optimum of J_β (which stops growing below β = {curve.betas.min():.2g}, with "
                f"KL {curve.kls.max():.4g}): β_eff below that, β_eff/β not resolved")  # fmt: skip
    if row.status == "drifts":
        return "no fixed point: it drifts to the reward's maximum, as no KL does"
    if row.status == "still moving":
        return ("not settled: its expected update, followed as far as toy.fixed_points.flow allows, had not stopped "
                "(near the boundary, where the update is as small as the probability left to move)")  # fmt: skip
    return str(row.status)


def task_scale(normalisation: str, group: int, p: float) -> float:
    """c_G(p) = E[A_1 | R_1 = 1] − E[A_1 | R_1 = 0] for a 0/1 reward with success probability p: the factor the
    normalisation puts on the task term of the expected update (RLOO: 1), since E[A_1 | R_1] is affine in the binary
    R_1 and a constant term has no expected gradient (for a zero-sum advantage it is E[A_1 | R_1 = 1]/(1 − p)). Exact,
    from kl.ADVANTAGES: the other G − 1 members' successes are enumerated (binomial); batch_std takes the batch's
    spread to be π's, √(p(1 − p)); a whitening normalisation is its centre's c divided by the spread of the centre's
    advantage over a batch of many groups (the KL in the loss: nothing per token is whitened with it)."""
    if normalisation in kl.WHITENED:
        centre = kl.WHITENED[normalisation]
        spread_squared = p * (1 - p) * ((group - 1) / group if centre == "mean" else 1.0)
        return task_scale(centre, group, p) / math.sqrt(max(spread_squared, kl.WHITEN_EPSILON))
    if normalisation == "none":
        return 1.0
    successes = torch.arange(group, dtype=torch.float64)  # among the other G − 1
    weights = torch.tensor([math.comb(group - 1, k) * p**k * (1 - p) ** (group - 1 - k) for k in range(group)],
                           dtype=torch.float64)  # fmt: skip
    others = (torch.arange(group - 1, dtype=torch.float64) < successes.unsqueeze(-1)).to(torch.float64)
    conditional = []
    for own in (1.0, 0.0):
        groups = torch.cat([torch.full((group, 1), own, dtype=torch.float64), others], -1)  # (k, G)
        if normalisation == "batch_std":
            spread = torch.tensor(math.sqrt(p * (1 - p)), dtype=torch.float64)
            advantages = kl.batch_std_advantages(groups.unsqueeze(-2), spread).squeeze(-2)
        else:
            advantages = kl.ADVANTAGES[normalisation](groups)
        conditional.append(float((weights * advantages[:, 0]).sum()))
    return conditional[0] - conditional[1]


# ------------------------------------------------------------------------------------------------ length


def length_family(section: dict, family_name: str, length: int) -> tuple[fp.Family, dict]:
    """The family at length T with the reward's threshold scaled with T: ceil(threshold_fraction × T)."""
    fixed = section["length"]
    threshold = max(1, math.ceil(fixed["threshold_fraction"] * length - 1e-9))
    return fp.Family(family_name, length, **section["reference"]), {"kind": "ones_at_least", "threshold": threshold}


def length_sweep(section: dict, flow: dict) -> pd.DataFrame:
    """Every length setting's exact end point at β ∈ ``length.betas`` for T = 1..max in each family (the parametric
    from T = 2: at T = 1 it is the tabular family), with its gap and β_eff."""
    sweep, rows = section["length"], []
    settings = [s for s in grid_settings(section) if s["setting"] in sweep["settings"]]
    for family_name, longest in sweep["max_length"].items():
        # At T = 1 the parametric slope b multiplies c_0 = 0: the family is the tabular one, with b unidentified.
        for length in range(1 if family_name == "tabular" else 2, longest + 1):
            family, reward = length_family(section, family_name, length)
            table = end_points(family, reward, settings, sweep["betas"], flow)
            rows.append(table.assign(threshold=reward["threshold"]))
    return pd.concat(rows, ignore_index=True)


# ------------------------------------------------------------------------------------------------ Monte Carlo


def monte_carlo(section: dict, reward: dict, family: fp.Family) -> pd.DataFrame:
    """The Monte Carlo runs of ``monte_carlo.settings``, on-policy, through the trainer's loss with each setting's
    normalisation and G (monte_carlo.train_monte_carlo); config column = the setting's name."""
    carlo, rows, trained = section["monte_carlo"], [], {}
    by_name = {s["setting"]: s for s in grid_settings(section)}
    for name in carlo["settings"]:
        setting = by_name[name]
        # A preset that is a grid setting in the toy (verl's and OpenRLHF's GRPO are K3 in the loss ÷ group std at
        # G = 8) has the same sampled updates: trained once, its runs carry each name.
        key = (setting["config"], setting["normalisation"], setting["group"], setting["clamp"])
        if key not in trained:
            trained[key] = train_monte_carlo(
                family, reward, setting["config"], carlo["betas"], dict(carlo, group_size=setting["group"]),
                "on-policy", setting["normalisation"], setting["clamp"],
            )  # fmt: skip
        rows.append(trained[key].assign(config=name))
    return pd.concat(rows, ignore_index=True)


def claims(end_points_mc: pd.DataFrame, points: pd.DataFrame, section: dict, rule: dict, tolerance: float):
    """The atlas's claims (config ``toy.atlas.claims``), judged as the toy's are (monte_carlo.toy_claims, through
    claims_rule.judged): the Monte Carlo end points' task reward against the optimum's or another setting's,
    ± tolerance × the optimum's reward gain; a side without a stable exact fixed point is not testable."""
    exact = points.assign(config=points.setting)
    return toy_claims(end_points_mc, exact, section["claims"], rule, tolerance)


# ------------------------------------------------------------------------------------------------ tables


def write_tables(points, length, runs, judged, section: dict, out_dir) -> None:
    """figures/atlas.{csv,md} (every setting × β × family with the Monte Carlo agreement where it was trained),
    figures/atlas_length.csv, figures/atlas_claims.csv."""
    from pathlib import Path

    out_dir = Path(out_dir)
    agreed = agreement(runs, points.assign(config=points.setting))
    table = points.merge(
        agreed[["family", "config", "beta", "mc_reward", "mc_reward_se", "mc_kl", "mc_kl_se", "agrees"]].rename(
            columns={"config": "setting", "agrees": "mc_agrees"}
        ),
        on=["family", "setting", "beta"],
        how="left",
    )
    table.to_csv(out_dir / "atlas.csv", index=False)
    length.to_csv(out_dir / "atlas_length.csv", index=False)
    judged.to_csv(out_dir / "atlas_claims.csv", index=False)
    (out_dir / "atlas.md").write_text(page(table, judged, section))


def agreement_text(points: pd.DataFrame) -> str:
    """How many end points Monte Carlo training checked and how many it disagrees with (atlas.csv's mc_agrees), so a
    disagreement is counted on the page, not only in the CSV; empty where the table has no Monte Carlo column."""
    checked = points["mc_agrees"].dropna() if "mc_agrees" in points else pd.Series(dtype=float)
    if checked.empty:
        return ""
    disagree = int((checked == 0).sum())
    return (f"Monte Carlo training ends where the exact update says at {len(checked) - disagree} of the {len(checked)} "
            f"end points it checked; the {disagree} others have mc_agrees 0 in atlas.csv.\n\n")


def page(points: pd.DataFrame, judged: pd.DataFrame, section: dict) -> str:
    """figures/atlas.md: the summary by preset, the Monte Carlo disagreements and the claims' verdicts. Every setting
    × β × family, the length sweep and each claim's effect are in atlas.csv, atlas_length.csv and atlas_claims.csv,
    not repeated here."""
    return (
        "The atlas (toy model, exact, float64): where each framework's KL setup ends, as β_eff/β (the β whose optimum "
        "of J_β = E[R] − β·KL has the end point's KL, over the β set; < 1: weaker than asked). Every setting × β × "
        "family: atlas.csv; the length sweep: atlas_length.csv. docs/atlas.md explains it.\n\n"
        "## Your framework, your version, your β\n\n"
        + summary_markdown(points, section)
        + "\n\n## Claims\n\n"
        + agreement_text(points)
        + "Each claim's verdict per family and β (Monte Carlo end points against the exact ones; effects, errors and "
        "tolerances: atlas_claims.csv).\n\n"
        + claims_table(judged).to_markdown(index=False)
        + "\n"
    )


def claims_table(judged: pd.DataFrame) -> pd.DataFrame:
    """One row per claim: what it predicts and its verdict at each β, a column per family (what it compares: its
    name, and atlas_claims.csv)."""
    rows = []
    for claim, rows_of in judged.groupby("claim", sort=False):
        first = rows_of.iloc[0]
        row = {"claim": claim, "predicted": first.predicted}
        for family, at in rows_of.groupby("family", sort=True):
            betas = " / ".join(f"{b:g}" for b in at.beta)
            row[f"{family}: β = {betas}"] = " / ".join(at.verdict)
        rows.append(row)
    return pd.DataFrame(rows)


CLAMP_MARK = "†"  # the setting's clamp binds at this end point (with_clamp_binding): it depends on the path


def ratio_text(row) -> str:
    """β_eff/β of one end point as the tables write it: the number, < a bound beyond the optimum curve, or why
    none (drifts: no fixed point; unsettled: not settled near the boundary); CLAMP_MARK where the clamp binds."""
    if row.resolution == "β_eff":
        text = f"{row.beta_eff_ratio:.2f}"
    elif row.status == "stable" and row.beyond_curve:
        text = f"< {row.curve_beta_min / row.beta:.2g}"
    else:
        text = {"drifts": "drifts", "still moving": "unsettled"}.get(row.status, str(row.status))
    return text + (CLAMP_MARK if getattr(row, "clamp_binds", 0) > 0 else "")


def _range_text(rows: pd.DataFrame) -> str:
    """β_eff/β over several β of one family: its range where resolved, and how many are not."""
    resolved = rows[rows.resolution == "β_eff"]
    parts = [f"{resolved.beta_eff_ratio.min():.2f}–{resolved.beta_eff_ratio.max():.2f}"] if len(resolved) else []
    if len(resolved) < len(rows):
        parts.append(f"{len(rows) - len(resolved)} of {len(rows)} not resolved")
    return "; ".join(parts) or "–"


def summary_table(points: pd.DataFrame, section: dict) -> pd.DataFrame:
    """One row per preset, what the atlas finds: β_eff/β at each β of ``betas`` in the parametric and the tabular
    family, and in the parametric family at the preset's own default and recipe β and over ``frameworks_betas``."""
    presets = presets_of(section)
    own_betas = {name: {b for b in (p["default_beta"], p["recipe_beta"]) if b} for name, p in presets.items()}
    field = set(section.get("frameworks_betas") or [])
    rows = []
    for name, p in presets.items():
        mine = points[points.preset == name]
        release = f"{p['framework']} {p['version']}" + (", a proposal" if p["status"] == "proposal" else "")
        row = {"preset (its name for explain)": f"`{name}`: {release}",
               "setting": f"{p['kl']}" + (f" ±{p['clamp']:g}" if p["clamp"] else "")
               + f", {p['normalisation']}, G = {p['group']}"}  # fmt: skip
        for family in ("parametric", "tabular"):  # the parametric family first: it resolves the field's small β
            at = mine[mine.family == family].set_index("beta", drop=False)  # a row keeps its β
            grid = [f"{ratio_text(at.loc[b])}" for b in section["betas"] if b in at.index]
            row[f"{family}: β_eff/β at β = {' / '.join(f'{b:g}' for b in section['betas'])}"] = " / ".join(grid)
            if field and family == "parametric":  # the tabular family cannot resolve the field's small β
                own = [f"{ratio_text(at.loc[b])} (β = {b:g})" for b in sorted(own_betas[name]) if b in at.index]
                row[f"{family}: at its own β"] = "; ".join(own) if own_betas[name] else "– (off by default)"
                row[f"{family}: β = {min(field):g}–{max(field):g}"] = _range_text(at[at.index.isin(field)])
        rows.append(row)
    return pd.DataFrame(rows)


def summary_markdown(points: pd.DataFrame, section: dict) -> str:
    """summary_table as Markdown with what its marks mean: the run's atlas.md leads with it."""
    return (
        summary_table(points, section).to_markdown(index=False)
        + f"\n\n{CLAMP_MARK}: the preset's clamp binds at that end point (a response has a token whose KL estimate "
        "passes it; the probability is atlas.csv's clamp_binds): that token's penalty has no gradient there, and where "
        "training ends depends on the path (docs/pitfalls.md). < x: more KL than any optimum of J_β has, so β_eff is "
        "below the optimum curve's smallest β; drifts: no fixed point; unsettled: not settled near the boundary; "
        "not resolved: one of these."
    )


