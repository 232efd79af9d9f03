"""Gold answers: which box of a reference solution is the answer, and the self-check of every staged dataset.

**The gold rule** for a MATH-style solution (docs/data.md, "Gold answers"), applied by ``math_gold``:

1. Every box of the solution is read as MATH's own answer extraction reads one (``answer_text.boxes``: ``\\boxed{}``,
   ``\\fbox{}``, nested braces, ``\\boxed 2``).
2. These are no answers: an empty box, one left open, a box that holds only a ``\\phantom`` (a blank drawn in an
   equation), and a box in a sentence that calls it "also accepted" or "also an acceptable answer" (a second
   answer the solution allows beside its main one).
3. One answer left, or several that the reward itself finds equal (``\\frac16`` and ``\\dfrac{1}{6}``): the gold is
   the last box, MATH's own rule.
4. The problem asks for several answers ("Enter all ...", "... separated by commas", "List all ...", "find all
   possible values") and the solution boxes several different ones: the gold is all of them, in order, joined by
   ", ". math-verify reads such a list as a set, as it reads a completion's "\\boxed{1}, \\boxed{2}" or
   "\\boxed{1, 2}".
5. Several different answers left otherwise (a step boxed before the answer, or two forms the reward does not
   equate): the gold is the last box, and the record is listed under ``several_boxed`` in the staging report.
6. No answer left: the record is set aside, not staged, and listed with its reason.

**The self-check** (``SelfCheck``), run by ``staging.prepare`` on every dataset before it is written: each staged
record's bare gold answer, given as a completion (``\\boxed{answer}``), must score 1 with the reward that training
and lm-eval use (``rewards.score``), or staging fails naming the ids. Where the dataset has reference solutions,
each is scored as a completion too, and the share that scores 1 (records set aside count as failures) must reach
the dataset's ``min_reference_pass``. The counts go into ``<name>.check.json`` beside the JSONL and into the job's
log.
"""

from __future__ import annotations

import collections
import re
from dataclasses import dataclass, field

from klstudy.data import answer_text, rewards

# math-verify's limit per call at staging: nothing is timed here, and a loaded login node must not fail a correct
# gold answer (the training reward's 0.5 s guards a training step against adversarial completions).
STAGING_TIMEOUT_SECONDS = 20.0
LISTED_IDS = 20  # ids named in an error message; the report lists them all

_ASKS_FOR_SEVERAL = re.compile(
    r"separated by (?:commas?|comma\(s\)|semicolons?)|\benter all\b|\blist all\b|\bfind all\b|\ball possible values\b",
    re.I,
)
_ALSO_ACCEPTED = re.compile(r"\balso\b[^.\n]{0,40}\baccept", re.I)
_BLANK = re.compile(r"\s*\\phantom\s*(?:\{[^{}]*\}|\S+)\s*")  # a box that only reserves space: a blank to fill in
# a sentence ends at ". " or ".$ " (its last words in inline math), or at a line break
_SENTENCE_END = re.compile(r"(?:[.!?]\$?(?=\s)|\n)")


@dataclass(frozen=True)
class Gold:
    """What the rule made of one solution: the answer (None: set aside) and which step of the rule decided."""

    answer: str | None
    rule: str  # "one box" | "equal boxes" | "joined" | "last of several" | "no answer"


def _sentence_around(text: str, start: int) -> str:
    before = [m.end() for m in _SENTENCE_END.finditer(text, 0, start)]
    after = _SENTENCE_END.search(text, start + 1)
    return text[(before[-1] if before else 0) : (after.start() if after else len(text))]


def answer_boxes(solution: str) -> list[str]:
    """The boxes of ``solution`` that can be answers (steps 1 and 2 of the rule), stripped, in order."""
    answers = []
    for start, content in answer_text.boxes(solution):
        if content is None or not content.strip() or _BLANK.fullmatch(content):
            continue
        if _ALSO_ACCEPTED.search(_sentence_around(solution, start)):
            continue
        answers.append(content.strip())
    return answers


def math_gold(problem: str, solution: str, equal) -> Gold:
    """The gold answer of a MATH-style record by the rule above; ``equal(a, b)``: the reward's verdict."""
    found = answer_boxes(solution)
    if not found:
        return Gold(None, "no answer")
    distinct = []
    for answer in found:  # in order, each kept unless the reward equates it with one already kept
        if not any(equal(answer, kept) for kept in distinct):
            distinct.append(answer)
    if len(distinct) == 1:
        return Gold(found[-1], "one box" if len(found) == 1 else "equal boxes")
    if _ASKS_FOR_SEVERAL.search(problem):
        return Gold(", ".join(distinct), "joined")
    return Gold(found[-1], "last of several")


def bare_completion(record: dict) -> str | None:
    """The record's gold answer written as a completion, or None where the gold is no answer (Countdown's target
    is reached by an expression; its reference solution is the check)."""
    if record["reward"] in ("math", "multiple_choice"):
        return f"\\boxed{{{record['answer']}}}"
    return None


@dataclass
class SelfCheck:
    """The reward of training and lm-eval, applied to gold answers at staging (its own math-verify worker, with a
    time limit for a loaded machine rather than for a training step)."""

    verifier: rewards.IsolatedMathVerifier = field(
        default_factory=lambda: rewards.IsolatedMathVerifier(timeout=STAGING_TIMEOUT_SECONDS)
    )

    def equal(self, first: str, second: str) -> bool:
        return rewards.math_reward(f"\\boxed{{{second}}}", first, self.verifier) == 1.0

    def score(self, record: dict, completion: str) -> float:
        return rewards.score(record, completion, self.verifier)

    def report(self, name: str, records: list[dict], set_aside: list[dict], min_reference_pass: float) -> dict:
        """Counts and ids of the self-check (written beside the dataset as ``<name>.check.json``)."""
        bare_scored = [r for r in records if bare_completion(r) is not None]
        bare_failed = [r["id"] for r in bare_scored if self.score(r, bare_completion(r)) != 1.0]
        referenced = [r for r in records if r.get("solution")]
        reference_failed = [r["id"] for r in referenced if self.score(r, r["solution"]) != 1.0]
        reference_total = len(referenced) + len(set_aside) if referenced else 0
        reference_passed = len(referenced) - len(reference_failed)
        ids_by_rule = collections.defaultdict(list)
        for record in records:
            if "gold_rule" in record:
                ids_by_rule[record["gold_rule"]].append(record["id"])
        rule_counts = {rule: len(ids) for rule, ids in ids_by_rule.items()}  # before the lookups below add empty rules
        return {
            "dataset": name,
            "rows_read": len(records) + len(set_aside),
            "staged": len(records),
            "set_aside": set_aside,
            "bare_gold": {
                "scored": len(bare_scored),
                "passed": len(bare_scored) - len(bare_failed),
                "failed_ids": bare_failed,
            },
            "reference_solutions": {
                "scored": reference_total,
                "passed": reference_passed,
                "rate": reference_passed / reference_total if reference_total else None,
                "min_reference_pass": min_reference_pass,
                "failed_ids": reference_failed + [entry["id"] for entry in set_aside],
            },
            "gold_rules": rule_counts,
            "several_boxed": {
                "count": len(ids_by_rule["joined"]) + len(ids_by_rule["last of several"]),
                "joined": ids_by_rule["joined"],
                "last_of_several": ids_by_rule["last of several"],
            },
            "timeouts": self.verifier.timeouts,
        }


def failures(report: dict) -> list[str]:
    """Why a self-check report fails its dataset (empty: it passes)."""
    problems = []
    failed = report["bare_gold"]["failed_ids"]
    if failed:
        problems.append(f"{len(failed)} bare gold answers do not score 1 with their own reward: {_ids(failed)}")
    reference = report["reference_solutions"]
    if reference["rate"] is not None and reference["rate"] < reference["min_reference_pass"]:
        problems.append(
            f"{reference['passed']} of {reference['scored']} reference solutions score 1 "
            f"({reference['rate']:.4f} < min_reference_pass {reference['min_reference_pass']}); "
            f"failing: {_ids(reference['failed_ids'])}"
        )
    return problems


def _ids(ids: list[str]) -> str:
    shown = ", ".join(ids[:LISTED_IDS])
    return shown + (f" and {len(ids) - LISTED_IDS} more" if len(ids) > LISTED_IDS else "")


def summary(report: dict) -> str:
    """The report in a few lines, for the job's log."""
    bare, reference = report["bare_gold"], report["reference_solutions"]
    lines = [
        f"dataset {report['dataset']}: {report['rows_read']} rows read, {report['staged']} staged, "
        f"{len(report['set_aside'])} set aside",
        f"  bare gold answers scoring 1: {bare['passed']} of {bare['scored']}"
        if bare["scored"]
        else "  bare gold answers: none to score (a Countdown target is reached by an expression: see the references)",
    ]
    if reference["rate"] is not None:
        lines.append(
            f"  reference solutions scoring 1: {reference['passed']} of {reference['scored']} ({reference['rate']:.4f})"
        )
    if report["gold_rules"]:
        lines.append(
            "  gold rule: " + ", ".join(f"{rule} {count}" for rule, count in sorted(report["gold_rules"].items()))
        )
    for entry in report["set_aside"]:
        lines.append(f"  set aside {entry['id']}: {entry['reason']}")
    lines.append(f"  math-verify calls cut off at {STAGING_TIMEOUT_SECONDS} s: {report['timeouts']}")
    return "\n".join(lines)
