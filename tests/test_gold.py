"""The gold rule (gold.py): which box of a reference solution is the answer, one case per step of the rule, each
seen in real MATH solutions (the ids in the comments are MATH's own file names)."""

import pytest

from klstudy.data import gold


@pytest.fixture(scope="module")
def check():
    return gold.SelfCheck()


@pytest.mark.parametrize(
    "problem,solution,answer,rule",
    [
        ("Find x.", "So $x = \\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}", "one box"),
        ("Find x.", "So $x = \\boxed 2$.", "2", "one box"),  # train/algebra/24014
        ("Find d.", "$d = \\boxed {17}.$ Hence $\\boxed{17}$.", "17", "equal boxes"),  # train/algebra/1397
        ("Find p.", "$p = \\boxed{\\dfrac{1}{6}}$, i.e. $\\boxed{\\frac16}$.", "\\frac16", "equal boxes"),
        # an empty box is no answer: train/number_theory/7115 has nothing else, and is set aside
        ("How many primes?", "Therefore there are $\\boxed{}$ primes in that range.", None, "no answer"),
        ("How many?", "First $\\boxed{}$, then $\\boxed{4}$.", "4", "one box"),
        # a blank in the problem's own equation (test/prealgebra/1407), and a \phantom that aligns a matrix entry
        ("Fill in.", "$4x + \\boxed{\\phantom{2}}$ ... so $\\boxed{4}$.", "4", "one box"),
        (
            "M?",
            "$\\boxed{\\begin{pmatrix} 1 & \\phantom -1 \\end{pmatrix}}$",
            "\\begin{pmatrix} 1 & \\phantom -1 \\end{pmatrix}",
            "one box",
        ),
        # "also accepted": the main answer is gold (test/algebra/1730, test/intermediate_algebra/747)
        (
            "Common difference?",
            "$d=\\boxed{-3}$.\n\nNote: $\\boxed{3}$ is also accepted as an answer.",
            "-3",
            "one box",
        ),
        (
            "Which point?",
            "the point $\\boxed{(3,-5)}.$  Thus, $\\boxed{(0,0)}$ is also an acceptable answer.",
            "(3,-5)",
            "one box",
        ),
        # the problem asks for several answers: all of them (train/intermediate_algebra/1964, precalculus/1269)
        ("Enter all possible values, separated by commas.", "$k = \\boxed{1}$ or $k = \\boxed{9}$.", "1, 9", "joined"),
        (
            "Find all possible values of $\\theta$.",
            "$\\boxed{30^\\circ}$, $\\boxed{150^\\circ}$",
            "30^\\circ, 150^\\circ",
            "joined",
        ),
        (
            "Enter all the solutions, separated by commas.",
            "$\\boxed{2}$ and again $\\boxed{2.0}$",
            "2.0",
            "equal boxes",
        ),
        # several different answers to a one-answer problem: the last, listed (train/algebra/535: a step, then it)
        ("Evaluate $\\log_2 (4^2)$.", "$4^2 = 2^{\\boxed{4}}$ ... $= \\boxed{4}$", "4", "equal boxes"),
        ("Evaluate.", "First $\\boxed{2}$ then $\\boxed{4}$.", "4", "last of several"),
    ],
)
def test_the_gold_rule(check, problem, solution, answer, rule):
    read = gold.math_gold(problem, solution, check.equal)
    assert (read.answer, read.rule) == (answer, rule)


def test_a_joined_gold_is_what_the_reward_reads_from_a_completion_in_either_form(check):
    """math-verify reads "1, 9" as a set: a completion that lists the answers in one box or in several, in any
    order, scores 1; one answer alone does not."""
    record = {"reward": "math", "answer": "1, 9"}
    assert check.score(record, "\\boxed{9, 1}") == 1.0
    assert check.score(record, "so $k = \\boxed{1}, \\boxed{9}$") == 1.0
    assert check.score(record, "\\boxed{9}") == 0.0


def test_bare_completions(check):
    assert gold.bare_completion({"reward": "math", "answer": "\\frac12"}) == "\\boxed{\\frac12}"
    assert gold.bare_completion({"reward": "multiple_choice", "answer": "C"}) == "\\boxed{C}"
    assert gold.bare_completion({"reward": "countdown", "answer": "24", "numbers": [1], "target": 24}) is None


def test_failures_name_the_records():
    report = {
        "bare_gold": {"failed_ids": [f"x-{i}" for i in range(25)]},
        "reference_solutions": {"rate": 0.5, "min_reference_pass": 0.99, "passed": 1, "scored": 2, "failed_ids": ["y"]},
    }
    first, second = gold.failures(report)
    assert first.startswith("25 bare gold answers") and "x-19" in first and "x-20" not in first and "5 more" in first
    assert "1 of 2 reference solutions score 1 (0.5000 < min_reference_pass 0.99); failing: y" == second
    report["bare_gold"]["failed_ids"], report["reference_solutions"]["rate"] = [], 0.99
    assert gold.failures(report) == []
