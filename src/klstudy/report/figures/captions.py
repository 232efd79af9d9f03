"""Captions whose numbers are read from the drawing, the abbreviations every caption defines, the claims' words, and
the conventions every figure shares, stated once (figures/README.md, which the report shows).

A caption's numbers come from two places only: the artists drawn (``Caption.value`` reads an artist's coordinate and
records the artist, so that a test recomputes the number from it) and the design the figure names (``Caption.number``:
β, seeds, steps; numbers a legend or title shows are the design's too). Nothing else: a number from another table,
another run or another seed has no way into a caption.
"""

from __future__ import annotations

import re
import textwrap

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle

NUMBER = re.compile(r"(?<![\w@.·^/_§])[−-]?\d+(?:\.\d+)?(?:e[−-]?\d+)?%?")


def numbers_in(text: str) -> list[str]:
    """The numbers a reader sees in a text ('−0.07', '15', '1e-12', '40%'), minus signs unified; digits inside
    names (K1, pass@1, MATH500, π_θ) are not numbers."""
    return [n.replace("−", "-") for n in NUMBER.findall(text)]


def read_artist(artist, index: int = -1, axis: str = "y") -> float:
    """The coordinate a caption quotes: a line's index-th y (or x), a bar's height (or its x centre)."""
    if isinstance(artist, Line2D):
        data = artist.get_ydata() if axis == "y" else artist.get_xdata()
        return float(np.asarray(data, dtype=float)[index])
    if isinstance(artist, Rectangle):
        return float(artist.get_height() if axis == "y" else artist.get_x() + artist.get_width() / 2)
    raise TypeError(f"a caption reads lines and bars, not {type(artist).__name__}")


def formatted(value: float, style: str) -> str:
    """'0.31' (style '.2f'), '0.035' ('.2g'), '40%' ('%')."""
    if pd.isna(value):
        return "n/a"
    if style == "%":
        return f"{value:.0%}"
    return f"{value:{style}}".replace("-", "−")


class CaptionText(str):
    """A caption, with the numbers it read from artists (``read``: (artist, index, axis, style, text)) and the
    design's numbers it names (``declared``)."""

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
        """A number of the design (β, seeds, steps, questions), not of the data."""
        text = formatted(float(value), style) if not isinstance(value, str) else value
        self.declared.append(text.replace("−", "-"))
        return text

    def design(self, text: str) -> str:
        """A text written from the config (a study's design, a panel's description, β of a claim): its numbers are
        the design's, declared as such."""
        self.declared += numbers_in(text)
        return text

    def add(self, *paragraphs: str) -> None:
        self.paragraphs += [p.strip() for p in paragraphs if p and p.strip()]

    def text(self) -> CaptionText:
        text = CaptionText("\n\n".join(self.paragraphs))
        text.read, text.declared = self.read, self.declared
        return text


# ---------------------------------------------------------------------------------------------------------
# Abbreviations: each caption defines those its figure and caption use.

GLOSSARY = {
    "KL": "Kullback–Leibler divergence",
    "K1": "the per-token log-ratio log(π_θ/π_ref), an estimator of the KL",
    "K2": "½·(log π_θ/π_ref)², per token",
    "K3": "π_ref/π_θ − 1 − log(π_ref/π_θ), per token (Schulman's estimator)",
    "π_θ": "the policy being trained",
    "π_ref": "the reference policy, the base model",
    "π_sampling": "the policy that sampled the batch",
    "β": "the KL coefficient",
    "se": "standard error",
    "sd": "standard deviation",
    "pass@1": "the fraction of held-out questions answered right, one sample each",
    "mean@": "accuracy averaged over k samples a question (mean@k)",
    "lm-eval": "EleutherAI's lm-evaluation-harness",
    "MMLU": "Massive Multitask Language Understanding (its college subjects)",
    "MATH": "the MATH competition problems (MATH test, MATH500, MATH² name the paper's sets)",
    "RLOO": "leave-one-out advantage: a completion's reward minus the mean of the others of its prompt",
    "GRPO": "group-relative advantage: reward minus the group's mean, ÷ the group's standard deviation",
    "Dr. GRPO": "GRPO without the division by the standard deviation",
    "G": "completions per prompt (group size)",
    "T": "tokens per answer",
    "J_β": "E[R] − β·KL(π‖π_ref), the objective a KL penalty optimises",
    "E[R]": "the expected task reward",
    "β_eff": "the β whose optimum of J_β has the end point's KL",
    "ratio-weighted": "the KL loss term × π_θ/π_old per token, π_old the policy that sampled the batch (TRL's default)",
    "score-weighted": "the KL loss term × exp(log π_θ − sg[log π_θ]), sg[·] a stop-gradient: a factor of value 1 "
    "whose gradient is the score (NeMo-RL)",
    "K2-gradient": "the KL's value with K2's gradient (verl's straight-through variants of K1 and K3)",
    "weighted K2-gradient": "K2's gradient × π_θ/π_old per token, π_old the policy that sampled the batch (OpenRLHF)",
    "TRL": "Hugging Face's Transformer Reinforcement Learning library",
    "z": "effect ÷ its se, signed towards the prediction",
}
# Abbreviations a reader meets in the images that are names, not terms (frameworks, datasets): not defined.
PROPER_NAMES = {"TRL", "NeMo", "RL", "MATH", "MMLU", "SkyRL", "OpenRLHF", "GRPO"}


def used(term: str, text: str) -> bool:
    if term in ("G", "T", "z"):  # single letters: only as symbols ('G = 8', 'T = 4', 'z 2.1')
        return re.search(rf"(?<![\w]){term}(\s*=|\s+\d|,\s*tokens)", text) is not None
    if term == "se":
        return re.search(r"(?<![\w])se(?![\w])", text) is not None
    if term == "sd":
        return re.search(r"(?<![\w])sd(?![\w])", text) is not None
    return term in text


def abbreviations(*texts: str) -> str:
    """'Abbreviations: K1: …; K3: …' for each GLOSSARY term the texts use (empty when none)."""
    joined = " ".join(texts)
    terms = [f"{term}: {GLOSSARY[term]}" for term in GLOSSARY if used(term, joined)]
    return ("Abbreviations: " + "; ".join(terms) + ".") if terms else ""


# Subscripts written with an underscore in the figures' code (π_ref, J_β): drawn as true subscripts (mathtext).
SUBSCRIPT = re.compile(r"(?<=[πJEβ])_(ref|sampling|old|end|optimum|eff|θ|β|π)(?![\w])")
MATH_SUBSCRIPT = re.compile(r"\$_(?:\{\\mathregular\{(\w+)\}\}|\\(theta|beta|pi))\$")
GREEK = {"θ": r"\theta", "β": r"\beta", "π": r"\pi"}


def as_math(text: str) -> str:
    """'KL(π_sampling‖π_ref)' with its subscripts as mathtext subscripts, in the text's own font (a text already
    holding '$' is left as it is)."""
    if "$" in text:
        return text
    return SUBSCRIPT.sub(lambda m: f"$_{GREEK[m[1]]}$" if m[1] in GREEK else f"$_{{\\mathregular{{{m[1]}}}}}$", text)


def plain(text: str) -> str:
    """as_math undone: 'π$_{\\mathregular{ref}}$' → 'π_ref' (the words the glossary and the checks read)."""
    names = {v.lstrip("\\"): k for k, v in GREEK.items()}
    return MATH_SUBSCRIPT.sub(lambda m: "_" + (m[1] or names[m[2]]), text)


def set_math(fig) -> None:
    """Every text of a figure with its subscripts drawn as subscripts (as_math)."""
    from matplotlib.text import Text

    for text in fig.findobj(Text):
        drawn = text.get_text()
        if "_" in drawn and as_math(drawn) != drawn:
            text.set_text(as_math(drawn))


def image_texts(fig) -> str:
    """Every text of a figure, wrapped lines joined, subscripts written back as π_ref (plain)."""
    from matplotlib.text import Text

    return " ".join(" ".join(plain(t.get_text()).split()) for t in fig.findobj(Text) if t.get_visible())


def finish(fig, caption: Caption) -> CaptionText:
    """The caption with its abbreviations paragraph: each term the image or the caption uses, defined; then the
    image's subscripts drawn as subscripts (set_math)."""
    caption.add(abbreviations(image_texts(fig), *caption.paragraphs))
    set_math(fig)
    return caption.text()


# ---------------------------------------------------------------------------------------------------------
# Claims in words.

PREDICTED_WORDS = {"higher": "predicted higher", "lower": "predicted lower", "same": "predicted the same",
                   "none": "no prediction"}  # fmt: skip


def claim_words(text: str, limit: int = 96) -> str:
    """A claim's words, short: its text; past ``limit`` characters without its parenthetical remarks, then up to its
    first colon."""
    text = " ".join(str(text).split())
    if len(text) > limit:
        text = re.sub(r"\s*\([^)]*\)", "", text)
    if len(text) > limit and ":" in text:
        text = text.split(":")[0]
    return text if len(text) <= limit else textwrap.shorten(text, limit, placeholder=" …")


def claim_beta(row) -> str:
    """The row's β in words: 'β = 1', 'β = 1 against 0.1', 'slope over β', '' (no KL, or no β)."""
    from klstudy.report.tables import claim_betas

    beta, below = claim_betas(row)
    if beta == "trend" or beta is None:
        return "slope over β" if beta else ""
    return f"β = {beta:g}" + (f" against {below:g}" if below is not None else "")


def verdict_line(row) -> str:
    """'K1 in the reward keeps …, β = 1: not shown'; a figure's caption gives the verdict in words (effect, interval
    and z: the claims forest)."""
    where = claim_beta(row)
    return f"{claim_words(row.get('text', row['claim']))}{', ' + where if where else ''}: {row['verdict']}"


def verdict_lines(rows: list[dict]) -> list[str]:
    """One line per claim, its rows' verdicts by β: 'K1 in the loss …: β = 0.1 not shown, β = 1 not shown'."""
    by_claim: dict[str, list[str]] = {}
    for row in rows:
        where = claim_beta(row)
        by_claim.setdefault(claim_words(row.get("text", row["claim"])), []).append(
            f"{where} {row['verdict']}" if where else str(row["verdict"])
        )
    return [f"{words}: {', '.join(dict.fromkeys(verdicts))}" for words, verdicts in by_claim.items()]


# ---------------------------------------------------------------------------------------------------------
# The conventions every figure shares: figures/README.md (the report shows it), said once.

CONVENTIONS = """\
How to read these figures
=========================

Every figure of this folder follows the conventions below; each caption says only what is particular to its figure.
The figures are drawn from the run's tables (the aggregated results, the claims table, the toy model's tables); a
number a caption gives of the data is read from what the figure draws, the others are the design's (β, seeds,
steps, questions).

Encoding
--------

- Colour: the KL configuration (where the penalty goes and which estimator), the same colour in every figure:
  {colours}.
- Marker shape: the placement of the penalty: ○ in the reward, □ in the loss, △ in both, ◇ no KL.
- Marker fill: the estimator: filled K1, hollow K3, half-filled K2.
- Line style (bars: hatching): β, the KL coefficient, by its value, the same in every figure: {betas}; solid: no KL
  (β = 0). A legend's sample is drawn as the line is.
- Grey: the base model (no RL). Green and red are kept for verdicts: green shown, red contradicted.
- Lines or points that lie on one another (or within a marker's height) are drawn in falling widths, the widest
  beneath, so that each shows an edge; the caption names them.

Noise, drawn as it is
---------------------

- With four training seeds or fewer, each seed is drawn as its own thin line or dot (a dot beside its mean's
  marker), and the mean over seeds as a thicker line or larger marker; no ±1 standard error band is drawn (with so
  few seeds it would look surer than a test that needs several standard errors). With five seeds or more, the mean
  is drawn with a ±1 standard error band, se = max(s/√n, √(Σ eᵢ²)/n): s the standard deviation over seeds, eᵢ seed
  i's own standard error.
- A smoothed training curve carries no band: the raw steps drawn thin beside it show its noise.
- A curve of one seed carries its own measurement error as a band, or, where more than two such curves share a
  panel, as a vertical bar at each point (bands would cover each other): for a held-out score, ±1 standard error over
  the questions evaluated (each question's score, one sample each: about √(p(1 − p)/questions)); for a bar,
  lm-eval's standard error over the questions; for a quantity averaged over prompts, its standard error over them.
- The base model is one evaluation: at step 0 of held-out curves a single grey point, the same in every figure
  that shows that task, its value the mean of its step-0 evaluations (every run evaluates it before training); every
  curve leaves from it, with no marker or band of its own at step 0.
- Smoothing, where used, is named on the axis, and the raw steps are drawn beside it as thin lines.
- Axes for small quantities keep a span that shows their noise; a single β is a category, not a point on a log
  axis.

Verdicts
--------

A difference between two lines, bars or points is a finding only where the claims table says shown. Its rule
reads effect ± critical·se, with critical the larger of {min_z} and Student's t at 1 − {alpha} with seeds − 1
degrees of freedom (31.8 at two seeds, 4.5 at four), corrected for the number of claims tested
(Benjamini–Hochberg at {q}). A figure never decides a claim from its means: its caption lists the verdicts of the
claims about what it draws, a ring in the verdict's colour marks a point whose claim is shown or contradicted, and
the claims forests draw every testable claim's effect ± critical·se, the interval the verdict reads.
"""


def conventions(config: dict) -> str:
    """CONVENTIONS filled from the style table and the claims rule (Markdown that is also reStructuredText)."""
    from klstudy.report.figures.encoding import BETA_STYLE_WORDS, BETA_STYLES, CONFIG_COLOURS, kl_label

    names = {"#0072B2": "blue", "#56B4E9": "sky blue", "#1D3F6E": "navy", "#E69F00": "orange", "#8C510A": "brown",
             "#F5D08A": "sand", "#CC79A7": "pink", "#7B2D64": "plum", "#E8B5D3": "light pink", "#3A2A8C": "indigo",
             "#B35806": "burnt orange", "#9970AB": "lavender", "black": "black"}  # fmt: skip
    colours = "; ".join(f"{kl_label(k)} {names.get(c, c)}" for k, c in CONFIG_COLOURS.items())
    betas = ", ".join(f"{b:g} {BETA_STYLE_WORDS[b]}" for b in BETA_STYLES)
    rule = config.get("claims_rule", {})
    return CONVENTIONS.format(colours=colours, betas=betas, min_z=rule.get("min_z", 3), alpha=rule.get("alpha", 0.01),
                              q=rule.get("q", 0.05))  # fmt: skip
