"""The answer table docs/analysis.md leads with (README.md links it), after the words it uses: a row per framework
release, its default KL, what the default amounts to (β_eff/β), and the setting it offers whose KL gradient is
unbiased with its β_eff/β; below it, a note per release: the keys that set β, the flags, what the toy does not model.

Written from the code, never typed: the presets and what each framework offers (frameworks.py), each setting's bias
(explain.kl_gradient_bias, exact in the toy) and β_eff/β from the atlas's committed run (docs/atlas/tables/atlas.csv,
the parametric family, which resolves the field's small β). `python -m klstudy.analysis.answer --write` writes it into
PAGES; a test holds them equal to it.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import NamedTuple

import pandas as pd
import yaml

from klstudy.analysis.atlas import CLAMP_MARK, ratio_text
from klstudy.frameworks import OFF_BY_SWITCH, OFFERS, PRESETS, beta_key
from klstudy.kl import ADVANTAGE_WORDS

ROOT = Path(__file__).resolve().parents[3]
ATLAS = ROOT / "docs" / "atlas" / "tables" / "atlas.csv"
FAMILY = "parametric"  # the family whose β_eff resolves the β people set (docs/atlas.md)
FIELD_BETA, STRONG_BETA = 0.04, 1.0  # the β each ratio is read at: one the field sets, one strong
TOLERANCE = 0.05  # as explain.STRENGTH_TOLERANCE: a factor this close to 1 is the strength asked
PAGES = (ROOT / "docs" / "analysis.md",)
BEGIN, END = "<!-- the answer table: begin -->", "<!-- the answer table: end -->"
# Every word of the table a reader meets first, said before it (the advantages' words: kl.ADVANTAGE_WORDS).
LEGEND = (
    "KLs are named estimator-placement ([KL names](kl-names.md)): `k1-reward`, K1 subtracted from the sequence's "
    "reward before the advantage; `k1-advantage`, K1 per token added to the advantage after its normalisation "
    '(OpenRLHF\'s and AReaL\'s "KL in the reward"); `k3-loss`, K3 in the loss (`-ratio`, `-score`: the gradient '
    "of TRL ≥ 1.10, NeMo-RL 0.7). Advantages of the G responses to a prompt "
    "([glossary](glossary.md#grpo-dr-grpo-rloo-whitening)): {advantages}. β_eff/β: strength obtained ÷ "
    "asked, in the toy's parametric family{nearest}; `1 (exact)`: theory's, at any β and G; "
    "off 1 by over {tolerance}, set the β `klstudy explain` computes; or why none: {why}. "
    f"{CLAMP_MARK}: the framework's clamp on the KL estimate binds, so the end point and the β to set depend on the "
    "path ([pitfalls](pitfalls.md#a-clamp-on-the-kl-estimate)). `modelled:` the default is outside the toy."
)
# The atlas's words for a β_eff/β it has not (atlas.ratio_text), each said in the legend where the table uses it.
WHY_NONE = {"<": "`< x`, more KL than any optimum", "unsettled": "`unsettled`, still moving",
            "drifts": "`drifts`, no fixed point"}  # fmt: skip
SUBCLASS_HEAD = "none in {}; `KLTrainer`: "  # the recommended cell where only klstudy's subclass offers one
COLUMNS = ("release", "default (advantages, G)", "its β_eff/β", "recommended (unbiased KL)",
           f"β_eff/β at β {FIELD_BETA:g} / {STRONG_BETA:g}")  # fmt: skip


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


class Row(NamedTuple):
    """One release: its table cells, and its note below the table (the keys and flags)."""

    cells: dict
    note: str
    normalisations: set  # the advantages it names, which the legend defines


class Recommended(NamedTuple):
    """The recommended setting of a release as the table gives it."""

    cell: str  # the KL and its advantages
    strength: str  # β_eff/β at the field's and a strong β
    how: str  # the flags or keys that ask for it (the note)
    normalisation: str | None  # None: no setting


def recommended(preset, atlas: pd.DataFrame, toy_section: dict, name: str | None = None) -> Recommended:
    """The unbiased setting ``preset``'s framework offers (explain.recommendation: its std off where it can) or
    klstudy's KLTrainer, as the table gives it; ``name``, the preset's in PRESETS."""
    from klstudy.analysis import explain

    setting = explain.Setting(preset.kl, preset.normalisation, preset.group, 1.0, preset.clamp, preset.framework)
    found = explain.recommendation(setting, toy_section, own="its default")
    if found is None or found.via_subclass:  # the framework's own trainer offers none
        kinds = sorted({preset.kl, *(c for c, _ in OFFERS.get(preset.framework, []))})
        how = f"none ({', '.join(kinds)}: biased)"
        if found is None:
            return Recommended("none", "–", how, None)
        how = f"none among {preset.framework}'s own keys ({', '.join(kinds)}: biased)"
        trainer = "klstudy's [`KLTrainer`](tutorial-kltrainer.md), which needs TRL 1.16.0"
        return Recommended(f"{SUBCLASS_HEAD.format(preset.framework)}{found.config} "
                           f"({found.normalisation})", _strength(atlas, found, preset, name),
                           f"{how}; {trainer}: {found.how}", found.normalisation)  # fmt: skip
    key = beta_key(preset.framework, found.config)
    how = found.how + ("" if key == beta_key(preset.framework, preset.kl) else f", β: `{key}`")
    if (found.config, found.normalisation) == (preset.kl, preset.normalisation):
        how = "its default KL" + ("" if _is_asked(atlas, preset, name) else ", at the β `klstudy explain` computes")
    return Recommended(f"{found.config} ({found.normalisation})", _strength(atlas, found, preset, name), how,
                       found.normalisation)  # fmt: skip


def _is_asked(atlas: pd.DataFrame, preset, name: str | None) -> bool:
    """Whether ``preset``'s own β_eff/β at its default β (the field's where it has none) is within TOLERANCE of 1."""
    beta = preset.default_beta or FIELD_BETA
    rows = atlas[(atlas.family == FAMILY) & (atlas.preset == name) & (atlas.beta == beta)]
    return not rows.empty and rows.resolution.iloc[0] == "β_eff" and abs(rows.beta_eff_ratio.iloc[0] - 1) <= TOLERANCE


def _strength(atlas: pd.DataFrame, found, preset, name: str | None) -> str:
    """β_eff/β of the recommended setting at the field's and a strong β, read at ``preset``'s G (or the nearest); 1
    exactly, at any β and G, where theory says so (explain.EXACT)."""
    from klstudy.analysis import explain

    if (found.config, found.normalisation) in explain.EXACT:
        return explain.EXACT_ONE
    own = name if (found.config, found.normalisation) == (preset.kl, preset.normalisation) else None
    read = [ratio_at(atlas, found.config, found.normalisation, preset.group, b, own) for b in (FIELD_BETA, STRONG_BETA)]
    group = read[0][1]
    return " / ".join(r for r, _ in read) + ("" if group == preset.group else f" (at G {group})")


def _default_key(p) -> str:
    """The note's head: the key that sets the default KL's β, and why the KL is off where it is."""
    key = beta_key(p.framework, p.kl)
    if p.default_beta:
        return f"β: `{key}`"
    script = f"; its example script's β {p.recipe_beta:g}" if p.recipe_beta else ""
    if p.framework in OFF_BY_SWITCH:
        return f"off: {OFF_BY_SWITCH[p.framework]}{script}; β: `{key}`"
    return f"off: `{key}` = 0{script}"


def row(name: str, p, atlas: pd.DataFrame, toy_section: dict) -> Row:
    """A default preset's cells and note."""
    if p.default_beta:
        default = f"{p.kl}, β {p.default_beta:g}"
        amounts = ratio_at(atlas, p.kl, p.normalisation, p.group, p.default_beta, name)[0]
    else:
        default, amounts = f"off; on: {p.kl}", "–"
        if p.recipe_beta:
            ratio, _ = ratio_at(atlas, p.kl, p.normalisation, p.group, p.recipe_beta, name)
            amounts = f"{ratio} (β {p.recipe_beta:g})"  # the note says whose
    rec = recommended(p, atlas, toy_section, name)
    release = f"{p.framework} {p.version}"
    modelled_as = f"({'modelled: ' if p.modelled else ''}{p.normalisation}, {p.group})"
    cells = dict(zip(COLUMNS, (release, f"{default} {modelled_as}", amounts, rec.cell, rec.strength), strict=True))
    modelled = f" {p.modelled[:1].upper()}{p.modelled[1:]}." if p.modelled else ""
    note = f"- **{release}**: {_default_key(p)}.{modelled} Recommended: {rec.how}."
    return Row(cells, note, {p.normalisation} | ({rec.normalisation} if rec.normalisation else set()))


def table(atlas: pd.DataFrame, toy_section: dict) -> list[Row]:
    return [row(name, p, atlas, toy_section) for name, p in PRESETS.items() if p.is_default and p.status == "release"]


def markdown(atlas_path: Path = ATLAS, config_path: Path = ROOT / "config.yaml") -> str:
    from klstudy.config import validate_config

    toy = validate_config(yaml.safe_load(Path(config_path).read_text()))["toy"]
    rows = table(pd.read_csv(atlas_path), toy)
    used = set().union(*(r.normalisations for r in rows))
    advantages = "; ".join(f"`{name}`, {words}" for name, words in ADVANTAGE_WORDS.items() if name in used)
    cells = " ".join(" ".join(r.cells.values()) for r in rows)
    why = "; ".join(words for word, words in WHY_NONE.items() if word in cells)
    nearest = " (at G n: the atlas's nearest G)" if "(at G " in cells else ""
    legend = LEGEND.format(advantages=advantages, tolerance=f"{TOLERANCE:.0%}", why=why, nearest=nearest)
    legend = textwrap.fill(legend, 120, break_long_words=False, break_on_hyphens=False)
    notes = "\n".join(textwrap.fill(r.note, 120, subsequent_indent="  ", break_long_words=False,
                                     break_on_hyphens=False) for r in rows)  # fmt: skip
    grid = pd.DataFrame([r.cells for r in rows]).to_markdown(index=False)
    return f"{legend}\n\n{grid}\n\n{notes}"


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
