"""`klstudy explain`: what a KL setup amounts to, computed in the toy model for any setting, a preset's or not.

Given a framework preset (frameworks.py) or a setting (a configuration in kl.py's grammar, an advantage
normalisation, G, β and the estimator's clamp), it prints in a few lines:

- the estimator, placement and loss gradient in words;
- whether its KL term's expected gradient is the sequence-level KL's: exactly, in the toy's Table 1 setting "apart"
  (analysis/toy.py, no baseline) at T = 1 and T = 4, with kl.exactly_zero's rule;
- β_eff/β in both toy families (fixed_points.NormalisedUpdate, the atlas's end points) at the β asked for and over
  a range of β, and where the toy cannot say (no fixed point, an end point not settled near the boundary, more KL
  than any optimum);
- the nearest setting its framework offers whose KL gradient is unbiased (frameworks.OFFERS, each checked the same
  way).

Nothing is read from a committed table: every number is computed when asked (about a minute on one core), within the
toy's limits, which the output says.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from klstudy import kl
from klstudy.frameworks import OFFERS, PRESETS

# The β over which the answer is computed beside the one asked for: the atlas's grid, weak to strong.
RANGE_BETAS = (0.1, 0.3, 1.0, 3.0)
# Where Table 1's bias is measured: its setting "apart" at these lengths (T = 1: a token; T = 4: a sequence).
BIAS_SETTING, BIAS_LENGTHS = "apart", (1, 4)


@dataclass
class Setting:
    config: str
    normalisation: str
    group: int
    beta: float
    clamp: float | None = None
    framework: str | None = None
    label: str = ""

    def check(self) -> None:
        """A clear error for a setting the toy cannot compute: a name outside kl.py's grammar, an unknown
        normalisation, G < 2, β ≤ 0 or an unknown framework."""
        kl.KLSpec.from_name(self.config, self.beta, clamp=self.clamp)
        if self.normalisation not in kl.ADVANTAGES or self.normalisation == "none":
            raise ValueError(
                f"normalisation {self.normalisation!r} is not one of {[n for n in kl.ADVANTAGES if n != 'none']}"
            )
        if self.group < 2 or not self.beta > 0:
            raise ValueError(f"G must be ≥ 2 and β > 0, got G = {self.group}, β = {self.beta}")
        if self.framework is not None and self.framework not in OFFERS:
            raise ValueError(f"framework {self.framework!r} is not one of {sorted(OFFERS)}")

    @classmethod
    def of_preset(cls, name: str, beta: float | None = None) -> Setting:
        if name not in PRESETS:
            raise ValueError(f"preset {name!r} is not one of {sorted(PRESETS)}")
        p = PRESETS[name]
        beta = beta if beta is not None else (p.betas[-1] if p.betas else 0.1)
        return cls(p.kl, p.normalisation, p.group, beta, p.clamp, p.framework, f"{name} ({p.framework} {p.version})")


def preset_for(framework: str, version: str) -> str:
    """The preset of ``framework`` whose version range holds ``version`` (e.g. TRL 1.12 → trl-1.16)."""
    wanted = _version_tuple(version)
    for name, p in PRESETS.items():
        if p.framework.lower() != framework.lower() or p.status != "release":
            continue
        low, _, high = p.version.partition("–")
        if _version_tuple(low) <= wanted <= _version_tuple(high or low):
            return name
    known = sorted({f"{p.framework} {p.version}" for p in PRESETS.values()})
    raise ValueError(f"no preset of {framework} {version}: the presets read are {known}")


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split()[0].split(".") if part.isdigit())


def describe(config: str) -> str:
    """The configuration in words: estimator, placement, how its loss term is differentiated."""
    spec = kl.KLSpec.from_name(config, 1.0)
    if spec.placement == "none":
        return "no KL"
    where = {
        "reward": "in the reward, before the advantage's normalisation (the sequence's Σ_t K_t subtracted)",
        "loss": "in the loss",
        "both": "in the reward and in the loss",
        "advantage": "in the advantage, after the normalisation: −β·Σ_{s≥t} K_s per token (reward-to-go)",
    }[spec.placement]
    words = f"{spec.estimator.upper()} ({kl.EXPRESSIONS[spec.estimator]}, r = π_ref/π) {where}"
    if spec.in_loss or spec.placement in ("loss", "both"):
        words += f"; its loss term differentiated {spec.loss_gradient} ({kl.LOSS_GRADIENT_SOURCES[spec.loss_gradient]})"
    return words


def kl_gradient_bias(config: str, toy_section: dict) -> dict[int, float]:
    """{T: max |E[ĝ_KL] − ∇KL(π‖π_ref)|} of the configuration's KL term, exactly, in Table 1's setting (config
    ``toy.settings``; no baseline)."""
    from klstudy.analysis import toy

    setting = toy.ToySetting(BIAS_SETTING, **toy_section["settings"][BIAS_SETTING])
    spec = kl.KLSpec.from_name(config, 1.0)
    return {
        length: float(np.abs(toy.exact_estimator_mean(setting, length, spec) - toy.exact_reverse_kl_grad(setting,
                                                                                                           length)).max())
        for length in BIAS_LENGTHS
    }  # fmt: skip


def unbiased(bias: dict[int, float], scale: float = 1.0) -> bool:
    return all(kl.exactly_zero(value, scale) for value in bias.values())


def end_points(setting: Setting, section: dict, range_betas=RANGE_BETAS) -> dict:
    """{family: the atlas's table of this setting at the β asked for and ``range_betas``} (toy.fixed_points'
    families)."""
    from klstudy.analysis import atlas
    from klstudy.analysis import fixed_points as fp

    betas = sorted({setting.beta, *range_betas})
    row = dict(setting="explained", config=setting.config, normalisation=setting.normalisation,
               group=setting.group, preset="", clamp=setting.clamp, betas=betas)  # fmt: skip
    tables = {}
    for name in fp.FAMILIES:
        family = fp.family_of(section, name)
        table = atlas.end_points(family, section["reward"], [row], betas, section["flow"])
        tables[name] = atlas.with_clamp_binding(table, section["reference"])
    return tables


def _meaning(ratio: str) -> str:
    """atlas.ratio_text's words spelled out for one line of output."""
    from klstudy.analysis import atlas  # torch: only when something is computed

    clamped = ratio.endswith(atlas.CLAMP_MARK)
    ratio = ratio.removesuffix(atlas.CLAMP_MARK)
    if ratio.startswith("<"):
        ratio = f"{ratio} (more KL than any optimum of J_β has)"
    ratio = {"drifts": "none (no fixed point: it drifts to the reward's maximum)",
             "unsettled": "not resolved (its flow had not settled near the boundary)"}.get(ratio, ratio)  # fmt: skip
    return ratio + (" (its clamp binds there: the end point depends on the path)" if clamped else "")


def explain(setting: Setting, toy_section: dict, range_betas=RANGE_BETAS) -> str:
    """The few lines `klstudy explain` prints (``toy_section``: config ``toy``: Table 1's settings, and the fixed
    points' families, reward and flow)."""
    from klstudy.analysis import atlas  # torch: only when something is computed

    section = toy_section["fixed_points"]
    bias = kl_gradient_bias(setting.config, toy_section)
    lines = [
        f"setting: {setting.label or setting.config}: {setting.config}, advantages {setting.normalisation}, "
        f"G = {setting.group}, β = {setting.beta:g}" + (f", clamp ±{setting.clamp:g}" if setting.clamp else ""),
        f"KL term: {describe(setting.config)}",
        "its gradient: "
        + ("unbiased" if unbiased(bias) else "biased")
        + " for the sequence-level KL (exact bias in the toy's setting 'apart': "
        + ", ".join(f"{b:.2g} at T = {t}" for t, b in bias.items())
        + ")",
    ]
    for family, table in end_points(setting, section, range_betas).items():
        at = table[table.beta == setting.beta].iloc[0]
        rest = table[table.beta != setting.beta]
        ratios = rest.beta_eff_ratio[rest.resolution == "β_eff"]
        resolved = rest.beta[rest.resolution == "β_eff"]
        span = (
            f"{ratios.min():.2f}–{ratios.max():.2f} over β = {resolved.min():g}–{resolved.max():g}"
            if len(ratios)
            else "not resolved at any other β of " + ", ".join(f"{b:g}" for b in rest.beta)
        )
        if len(rest) and len(ratios) < len(rest):
            span += "; not resolved at β = " + ", ".join(f"{b:g}" for b in rest.beta[rest.resolution != "β_eff"])
        ratio = _meaning(atlas.ratio_text(at))
        lines.append(
            f"β_eff/β, {family} family (T = {section['length']}): {ratio} at β = {setting.beta:g} "
            f"(task reward {at.reward:.3g}, KL {at.kl:.3g}); {span}"
        )
    lines.append(nearest_unbiased(setting, toy_section))
    lines.append(
        f"limits: a one-prompt toy (binary tokens, T = {section['length']}, a 0/1 reward, exact on-policy expected "
        "updates, no clipping or off-policy minibatches): read the direction and rough size, not a language model's "
        "numbers (docs/atlas.md)"
    )
    return "\n".join(lines)


def nearest_unbiased(setting: Setting, toy_section: dict) -> str:
    """The first setting the framework offers whose KL gradient is unbiased (same normalisation and G)."""
    if not setting.framework:
        return "nearest unbiased setting: name a framework (--framework or --preset) to look among its options"
    offers = OFFERS.get(setting.framework, [])
    if unbiased(kl_gradient_bias(setting.config, toy_section)):
        return "nearest unbiased setting: this one"
    for config, switch in offers:
        if config != setting.config and unbiased(kl_gradient_bias(config, toy_section)):
            return (f"nearest unbiased setting {setting.framework} offers: {config} ({switch}), advantages "
                    f"{setting.normalisation}, G = {setting.group}")  # fmt: skip
    listed = ", ".join(c for c, _ in offers) or "its KL loss only"
    return f"nearest unbiased setting: none among what {setting.framework} offers ({listed})"
