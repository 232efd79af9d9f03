"""`klstudy explain`: what a KL setup amounts to, computed in the toy model for any setting, a preset's or not.

Given a framework and version (its default KL setup, its other presets listed), a user's own setting in the
framework's words (framework_settings.py), a preset, or a setting of kl.py's grammar, it prints in a few lines:

- the estimator, placement and loss gradient in words; "off by default" where the framework's default β is 0;
- whether its KL term's expected gradient is the sequence-level KL's: exactly, in the toy's Table 1 setting "apart"
  (analysis/toy.py, no baseline) at T = 1 and T = 4, with kl.exactly_zero's rule;
- β_eff/β in both toy families (fixed_points.NormalisedUpdate, the atlas's end points) at the β asked for and over
  a range of β, and where the toy cannot say (no fixed point, an end point not settled near the boundary, more KL
  than any optimum);
- the recommended setting its framework offers (an unbiased KL gradient: frameworks.OFFERS, each checked the same
  way; klstudy's KLTrainer for TRL), as the answer table gives it: K1 in the reward with the group mean only where
  the framework can turn the std off (β_eff/β 1 exactly), else its own β_eff/β under the same normalisation and the β
  to set for the strength asked where that differs.

Every command it prints runs as printed. Nothing is read from a committed table: every number is computed when
asked, within the toy's limits, which the output says (its running time: docs/analysis.md, "Your setting").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from klstudy import framework_settings, kl
from klstudy.frameworks import OFF_BY_SWITCH, OFFERS, PRESETS, STD_OFF, SUBCLASS, beta_key, clamp_of

# The β over which the answer is computed beside the one asked for: the atlas's grid, weak to strong.
RANGE_BETAS = (0.1, 0.3, 1.0, 3.0)
# The suggested setting's β_eff/β counts as the strength asked for within this (the toy's end points are exact; a
# factor this close to 1 changes no reading of the atlas).
STRENGTH_TOLERANCE = 0.05
# How the commands it prints start: from the repository's root, with its virtual environment.
COMMAND = ".venv/bin/python -m klstudy explain"
# Where Table 1's bias is measured: its setting "apart" at these lengths (T = 1: a token; T = 4: a sequence).
BIAS_SETTING, BIAS_LENGTHS = "apart", (1, 4)
# Settings whose fixed point is the KL-regularised optimum at any β (β_eff/β = 1 exactly): K1 in the reward under RLOO,
# and under the group mean only, which is (G−1)/G times RLOO's advantage for the task and the KL term alike
# (docs/fixed-points.md). The toy cannot resolve them at a field's small β; these need no computing. EXACT_ONE: how
# their β_eff/β is written, here and in the answer table.
EXACT_ONE = "1 (exact)"
EXACT = {
    ("k1-reward", "rloo"): f"β_eff/β = {EXACT_ONE} at any β (theory, not measured: its end point is the "
    "KL-regularised optimum)",
    ("k1-reward", "mean"): f"β_eff/β = {EXACT_ONE} at any β (theory, not measured: the group-mean advantage is (G−1)/G "
    "times the leave-one-out one for the task and the KL term alike, so the end point is RLOO's, the KL-regularised "
    "optimum)",
}
# Said under a measured line of an EXACT setting: where the toy's measurement reads other than 1, it is the toy's.
MEASURED_VS_EXACT = (
    "  (exactly, by theory, this setting's β_eff/β is 1: where a measured line above reads otherwise, the toy's "
    "training or its optimum curve did not reach that β)"
)
# The words explain's output uses, said once before its numbers.
WORDS = (
    "words: G, responses per prompt; T, tokens per sequence of the toy; β_eff, the β whose exact optimum of "
    "E[R] − β·KL has the KL this setting's training ends at, so β_eff/β is the strength obtained over the strength "
    "asked (< 1: weaker); measured: the toy's training run to its end point, in its two policy families (tabular: "
    "any distribution over sequences; parametric: the paper's two-parameter policy); exact: by theory; not "
    "resolved: no β_eff read, because the end point is unsettled (training still moving when it stopped), drifts "
    "(no fixed point) or < x (more KL than the optimum at the smallest β computed, x·β); †: the framework's clamp "
    "on the KL estimate binds, so the end point depends on the path"
)


class Recommendation(NamedTuple):
    """The setting recommended in a framework: its KL configuration, advantages, how to ask for them, and whether
    it is klstudy's subclass because the framework's own trainer offers no unbiased KL (SUBCLASS)."""

    config: str
    normalisation: str
    how: str
    via_subclass: bool = False


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
        """The preset at ``beta``, else at its own β (its default, else its recipe's; 0.1 where it has neither)."""
        if name not in PRESETS:
            raise ValueError(f"preset {name!r} is not one of {sorted(PRESETS)}")
        p = PRESETS[name]
        beta = beta if beta is not None else own_beta(p) or 0.1
        return cls(p.kl, p.normalisation, p.group, beta, p.clamp, p.framework, f"{name} ({p.framework} {p.version})")


def own_beta(preset) -> float | None:
    """The β a preset runs at by itself: its default where on, else its recipe's; None: neither sets one."""
    return preset.default_beta or preset.recipe_beta


def release_presets(framework: str, version: str) -> list[str]:
    """The presets of ``framework`` whose version range holds ``version``, its default first (e.g. TRL 1.12 →
    trl-1.16)."""
    wanted = _version_tuple(version)
    names = []
    for name, p in PRESETS.items():
        if p.framework.lower() != framework.lower() or p.status != "release":
            continue
        low, _, high = p.version.partition("–")
        if _version_tuple(low) <= wanted <= _version_tuple(high or low):
            names.append(name)
    if not names:
        known = sorted({f"{p.framework} {p.version}" for p in PRESETS.values()})
        raise ValueError(f"no preset of {framework} {version} (its defaults were not read, even where its functions "
                         f"are checked: docs/frameworks.md): the presets read are {known}; for your setting, --kl")
    return sorted(names, key=lambda n: not PRESETS[n].is_default)


def preset_for(framework: str, version: str) -> str:
    """The framework's default KL setup at ``version``."""
    return release_presets(framework, version)[0]


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


def kl_gradient_size(toy_section: dict) -> dict[int, float]:
    """{T: max |∇KL(π‖π_ref)|} in kl_gradient_bias's setting: the scale its bias is read against."""
    from klstudy.analysis import toy

    setting = toy.ToySetting(BIAS_SETTING, **toy_section["settings"][BIAS_SETTING])
    return {length: float(np.abs(toy.exact_reverse_kl_grad(setting, length)).max()) for length in BIAS_LENGTHS}


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


def _meaning(row) -> str:
    """atlas.ratio_text's words for one end point (a row of atlas.end_points), spelled out for one line of output."""
    from klstudy.analysis import atlas  # torch: only when something is computed

    ratio = atlas.ratio_text(row)
    clamped = ratio.endswith(atlas.CLAMP_MARK)
    ratio = ratio.removesuffix(atlas.CLAMP_MARK)
    if ratio.startswith("<"):
        ratio = (f"{ratio} (it ends with more KL than the exact optimum at β = {row.curve_beta_min:g}, the smallest β "
                 "the toy computes the optimum at: β_eff is below that, by how much the toy cannot say)")  # fmt: skip
    ratio = {"drifts": "none (no fixed point: training drifts toward the reward's maximum)",
             "unsettled": "unsettled (the toy's training was still moving when it stopped: no end point to read)"
             }.get(ratio, ratio)  # fmt: skip
    return ratio + (" (its clamp binds there: the end point depends on the path)" if clamped else "")


def command(arguments: str, config: str | None = None) -> str:
    """A command line it prints, runnable as it stands (``config``: the --config it was given, where not the
    default)."""
    return f"{COMMAND} {arguments}" + (f" --config {config}" if config else "")


def setting_arguments(setting: Setting) -> str:
    """explain's own arguments for ``setting`` (--kl with its normalisation, G, β, clamp and framework)."""
    words = f"--kl {setting.config} --normalisation {setting.normalisation} --group {setting.group}"
    words += f" --beta {setting.beta:.3g}"
    words += f" --clamp {setting.clamp:g}" if setting.clamp else ""
    return words + (f" --on {setting.framework}" if setting.framework else "")


def ratios(tables: dict, beta: float) -> dict[str, tuple[float, str]]:
    """{family: (β_eff/β at ``beta``, NaN where not resolved; its words)}."""
    from klstudy.analysis import atlas

    out = {}
    for family, table in tables.items():
        at = table[table.beta == beta].iloc[0]
        out[family] = (float(at.beta_eff_ratio) if at.resolution == "β_eff" else float("nan"), atlas.ratio_text(at))
    return out


def explain(setting: Setting, toy_section: dict, range_betas=RANGE_BETAS, config: str | None = None) -> str:
    """The few lines `klstudy explain` prints for one setting (``toy_section``: config ``toy``: Table 1's settings,
    and the fixed points' families, reward and flow)."""
    section = toy_section["fixed_points"]
    bias = kl_gradient_bias(setting.config, toy_section)
    size = kl_gradient_size(toy_section)
    lines = [
        f"setting: {setting.label or setting.config}: {setting.config}, advantages {setting.normalisation} "
        f"({kl.ADVANTAGE_WORDS[setting.normalisation]}), G = {setting.group}, β = {setting.beta:g}"
        + (f", clamp ±{setting.clamp:g}" if setting.clamp else ""),
        WORDS,
        f"KL term: {describe(setting.config)}",
        "its gradient: "
        + ("unbiased" if unbiased(bias) else "biased")
        + " for the sequence-level KL (its bias, exactly, in the toy with the policy far from the reference: the "
        "largest |E[ĝ_KL] − ∇KL| over the policy's two parameters, and that over ∇KL's largest: "
        + ", ".join(f"{b:.2g} ({b / size[t]:.0%}) at T = {t}" for t, b in bias.items())
        + ")",
    ]
    tables = end_points(setting, section, range_betas)
    lines += [strength_line(family, table, setting.beta, section) for family, table in tables.items()]
    if (setting.config, setting.normalisation) in EXACT:
        lines.append(MEASURED_VS_EXACT)
    lines += recommended(setting, toy_section, tables, config)
    lines.append(limits(section))
    return "\n".join(lines)


def strength_line(family: str, table, beta: float, section: dict) -> str:
    """β_eff/β of one family at ``beta`` and over the rest of the table's β."""
    at = table[table.beta == beta].iloc[0]
    rest = table[table.beta != beta]
    resolved = rest[rest.resolution == "β_eff"]
    low, high = (
        (f"{resolved.beta_eff_ratio.min():.2f}", f"{resolved.beta_eff_ratio.max():.2f}") if len(resolved) else ("", "")
    )
    from klstudy.analysis import atlas  # torch: only when something is computed

    unresolved = rest[rest.resolution != "β_eff"]
    reasons = {r.beta: atlas.ratio_text(r) for r in unresolved.itertuples()}  # why each is not resolved (WORDS)
    why = "; ".join(f"{reason} at β = " + ", ".join(f"{b:g}" for b, r in reasons.items() if r == reason)
                    for reason in dict.fromkeys(reasons.values()))  # fmt: skip
    span = (low if low == high else f"{low}–{high}") + " at β = " + ", ".join(f"{b:g}" for b in resolved.beta)
    span = (span + (f"; {why}" if len(unresolved) else "")) if len(resolved) else why
    if not len(rest):
        span = ""
    return (
        f"β_eff/β, {family} family, measured (T = {section['length']}): {_meaning(at)} at β = {beta:g} "
        + (f"(too many groups of G = {at.group} to enumerate)" if at.status == "not enumerated"
           else f"(task reward {at.reward:.3g}, KL {at.kl:.3g})") + (f"; {span}" if span else "")
    )


def limits(section: dict) -> str:
    return (
        f"limits: a one-prompt toy (binary tokens, T = {section['length']}, a 0/1 reward, exact on-policy expected "
        "updates, no clipping or off-policy minibatches): read the direction and rough size, not a language model's "
        "numbers (docs/atlas.md)"
    )


def suggestion(setting: Setting, toy_section: dict, own: str = "this setting") -> tuple[str, str] | None:
    """(configuration, the switch that gives it) of the setting recommended in ``setting``'s framework: this one
    (``own``) where its KL gradient is unbiased, else the first unbiased one the framework offers; None where it
    offers none."""
    if unbiased(kl_gradient_bias(setting.config, toy_section)):
        return setting.config, own
    for config, switch in OFFERS.get(setting.framework, []):
        if config != setting.config and unbiased(kl_gradient_bias(config, toy_section)):
            return config, switch
    return None


def recommendation(setting: Setting, toy_section: dict, own: str = "this setting") -> Recommendation | None:
    """The Recommendation (configuration, advantages, how to ask) in ``setting``'s framework, as the answer table
    (analysis/answer.py) gives it: the suggestion, with the group mean only where the framework has that switch and
    the KL is in the reward (EXACT); klstudy's subclass where the framework offers no unbiased KL (SUBCLASS); None
    where neither."""
    found = suggestion(setting, toy_section, own)
    if found is None:
        if setting.framework not in SUBCLASS:
            return None
        return Recommendation(*SUBCLASS[setting.framework], via_subclass=True)
    name, switch = found
    if setting.framework in STD_OFF and name.endswith("-reward") and (name, setting.normalisation) not in EXACT:
        return Recommendation(name, "mean", f"{switch}, {STD_OFF[setting.framework]}")
    return Recommendation(name, setting.normalisation, switch)


def _how(found: Recommendation) -> str:
    """How to ask for the recommended setting, in explain's output."""
    if found.via_subclass:
        return f"klstudy's KLTrainer (TRL 1.16.0, docs/tutorial-kltrainer.md): {found.how}"
    return found.how


def recommended(setting: Setting, toy_section: dict, tables: dict, config: str | None) -> list[str]:
    """The recommended setting's lines: what it is, its β_eff/β at the β asked at the same G (1 exactly where EXACT),
    the β to set where that is not the strength asked, and the same with the std off where the framework can."""
    if not setting.framework:
        return ["recommended setting: name the framework (--on, with --kl) to look among its options"]
    return recommended_lines(setting, recommendation(setting, toy_section), toy_section, tables, config)


def recommended_lines(setting: Setting, found: Recommendation | None, toy_section: dict, tables: dict,
                      config: str | None) -> list[str]:  # fmt: skip
    """``recommended``'s lines for ``found``, the recommendation already made."""
    if found is None:
        listed = ", ".join(c for c, _ in OFFERS.get(setting.framework, [])) or "its KL loss only"
        return [f"recommended setting: none whose KL gradient is unbiased among what {setting.framework} offers "
                f"({listed})"]  # fmt: skip
    name, normalisation, switch = found.config, found.normalisation, _how(found)
    candidate = Setting(name, normalisation, setting.group, setting.beta, clamp_of(setting.framework, name),
                        setting.framework, name)  # fmt: skip
    head = f"recommended (its KL gradient unbiased): {name} ({switch}; β: {beta_key(setting.framework, name)}), "
    head += f"advantages {normalisation} ({kl.ADVANTAGE_WORDS[normalisation]}), "
    head += f"G = {setting.group}: "
    if (name, normalisation) in EXACT:
        return [head + f"{EXACT[name, normalisation]}; {command(setting_arguments(candidate), config)}"]
    section = toy_section["fixed_points"]
    same = name == setting.config and normalisation == setting.normalisation
    lines = [head + strength_at(candidate, section, tables if same else end_points(candidate, section, ()), config)]
    std_off = STD_OFF.get(setting.framework)
    if std_off and normalisation != "mean":
        plain = Setting(name, "mean", setting.group, setting.beta, candidate.clamp, setting.framework, name)
        lines.append(f"  with the std off ({std_off}): " + strength_at(plain, section, end_points(plain, section, ()),
                                                                        config))  # fmt: skip
    return lines


def strength_at(candidate: Setting, section: dict, tables: dict, config: str | None) -> str:
    """β_eff/β of ``candidate`` at its β in both families and, where the family that resolves it (parametric first)
    is off the strength asked by more than STRENGTH_TOLERANCE, the β to set instead, checked once."""
    asked = candidate.beta
    found = ratios(tables, asked)
    words = "β_eff/β " + ", ".join(f"{text} ({family})" for family, (_, text) in found.items())
    usable = [(family, r) for family, (r, _) in found.items() if r == r]
    if not usable:
        return words + f"; its strength at β = {asked:g} is not resolved in the toy"
    family, ratio = min(usable, key=lambda item: item[0] != "parametric")
    if abs(ratio - 1) <= STRENGTH_TOLERANCE:
        return words + f": the strength asked; {command(setting_arguments(candidate), config)}"
    from klstudy.analysis.atlas import CLAMP_MARK  # torch: only when something is computed

    # two significant figures: where the clamp binds (†) the end point depends on the path, and more are not meant
    instead = Setting(candidate.config, candidate.normalisation, candidate.group, float(f"{asked / ratio:.2g}"),
                      candidate.clamp, candidate.framework, candidate.label)  # fmt: skip
    again, text = ratios(end_points(instead, section, ()), instead.beta)[family]
    reached = again == again and abs(again * instead.beta / asked - 1) <= STRENGTH_TOLERANCE
    there = f"β_eff {again * instead.beta:.2g}" if again == again else "β_eff not resolved"
    approximately = "≈" if text.endswith(CLAMP_MARK) or found[family][1].endswith(CLAMP_MARK) else "="
    if reached:
        return (
            words
            + f"; for β_eff = {asked:g} set β {approximately} {instead.beta:g} ({there}, {family}): "
            + command(setting_arguments(instead), config)
        )
    return (
        words + f"; β = {instead.beta:g} gives {there} ({family}), not {asked:g}: no β found for the strength asked "
        f"under {candidate.normalisation}; " + command(setting_arguments(instead), config)
    )


@dataclass
class Release:
    """A framework at a version as explain reads it: its presets (default first), the setting to compute (None: off,
    or nothing to compute at), and the lines said before it."""

    names: list[str]
    setting: Setting | None
    head: list[str]


def resolve_release(framework: str, version: str, beta: float | None = None, tokens: list[str] | None = None,
                    group: int | None = None, config: str | None = None) -> Release:  # fmt: skip
    """Its default KL setup (or the user's own setting in its words, ``tokens``) at its own β unless ``beta`` is
    given, checked; nothing computed yet."""
    names = release_presets(framework, version)
    default = PRESETS[names[0]]
    release = f"{default.framework} {version}"
    if tokens:
        read = framework_settings.read(default, tokens, group)
        notes = f" ({'; '.join(read.notes)})" if read.notes else ""
        if read.config == kl.NO_KL:
            return Release(names, None, [f"your setting ({' '.join(tokens)}): off: no KL term in {release}{notes}"])
        setting = Setting(read.config, read.normalisation, read.group, beta or read.beta, read.clamp,
                          default.framework, f"your {release} setting ({' '.join(tokens)}){notes}")  # fmt: skip
        setting.check()
        return Release(names, setting, [])
    head = [f"{release}: {default.modelled}"] if default.modelled else []
    if not default.default_beta:
        at = ("the β given" if beta else "its example script's β") if beta or own_beta(default) else None
        off = OFF_BY_SWITCH.get(default.framework, "its default β is 0")
        head.append(f"{release}: off by default ({off}); turned on, its KL is {names[0]}"
                    + (f", computed below at {at}" if at else f": {describe(default.kl)}"))  # fmt: skip
    if beta is None and own_beta(default) is None:
        head.append("to compute it at the β you would set: " + command(f"--preset {names[0]} --beta 0.04", config))
        return Release(names, None, head)
    setting = Setting.of_preset(names[0], beta)
    setting.check()
    return Release(names, setting, head)


def explain_release(release: Release, toy_section: dict, range_betas=RANGE_BETAS, config: str | None = None) -> str:
    """A framework at a version: what ``resolve_release`` read, computed, then its other presets, each with the
    command that explains it."""
    others = [
        f"other preset of {p.framework} {p.version}: {name} ({p.kl}, {p.normalisation}, G = {p.group}"
        + (f", its β {own_beta(p):g}" if own_beta(p) else ", off by default")
        + "): "
        + command(f"--preset {name}", config)
        for name in release.names[1:]
        for p in [PRESETS[name]]
    ]
    if release.setting:
        computed = [explain(release.setting, toy_section, range_betas, config)]
    else:
        lines = recommended_when_off(release.names[0], toy_section, config)
        computed = [WORDS, *lines] if lines else []  # its β_eff said in words
    return "\n".join([*release.head, *computed, *others])


def recommended_when_off(name: str, toy_section: dict, config: str | None, beta: float = 0.04) -> list[str]:
    """The recommendation for a release computed at no β (its KL off), where it needs nothing computed: none, or
    one at β_eff/β 1 exactly (EXACT; its command at ``beta``, as the head's)."""
    setting = Setting.of_preset(name, beta)
    found = recommendation(setting, toy_section)
    if found is None or found[:2] in EXACT:
        return recommended_lines(setting, found, toy_section, {}, config)
    return []
