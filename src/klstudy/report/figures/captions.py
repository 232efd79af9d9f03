"""Captions whose numbers are read from the drawing, the claims' words, and the conventions every figure shares,
stated once (the conventions page, docs/figures.md; a run's figures/README.md).

A caption's numbers come from two places only: the artists drawn (``Caption.value`` reads an artist's coordinate and
records the artist, so that a test recomputes the number from it) and the design the figure names (``Caption.design``
and ``Caption.number``: β, seeds, steps). A number from another table or another run has no way into a caption.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.text import Text

NUMBER = re.compile(r"(?<![\w@.·^/_§])[−-]?\d+(?:\.\d+)?(?:e[−-]?\d+)?%?")
PIPELINE_CHECK = "Pipeline check, nothing testable at this scale: its claims pair too few seeds."


def numbers_in(text: str) -> list[str]:
    """The numbers a reader sees in text ('−0.07', '15', '40%'), minus signs unified; not digits in names (K1, π_θ)."""
    return [n.replace("−", "-") for n in NUMBER.findall(text)]


def formatted(value: float, style: str) -> str:
    return "n/a" if pd.isna(value) else f"{value:{style}}".replace("-", "−")


class CaptionText(str):
    """A caption, with what it read from artists (``read``: artist, index, axis, style, text) and ``declared``."""


class Caption:
    """A figure's caption, written as the figure is drawn."""

    def __init__(self):
        self.paragraphs, self.read, self.declared = [], [], []  # the texts, (artist, index, axis, style, text), numbers

    def value(self, artist, index: int = -1, style: str = ".2f", axis: str = "y") -> str:
        """The number a line draws, its index-th y (or x), as the caption prints it (recorded with the line)."""
        if not isinstance(artist, Line2D):
            raise TypeError(f"a caption reads lines, not {type(artist).__name__}")
        text = formatted(float(np.asarray(artist.get_ydata() if axis == "y" else artist.get_xdata())[index]), style)
        self.read.append((artist, index, axis, style, text))
        return text

    def number(self, value, style: str = "g") -> str:
        """A number of the design (β, seeds, steps), not of the data."""
        text = formatted(float(value), style)
        self.declared.append(text.replace("−", "-"))
        return text

    def design(self, text: str) -> str:
        """A text written from the config: its numbers are the design's."""
        self.declared += numbers_in(text)
        return text

    def add(self, *paragraphs: str) -> None:
        self.paragraphs += [p.strip() for p in paragraphs if p and p.strip()]

    def text(self) -> CaptionText:
        text = CaptionText("\n\n".join(self.paragraphs))
        text.read, text.declared = self.read, self.declared
        return text


def table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table (a caption's many numbers, where a sentence would list them)."""
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(str(cell) for cell in line) + " |" for line in lines)


# Subscripts written with an underscore in the figures' code (π_ref, J_β): drawn as true subscripts (mathtext).
SUBSCRIPT = re.compile(r"(?<=[πJEβ])_(ref|sampling|old|end|optimum|eff|θ|β|π)(?![\w])")
GREEK = {"θ": r"\theta", "β": r"\beta", "π": r"\pi"}


def as_math(text: str) -> str:
    """'KL(π_sampling‖π_ref)' with its subscripts as mathtext subscripts in the text's own font."""
    if "$" in text:
        return text
    return SUBSCRIPT.sub(lambda m: f"$_{GREEK[m[1]]}$" if m[1] in GREEK else f"$_{{\\mathregular{{{m[1]}}}}}$", text)


def finish(fig, caption: Caption) -> CaptionText:
    """The caption as written; the image's subscripts drawn as subscripts."""
    for text in fig.findobj(lambda artist: isinstance(artist, Text) and "_" in artist.get_text()):
        text.set_text(as_math(text.get_text()))
    return caption.text()


PREDICTED_WORDS = {"higher": "predicted higher", "lower": "predicted lower", "same": "predicted the same",
                   "none": "no prediction"}  # fmt: skip


def claim_words(text: str, limit: int = 90) -> str:
    """A claim's words, short: past ``limit`` characters without its parenthetical remarks, then to its colon."""
    text = " ".join(str(text).split())
    if len(text) > limit:
        text = re.sub(r"\s*\([^)]*\)", "", text)
    if len(text) > limit and ":" in text:
        text = text.split(":")[0]
    return text if len(text) <= limit else textwrap.shorten(text, limit, placeholder=" …")


def claim_beta(row) -> str:
    """The row's β in words: 'β = 1', 'β = 1 against 0.1', 'slope over β', ''."""
    from klstudy.report.tables import claim_betas

    beta, below = claim_betas(row)
    if beta == "trend" or beta is None:
        return "slope over β" if beta else ""
    return f"β = {beta:g}" + (f" against {below:g}" if below is not None else "")


CONVENTIONS = Path(__file__).with_name("conventions.md")  # the page's words, its numbers filled from the tables


def conventions(config: dict) -> str:
    """CONVENTIONS filled from the style table and the claims rule (Markdown that is also reStructuredText)."""
    from klstudy.report.figures import encoding as e

    colours = "; ".join(f"{e.config_words(k)} {name}" for k, (_, name) in e.CONFIG_COLOURS.items())
    betas = "; ".join(f"{b:g} {e.BETA_STYLE_WORDS[b].replace(', ', ' (bars: ')})" for b in e.BETA_STYLES)
    rule = config.get("claims_rule", {})
    return CONVENTIONS.read_text().format(colours=colours, betas=betas, min_z=rule.get("min_z", 3),
                                          q=rule.get("q", 0.05), alpha=rule.get("alpha", 0.01),
                                          seed_lines=e.MAX_SEED_LINES, coincide=f"{e.COINCIDE * 100:g}")  # fmt: skip
