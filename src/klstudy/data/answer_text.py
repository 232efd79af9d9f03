"""Where a completion states its answer: its bounded tail, and its boxes as MATH's own answer extraction reads
them. Model output is untrusted text: every reader here looks only at a bounded part of it.
"""

from __future__ import annotations

import re

TAIL_CHARS = 4000  # only the end of a completion can hold its final answer
MAX_ANSWER_CHARS = 400


def tail(text) -> str:
    return text[-TAIL_CHARS:] if isinstance(text, str) else ""


_BOX = re.compile(r"\\(?:boxed|fbox)(?:\s*\{|[ \t]+)")


def _closing_brace(text: str, begin: int) -> int | None:
    """Index of the brace that closes the one opened just before ``begin``, looking no further than
    MAX_ANSWER_CHARS (model text is untrusted: an unclosed box costs a bounded scan)."""
    depth = 0
    for i in range(begin, min(len(text), begin + MAX_ANSWER_CHARS)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            if depth == 0:
                return i
            depth -= 1
    return None


def boxes(text: str) -> list[tuple[int, str | None]]:
    """Every box in ``text`` as (where it starts, its content), in order; the content is None for a box left open.

    A box is read as MATH's own answer extraction reads one (Hendrycks' ``last_boxed_only_string``, which
    lm-eval's hendrycks_math task keeps): ``\\boxed{...}`` or ``\\fbox{...}`` with braces matched to any depth,
    or ``\\boxed X`` without braces, whose content runs to the next ``$`` (or the line's end). A box inside a box
    is a box of its own, listed after the one around it.
    """
    found = []
    for match in _BOX.finditer(text):
        begin = match.end()
        if match.group().endswith("{"):
            end = _closing_brace(text, begin)
            found.append((match.start(), None if end is None else text[begin:end]))
        else:
            found.append((match.start(), re.split(r"[$\n]", text[begin : begin + MAX_ANSWER_CHARS])[0].strip()))
    return found


def last_boxed(text: str) -> str | None:
    """Content of the last box (``boxes``), or None when there is none or it is left open."""
    found = boxes(text)
    return found[-1][1] if found else None
