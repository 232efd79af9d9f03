"""Captions whose numbers are read from the drawing, the claims' words, and the conventions every figure shares,
stated once (the conventions page, docs/figures.md; a run's figures/README.md).

A caption's numbers come from two places only: the artists drawn (``Caption.value`` reads an artist's coordinate and
records the artist, so that a test recomputes the number from it) and the design the figure names (``Caption.design``
and ``Caption.number``: β, seeds, steps). A number from another table or another run has no way into a caption.
"""

from __future__ import annotations

import re
import textwrap

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.text import Text

NUMBER = re.compile(r"(?<![\w@.·^/_§])[−-]?\d+(?:\.\d+)?(?:e[−-]?\d+)?%?")
PIPELINE_CHECK = "Pipeline check, nothing testable at this scale: its claims pair too few seeds."


def numbers_in(text: str) -> list[str]:
    """The numbers a reader sees in a text ('−0.07', '15', '40%'), minus signs unified; digits inside names (K1,
    pass@1, MATH500, π_θ) are not numbers."""
    return [n.replace("−", "-") for n in NUMBER.findall(text)]


def read_artist(artist, index: int = -1, axis: str = "y") -> float:
    """The coordinate a caption quotes: a line's index-th y (or x)."""
    if not isinstance(artist, Line2D):
        raise TypeError(f"a caption reads lines, not {type(artist).__name__}")
    return float(np.asarray(artist.get_ydata() if axis == "y" else artist.get_xdata(), dtype=float)[index])


def formatted(value: float, style: str) -> str:
    return "n/a" if pd.isna(value) else f"{value:{style}}".replace("-", "−")


class CaptionText(str):
    """A caption, with what it read from artists (``read``: artist, index, axis, style, text) and ``declared``."""

    read: list
    declared: list


class Caption:
    """A figure's caption, written as the figure is drawn."""

    def __init__(self):
        self.paragraphs: list[str] = []
        self.read: list[tuple] = []
        self.declared: list[str] = []

    def value(self, artist, index: int = -1, style: str = ".2f", axis: str = "y") -> str:
        """The number an artist draws, as the caption prints it (recorded with the artist)."""
        text = formatted(read_artist(artist, index, axis), style)
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
MATH_SUBSCRIPT = re.compile(r"\$_(?:\{\\mathregular\{(\w+)\}\}|\\(theta|beta|pi))\$")
GREEK = {"θ": r"\theta", "β": r"\beta", "π": r"\pi"}


def as_math(text: str) -> str:
    """'KL(π_sampling‖π_ref)' with its subscripts as mathtext subscripts in the text's own font."""
    if "$" in text:
        return text
    return SUBSCRIPT.sub(lambda m: f"$_{GREEK[m[1]]}$" if m[1] in GREEK else f"$_{{\\mathregular{{{m[1]}}}}}$", text)


def plain(text: str) -> str:
    """as_math undone: 'π$_{\\mathregular{ref}}$' → 'π_ref'."""
    names = {v.lstrip("\\"): k for k, v in GREEK.items()}
    return MATH_SUBSCRIPT.sub(lambda m: "_" + (m[1] or names[m[2]]), text)


def image_texts(fig) -> list[str]:
    """Every visible text of a figure, subscripts written back as π_ref (plain)."""
    return [" ".join(plain(t.get_text()).split()) for t in fig.findobj(Text) if t.get_visible() and t.get_text()]


def finish(fig, caption: Caption) -> CaptionText:
    """The caption as written; the image's subscripts drawn as subscripts."""
    for text in fig.findobj(Text):
        if "_" in text.get_text():
            text.set_text(as_math(text.get_text()))
    return caption.text()


# Claims in words.

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


# The conventions every figure shares, said once.

CONVENTIONS = """\
How to read the figures
=======================

Every figure of the study follows these conventions; a caption says only what is particular to its figure. Each
number a caption gives of the data is read from what the figure draws.

Encoding
--------

- Colour: the KL configuration, one colour each, the same in every figure (runs, toy model, atlas): {colours}.
  Grey: the base model (no RL). Green and red are kept for verdicts.
- Marker shape: where the penalty goes: ○ in the reward, □ in the loss, △ in both, ▽ in the advantage, ◇ no KL.
- Marker fill: the estimator: filled K1, hollow K3, half-filled K2.
- Line style (bars: hatching): β, the KL coefficient, by its value: {betas}; solid: no KL (β = 0).

Noise
-----

- Up to four training seeds: each seed a thin line (bars: a dot), the mean over seeds thick, no band. Five seeds or
  more: the mean with a ±1 standard error band. One seed: ±1 standard error of the measurement itself (over
  questions or prompts), as a band or an error bar.
- The base model is one evaluation: a grey diamond at step 0, where every curve starts.
- A difference is a finding only where the claims table says shown. Its rule reads effect ± critical·se, critical
  the larger of {min_z} and Student's t at 1 − {alpha} with seeds − 1 degrees of freedom (31.8 at two seeds, 4.5 at
  four), corrected for the claims tested (Benjamini–Hochberg at {q}); a ring in the verdict's colour marks a point
  whose claim is shown or contradicted. A figure whose claims pair too few seeds to be told from noise is drawn as a
  check of the pipeline, and its caption says so first.

Words
-----

{glossary}
"""

GLOSSARY = {
    "K1": "the per-token log-ratio log(π_θ/π_ref), an estimator of the KL",
    "K2": "½·(log π_θ/π_ref)², per token",
    "K3": "π_ref/π_θ − 1 − log(π_ref/π_θ), per token (Schulman's estimator)",
    "π_θ, π_ref, π_sampling": "the policy trained; the reference, the base model; the policy that sampled the batch",
    "pass@1": "the fraction of held-out questions answered right, one sample each",
    "mean@k": "accuracy averaged over k samples a question (lm-eval: EleutherAI's lm-evaluation-harness)",
    "se": "standard error",
    "J_β": "E[R] − β·KL(π‖π_ref), the objective a KL penalty optimises; β_eff the β whose optimum has a setup's KL",
    "ratio-weighted, score-weighted": "the KL loss term × π_θ/π_old (TRL), × exp(log π_θ − sg[log π_θ]) (NeMo-RL)",
    "K2-gradient, weighted K2-gradient": "the KL's value with K2's gradient (verl), × π_θ/π_old (OpenRLHF)",
    "a procedural stand-in": "data the run generates in the role of one of the paper's datasets",
}


def conventions(config: dict) -> str:
    """CONVENTIONS filled from the style table and the claims rule (Markdown that is also reStructuredText)."""
    from klstudy.report.figures.encoding import BETA_STYLE_WORDS, BETA_STYLES, CONFIG_COLOURS, config_words

    colours = "; ".join(f"{config_words(k)} {name}" for k, (_, name) in CONFIG_COLOURS.items())
    betas = ", ".join(f"{b:g} {BETA_STYLE_WORDS[b]}" for b in BETA_STYLES)
    glossary = "\n".join(f"- {term}: {words}." for term, words in GLOSSARY.items())
    rule = config.get("claims_rule", {})
    return CONVENTIONS.format(colours=colours, betas=betas, glossary=glossary, min_z=rule.get("min_z", 3),
                              alpha=rule.get("alpha", 0.01), q=rule.get("q", 0.05))  # fmt: skip
