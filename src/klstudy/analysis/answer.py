"""The answer table docs/analysis.md leads with (README.md links it), after the words it uses: a row per framework
release, its default KL, the key that sets β, what the default amounts to (β_eff/β), and the setting it offers whose KL
gradient is unbiased, at the strength asked for.

Written from the code, never typed: the presets and what each framework offers (frameworks.py), each setting's bias
(explain.kl_gradient_bias, exact in the toy) and β_eff/β from the atlas's committed run (docs/atlas/tables/atlas.csv,
the parametric family, which resolves the field's small β). `python -m klstudy.analysis.answer --write` writes it into
PAGES; a test holds them equal to it.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pandas as pd
import yaml

from klstudy.analysis.atlas import CLAMP_MARK, ratio_text
from klstudy.frameworks import OFF_BY_SWITCH, OFFERS, PRESETS, SUBCLASS, beta_key

ROOT = Path(__file__).resolve().parents[3]
ATLAS = ROOT / "docs" / "atlas" / "tables" / "atlas.csv"
FAMILY = "parametric"  # the family whose β_eff resolves the β people set (docs/atlas.md)
FIELD_BETA, STRONG_BETA = 0.04, 1.0  # the β each ratio is read at: one the field sets, one strong
TOLERANCE = 0.05  # as explain.STRENGTH_TOLERANCE: a factor this close to 1 is the strength asked
PAGES = (ROOT / "docs" / "analysis.md",)
BEGIN, END = "<!-- the answer table: begin -->", "<!-- the answer table: end -->"
# Every word of the table a reader meets first, said before it.
LEGEND = (
    "KLs are named estimator-placement ([KL names](kl-names.md)): `k1-reward`, K1 subtracted from the reward before "
    "the advantage; `k1-advantage`, K1 per token added to the advantage after its normalisation (OpenRLHF's and "
    'AReaL\'s "KL in the reward"); `k3-loss`, K3 in the loss (`-ratio`, `-score`: its gradient as TRL ≥ 1.10, '
    "NeMo-RL 0.7 take it). Advantages of the G responses to a prompt "
    "([glossary](glossary.md#grpo-dr-grpo-rloo-whitening)): `group_std`, GRPO's ÷ the group's std; `grpo`, the group "
    "mean only (Dr. GRPO's, not GRPO's); `rloo`, leave-one-out; `loo_std`, RLOO ÷ the others' std; `whiten`, ÷ the "
    "batch's std. β_eff/β: strength obtained over strength asked, in the toy's parametric family (the paper's policy; "
    "the other, tabular, is any distribution), "
    "or why none: `< x`, more KL than any optimum; `unsettled`, still moving; `drifts`, no fixed point. "
    f"{CLAMP_MARK}: the framework's clamp on the KL estimate binds, so the end point and the β to set depend on the "
    "path ([pitfalls](pitfalls.md#a-clamp-on-the-kl-estimate))."
)
# `grpo` is Dr. GRPO's normalisation (the group mean only), which a reader takes for GRPO's ÷ std (docs/glossary.md).
ADVANTAGE_WORDS = {"grpo": "`grpo`, the group mean only"}


def ratio_at(
    atlas: pd.DataFrame, config: str, normalisation: str, group: int, beta: float, preset: str | None = None
) -> tuple[str, int]:
    """(β_eff/β in words, CLAMP_MARK where the clamp binds; the G it was read at) of a setting in the atlas's run at
    ``beta``: where it has none, the atlas's words for why (ratio_text); "–" where the run lacks the setting; the
    nearest G the atlas has where it lacks ``group``; ``preset``'s own row (its clamp) where the run has one."""
    rows = atlas[(atlas.family == FAMILY) & (atlas.config == config) & (atlas.normalisation == normalisation)
                 & (atlas.beta == beta)]  # fmt: skip
    if rows.empty:
        return "–", group
    if preset and (rows.preset == preset).any():
        rows = rows[rows.preset == preset]
    nearest = rows.group.iloc[(rows.group - group).abs().argsort().iloc[0]]
    row = rows[rows.group == nearest].iloc[0]
    return ratio_text(row), int(nearest)


def _number(ratio: str) -> float | None:
    """A ratio_at cell's β_eff/β, None where it has none."""
    try:
        return float(ratio.rstrip(CLAMP_MARK))
    except ValueError:
        return None


def _strength(ratios: list[str], at: str) -> str:
    """β_eff/β at the field's and a strong β, and the advice to set another β where either is not the asked."""
    words = f"β_eff/β {' / '.join(ratios)} ({at})"
    asked = all(_number(r) is not None and abs(_number(r) - 1) <= TOLERANCE for r in ratios)
    return words if asked else words + ": set the β explain computes"


def recommended(preset, atlas: pd.DataFrame, toy_section: dict, name: str | None = None) -> str:
    """The unbiased setting ``preset``'s framework offers (explain.recommendation: its std off where it can), with
    β_eff/β at the field's and a strong β, and the β to set for the strength asked; ``name``, the preset's in
    PRESETS."""
    from klstudy.analysis import explain

    setting = explain.Setting(preset.kl, preset.normalisation, preset.group, 1.0, preset.clamp, preset.framework)
    found = explain.recommendation(setting, toy_section, own="its default")
    if explain.suggestion(setting, toy_section) is None:  # the framework's own trainer offers none
        kinds = sorted({preset.kl, *(c for c, _ in OFFERS.get(preset.framework, []))})
        answer = f"no unbiased KL ({', '.join(kinds)}: biased)"
        if found is None:
            return answer
        config, normalisation, words = SUBCLASS[preset.framework]
        via = "with klstudy's [`KLTrainer`](tutorial-kltrainer.md) (TRL 1.16.0)"
        return f"{answer}; {via}: {config} ({_setting(atlas, config, normalisation, words, preset, name)}"
    config, normalisation, switch = found
    words = f"{switch}, β: `{beta_key(preset.framework, config)}`"
    return f"{config} ({_setting(atlas, config, normalisation, words, preset, name)}"


def _setting(atlas: pd.DataFrame, config: str, normalisation: str, words: str, preset, name: str | None) -> str:
    """How to ask for ``config`` and, read at ``preset``'s G, its β_eff/β: the text after the KL's name."""
    own = name if config == preset.kl and normalisation == preset.normalisation else None
    read = [ratio_at(atlas, config, normalisation, preset.group, b, own) for b in (FIELD_BETA, STRONG_BETA)]
    group = read[0][1]
    at = f"G = {group}" + ("" if group == preset.group else f", the atlas's nearest to {preset.group}")
    advantages = ADVANTAGE_WORDS.get(normalisation, normalisation)
    return f"{words}, advantages {advantages}): {_strength([r for r, _ in read], at)}"


def table(atlas: pd.DataFrame, toy_section: dict) -> pd.DataFrame:
    rows = []
    for name, p in PRESETS.items():
        if not p.is_default or p.status != "release":
            continue
        key = f"β: `{beta_key(p.framework, p.kl)}`"
        if p.default_beta:
            default = f"on: {p.kl}, {key} = {p.default_beta:g}"
            ratio, _ = ratio_at(atlas, p.kl, p.normalisation, p.group, p.default_beta, name)
            amounts = f"{ratio} at β = {p.default_beta:g}"
        else:
            off = OFF_BY_SWITCH.get(p.framework, "β = 0")
            default, amounts = f"off ({off}); turned on: {p.kl}, {key}", "– (off)"
            if p.recipe_beta:
                ratio, _ = ratio_at(atlas, p.kl, p.normalisation, p.group, p.recipe_beta, name)
                amounts += f"; at its example script's β {p.recipe_beta:g}: {ratio}"
        rows.append({
            "release": f"{p.framework} {p.version}", "default: KL, the key that sets β (advantages, G)": f"{default} "
            f"({p.normalisation}, G = {p.group})", "β_eff/β of the default": amounts,
            f"recommended KL (unbiased gradient), β_eff/β at β = {FIELD_BETA:g} / {STRONG_BETA:g}": recommended(
                p, atlas, toy_section, name
            ),
        })  # fmt: skip
    return pd.DataFrame(rows)


def markdown(atlas_path: Path = ATLAS, config_path: Path = ROOT / "config.yaml") -> str:
    from klstudy.config import validate_config

    toy = validate_config(yaml.safe_load(Path(config_path).read_text()))["toy"]
    legend = textwrap.fill(LEGEND, 120, break_long_words=False, break_on_hyphens=False)
    return f"{legend}\n\n{table(pd.read_csv(atlas_path), toy).to_markdown(index=False)}"


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
