"""The answer rules against what a real model writes: SmolLM2-135M-Instruct's completions for the real MMLU subjects
and MATH-500 (tests/fixtures/real_answers), labelled by LABELLING.md before the rules were changed.

The fixture holds completions and ids only; the questions' options and gold answers come from the reference copies
(KLSTUDY_REFDATA), so the tests that need them skip, saying why, without. Three parts for letters, each generated and
labelled before the rule met it: `mmlu`, on which the letter rule was built; `heldout`, on which it first read 45 of 58
committed letters; `fresh` (every remaining question), on which the rule fitted to both first read 53 of 67; `again`
(`fresh`'s questions sampled again), on which the rule fitted to all three first read 50 of 58; `seed2` (the first 80
questions of each subject sampled with a third seed), on which the rule fitted to all four first read 87 of 113. The
forms of the first four parts' departures were then taken into the rule, so their floors are in-sample; `seed2` was
not fitted to, and its floors are what the rule reads on completions it had not seen (docs/data.md). A rule that reads
fewer labels, reads another letter more often, or reads a letter from a completion that clearly commits to none fails
here.
"""

from __future__ import annotations

import random
from collections import Counter

import hub_layout
import pytest
import real_answers

from klstudy.data import choice_letter, rewards

REFDATA = hub_layout.refdata_dir()
needs_refdata = pytest.mark.skipif(
    REFDATA is None,
    reason=f"{hub_layout.REFDATA_VARIABLE} is unset or names no directory: the fixture's options and gold answers "
    "come from copies of the paper's datasets (.ci/run sets it where ../shared/refdata exists)",
)


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return real_answers.labelled_completions()


@pytest.fixture(scope="module")
def records() -> dict:
    return real_answers.staged_records(REFDATA)


def test_the_fixture_is_whole_and_labelled(rows):
    """Every completion has a label written for its very text, and the labels are of the rule's kinds."""
    counts = Counter((row["part"], row["task"]) for row in rows)
    mmlu = {("mmlu", task): 80 for task in real_answers.MMLU_TASKS}
    heldout = {("heldout", task): 40 for task in real_answers.MMLU_TASKS}
    remaining = dict(zip(real_answers.MMLU_TASKS, (38, 33, 64), strict=True))  # every question after the 80th
    fresh = {("fresh", task): count for task, count in remaining.items()}
    again = {("again", task): count for task, count in remaining.items()}
    seed2 = {("seed2", task): 80 for task in real_answers.MMLU_TASKS}
    assert counts == {**mmlu, **heldout, **fresh, **again, **seed2, ("math", "math500"): 60}
    letters = [row["label"] for row in rows if row["task"] in real_answers.MMLU_TASKS]
    assert set(letters) <= {"A", "B", "C", "D", None}
    assert all(isinstance(row["label"], str | None) for row in rows)
    assert (real_answers.FIXTURE / "LABELLING.md").is_file()


def _letters(rows, part=None):
    return [row for row in rows if row["task"] in real_answers.MMLU_TASKS and part in (None, row["part"])]


# Per part: committed completions, the floor of those read as labelled, the most read as another letter; completions
# clearly labelled none, and those read as some letter (each listed in docs/data.md).
FLOORS = {
    "mmlu": {"committed": 107, "read_as_label": 107, "read_other": 0, "clear_none": 102, "clear_none_read": 0},
    "heldout": {"committed": 58, "read_as_label": 56, "read_other": 1, "clear_none": 50, "clear_none_read": 1},
    "fresh": {"committed": 67, "read_as_label": 62, "read_other": 0, "clear_none": 46, "clear_none_read": 0},
    # read once by the rule fitted to the three parts above (50 of 58, 2 other, 4 clear nones read), then fitted to
    "again": {"committed": 58, "read_as_label": 54, "read_other": 2, "clear_none": 57, "clear_none_read": 2},
    # held out: read once by the rule fitted to the four parts above (2bf4042), and never used to change it
    "seed2": {"committed": 113, "read_as_label": 87, "read_other": 2, "clear_none": 106, "clear_none_read": 13},
}


@needs_refdata
@pytest.mark.parametrize("part", FLOORS)
def test_the_letter_rule_reads_what_the_model_commits_to(rows, records, part):
    counts = real_answers.agreement(_letters(rows, part), records, real_answers.LETTER_EXTRACTORS[real_answers.OURS])
    floor = FLOORS[part]
    assert counts["committed"] == floor["committed"]
    assert counts["read_as_label"] >= floor["read_as_label"], counts
    assert counts["read_other"] <= floor["read_other"], counts


@needs_refdata
@pytest.mark.parametrize("part", FLOORS)
def test_no_letter_is_read_where_the_model_commits_to_none(rows, records, part):
    """Completions labelled none without doubt (no answer, two letters, a letter with another option's text, a reprint
    of the options) read as no letter, so they score 0 for every gold; the exceptions (one in `heldout`, two in `again`,
    13 in `seed2`) are listed in docs/data.md."""
    clear = [row for row in _letters(rows, part) if row["label"] is None and not row["doubtful"]]
    assert len(clear) == FLOORS[part]["clear_none"]
    read = {
        (row["id"], row["repeat"]): real_answers.klstudy_letter(
            row["completion"], records[row["task"]][row["id"]]["choices"]
        )
        for row in clear
    }
    assert len({key: letter for key, letter in read.items() if letter is not None}) <= FLOORS[part]["clear_none_read"]


@pytest.mark.deep  # the deep tier: `make test-deep` (docs/testing.md)
@needs_refdata
def test_the_rule_depends_on_the_options_it_is_given(rows, records):
    """With each question's options shuffled, a committed completion whose labelled option moved to another letter is
    read as labelled no more often than with no options at all (the letters that need no option's text: "Answer: C",
    a letter alone on a line); with the true options nearly all are: the agreement comes from the options' texts, not
    from reading some letter. (Measured on the five parts: 314 moved, 285 read with the true options, 82 with none, 73
    shuffled.)"""
    rng = random.Random(0)
    moved = []
    for row in _letters(rows):
        choices = list(records[row["task"]][row["id"]]["choices"])
        shuffled = list(choices)
        while shuffled == choices:
            rng.shuffle(shuffled)
        if row["label"] is not None and shuffled["ABCD".index(row["label"])] != choices["ABCD".index(row["label"])]:
            moved.append((row, choices, shuffled))
    assert len(moved) > 100

    def read_as_label(options_of) -> int:
        return sum(choice_letter.extract_letter(row["completion"], options_of(row, true, shuffled)) == row["label"]
                   for row, true, shuffled in moved)  # fmt: skip

    without_options = read_as_label(lambda row, true, shuffled: None)
    assert read_as_label(lambda row, true, shuffled: shuffled) <= without_options + 3
    assert read_as_label(lambda row, true, shuffled: true) >= without_options + 80


@pytest.mark.deep  # the deep tier: `make test-deep` (docs/testing.md)
@needs_refdata
@pytest.mark.parametrize("part", FLOORS)
def test_the_rule_beats_the_fields_extractors_on_the_same_labels(rows, records, part):
    """On both parts, ours agrees with more labels (a letter read as labelled, or none read from a none) than each of
    the field's extractors: MMLU-Pro's extractor and lm-eval's flexible filter read a letter from most completions
    that commit to none; lm-eval's strict filters read almost nothing from this model."""

    def agreeing(extractor) -> int:
        counts = real_answers.agreement(_letters(rows, part), records, extractor)
        return counts["read_as_label"] + counts["none"] - counts["none_read"]

    theirs = {name: agreeing(extractor) for name, extractor in real_answers.LETTER_EXTRACTORS.items()}
    ours = theirs.pop(real_answers.OURS)
    assert all(agreement < ours for agreement in theirs.values()), (ours, theirs)


@needs_refdata
def test_math_answers_are_read_as_the_protocol_reads_them(rows, records):
    """MATH-500: the math reward (math-verify, a box first, else the last expression anywhere) reads 6 of the 11
    stated final answers as labelled (docs/data.md says which forms it misses); "read" (a box, or an answer that
    math-verify's anchors announce) is false for most completions that state none, and the fallback's credit to
    completions that state no answer is counted."""
    counts = real_answers.math_reading([row for row in rows if row["task"] == "math500"], records)
    assert counts["committed"] == 11 and counts["none"] == 49
    assert counts["read_as_label"] >= 6, counts
    assert counts["none_read"] <= 9, counts  # 4 of the 42 clear ones, 5 of the 7 doubtful
    assert counts["none_scored"] <= 2, counts


def test_unread_is_what_the_rules_cannot_read():
    """judge's read flag, kind by kind."""
    assert rewards.judge({"reward": "math", "answer": "3"}, "so the final answer is 3.") == (True, 1.0)
    assert rewards.judge({"reward": "math", "answer": "3"}, "\\boxed{4}") == (True, 0.0)
    assert rewards.judge({"reward": "math", "answer": "3"}, "I am not sure.") == (False, 0.0)
    assert rewards.judge({"reward": "math", "answer": "3"}, "we add 1 and 2 to get 3").read is False
    mc = {"reward": "multiple_choice", "answer": "A", "choices": ["x", "y", "z", "w"]}
    assert rewards.judge(mc, "B) y") == (True, 0.0) and rewards.judge(mc, "B) x") == (False, 0.0)
    countdown = {"reward": "countdown", "numbers": [1, 2], "target": 3}
    assert rewards.judge(countdown, "<answer>1+2</answer>") == (True, 1.0)
    assert rewards.judge(countdown, "1+2") == (False, 0.0)
