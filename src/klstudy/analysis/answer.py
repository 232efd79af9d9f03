"""The answer table docs/analysis.md leads with (README.md links it): a row per framework release, its default KL, what
that amounts to (β_eff/β), and the setting it offers whose KL gradient is unbiased, at the strength asked for.

Written from the code, never typed: the presets and what each framework offers (frameworks.py), each setting's bias
(explain.kl_gradient_bias, exact in the toy) and β_eff/β from the atlas's committed run (docs/atlas/tables/atlas.csv,
the parametric family, which resolves the field's small β). `python -m klstudy.analysis.answer --write` writes it into
PAGES; a test holds them equal to it.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import yaml

from klstudy.analysis.explain import COMMAND
from klstudy.frameworks import OFFERS, PRESETS, STD_OFF

ROOT = Path(__file__).resolve().parents[3]
ATLAS = ROOT / "docs" / "atlas" / "tables" / "atlas.csv"
FAMILY = "parametric"  # the family whose β_eff resolves the β people set (docs/atlas.md)
FIELD_BETA, STRONG_BETA = 0.04, 1.0  # the β each ratio is read at: one the field sets, one strong
TOLERANCE = 0.05  # as explain.STRENGTH_TOLERANCE: a factor this close to 1 is the strength asked
PAGES = (ROOT / "docs" / "analysis.md",)
BEGIN, END = "<!-- the answer table: begin -->", "<!-- the answer table: end -->"


def ratio_at(atlas: pd.DataFrame, config: str, normalisation: str, group: int, beta: float) -> tuple[float, int]:
    """(β_eff/β, the G it was read at) of a setting in the atlas's run at ``beta`` (NaN: not resolved); the nearest
    G the atlas has where it lacks ``group``."""
    rows = atlas[(atlas.family == FAMILY) & (atlas.config == config) & (atlas.normalisation == normalisation)
                 & (atlas.beta == beta)]  # fmt: skip
    if rows.empty:
        return float("nan"), group
    nearest = rows.group.iloc[(rows.group - group).abs().argsort().iloc[0]]
    row = rows[rows.group == nearest].iloc[0]
    return (float(row.beta_eff_ratio) if row.resolution == "β_eff" else float("nan")), int(nearest)


def _ratio_words(ratios: list[float]) -> str:
    return " / ".join("–" if r != r else f"{r:.2f}" for r in ratios)


def recommended(preset, atlas: pd.DataFrame, toy_section: dict) -> str:
    """The unbiased setting ``preset``'s framework offers (its std off where it can), with β_eff/β at the field's
    and a strong β, and the β to set for the strength asked."""
    from klstudy.analysis import explain

    offered = [(preset.kl, "its default")] + OFFERS.get(preset.framework, [])
    unbiased = [(c, s) for c, s in offered if explain.unbiased(explain.kl_gradient_bias(c, toy_section))]
    if not unbiased:
        kinds = sorted({c for c, _ in offered})
        return f"none: every KL it offers has a biased gradient ({', '.join(kinds)})"
    config, switch = unbiased[0]
    normalisation, words = preset.normalisation, switch
    if preset.framework in STD_OFF and config.endswith("-reward"):
        normalisation, words = "grpo", f"{switch}, {STD_OFF[preset.framework]}"
    read = [ratio_at(atlas, config, normalisation, preset.group, b) for b in (FIELD_BETA, STRONG_BETA)]
    ratios, group = [r for r, _ in read], read[0][1]
    at = f"G = {group}" + ("" if group == preset.group else f", the atlas's nearest to {preset.group}")
    strength = f"β_eff/β {_ratio_words(ratios)} at β = {FIELD_BETA:g} / {STRONG_BETA:g} ({at})"
    if any(r != r or abs(r - 1) > TOLERANCE for r in ratios):
        strength += ": set the β explain computes"
    return f"{config} ({words}, advantages {normalisation}): {strength}"


def table(atlas: pd.DataFrame, toy_section: dict) -> pd.DataFrame:
    rows = []
    for p in PRESETS.values():
        if not p.is_default or p.status != "release":
            continue
        if p.default_beta:
            default = f"on: {p.kl}, β = {p.default_beta:g}"
            ratio, _ = ratio_at(atlas, p.kl, p.normalisation, p.group, p.default_beta)
            amounts = (
                _ratio_words([ratio]) + (" (not resolved)" if ratio != ratio else "") + f" at β = {p.default_beta:g}"
            )
        else:
            default, amounts = f"off (β = 0); turned on: {p.kl}", "– (off)"
            if p.recipe_beta:
                ratio, _ = ratio_at(atlas, p.kl, p.normalisation, p.group, p.recipe_beta)
                amounts += f"; at its recipe's β {p.recipe_beta:g}: " + (
                    _ratio_words([ratio]) if ratio == ratio else "not resolved"
                )
        rows.append({
            "release": f"{p.framework} {p.version}", "default (advantages, G)": f"{default} ({p.normalisation}, "
            f"G = {p.group})", "β_eff/β of the default": amounts,
            "recommended KL at your β (unbiased gradient)": recommended(p, atlas, toy_section),
            "explain it": f"`{COMMAND} --framework {p.framework} --version {p.version.split('–')[-1]}`",
        })  # fmt: skip
    return pd.DataFrame(rows)


def markdown(atlas_path: Path = ATLAS, config_path: Path = ROOT / "config.yaml") -> str:
    from klstudy.config import validate_config

    toy = validate_config(yaml.safe_load(Path(config_path).read_text()))["toy"]
    return table(pd.read_csv(atlas_path), toy).to_markdown(index=False)


def between_marks(page: str) -> str:
    """The table a page holds between BEGIN and END."""
    return page.split(BEGIN, 1)[1].split(END, 1)[0].strip()


def filled(page: str, text: str) -> str:
    """``page`` with ``text`` between its marks."""
    before, rest = page.split(BEGIN, 1)
    return f"{before}{BEGIN}\n{text}\n{END}{rest.split(END, 1)[1]}"


if __name__ == "__main__":
    import sys

    text = markdown()
    if sys.argv[1:] == ["--write"]:
        for page in PAGES:
            page.write_text(filled(page.read_text(), text))
    else:
        print(text)
