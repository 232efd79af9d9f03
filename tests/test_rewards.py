"""Rewards: correctness on hand-written cases in the real formats, and a fuzz test on untrusted text."""

import random
import string
import threading
import time

import pytest

from klstudy.data import answer_text, choice_letter, rewards


@pytest.fixture(scope="module", autouse=True)
def math_worker():
    rewards.MATH_VERIFIER.warm_up()


MATH_CASES = [
    # (completion, gold, expected)
    ("ones: 3+5=8, tens: 2+4=6. The answer is \\boxed{68}.", "68", 1.0),
    ("The answer is \\boxed{69}.", "68", 0.0),
    ("\\boxed{\\frac{1}{2}}", "\\frac12", 1.0),
    ("\\boxed{\\dfrac{1}{2}}", "0.5", 1.0),
    ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
    ("\\boxed{\\frac{2}{3}}", "\\frac{1}{2}", 0.0),
    ("\\boxed{[0, 1)}", "[0,1)", 1.0),
    ("\\boxed{(0, 1]}", "[0,1)", 0.0),
    ("\\boxed{(-\\infty, 3]}", "(-\\infty,3]", 1.0),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", 1.0),
    ("\\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
    ("first \\boxed{3} then corrected: \\boxed{4}", "4", 1.0),
    ("first \\boxed{4} then corrected: \\boxed{3}", "4", 0.0),
    ("\\boxed{\\text{(C)}}", "\\text{(C)}", 1.0),
    ("no answer at all", "4", 0.0),
    ("", "4", 0.0),
]


@pytest.mark.parametrize("completion,gold,expected", MATH_CASES)
def test_math_reward(completion, gold, expected, monkeypatch):
    """math-verify's verdicts. The worker's time limit (0.5 s) is lifted here: on a loaded 2-core machine a symbolic
    check such as (x+1)^2 = x^2+2x+1 has taken longer and been scored 0. The limit has its own test below."""
    monkeypatch.setattr(rewards.MATH_VERIFIER, "timeout", 30.0)
    timeouts = rewards.MATH_VERIFIER.timeouts
    assert rewards.math_reward(completion, gold) == expected
    assert rewards.MATH_VERIFIER.timeouts == timeouts


def test_math_reward_works_outside_the_main_thread():
    results = []
    thread = threading.Thread(target=lambda: results.append(rewards.math_reward("\\boxed{\\frac{3}{6}}", "0.5")))
    thread.start()
    thread.join(10)
    assert results == [1.0]


def test_math_reward_times_out_on_c_level_work_in_a_thread():
    """9^(9^(9^9)) keeps sympy in C for ever: the worker is cut off at its timeout and the answer scores 0."""
    timeouts = rewards.MATH_VERIFIER.timeouts
    results = []
    thread = threading.Thread(target=lambda: results.append(rewards.math_reward("\\boxed{9^{9^{9^{9}}}}", "3")))
    thread.start()
    thread.join(60)  # only a guard against hanging the suite: without the timeout the call never returns
    assert results == [0.0] and rewards.MATH_VERIFIER.timeouts == timeouts + 1
    assert rewards.math_reward("\\boxed{7}", "7") == 1.0, "the worker is replaced after a kill"


# Forms real models answer in: each must read as its letter (the gold here).
LETTER_FORMS = [
    "The largest is 57. The answer is \\boxed{B}.",
    "\\boxed{(B)}",
    "\\boxed{\\text{B}}",
    "\\boxed{\\textbf{B}}",
    "\\boxed{\\mathrm{(B)}}",
    "$\\boxed{B}$",
    "\\fbox{B}",
    "\\boxed{B. 3 \\times 10^8 m/s}",
    "\\boxed{(B) 3e8 m/s}",
    "\\boxed{B) 3e8 m/s}",
    "\\boxed{B: 3e8 m/s}",
    "Answer: B",
    "Answer: (B)",
    "Answer:\n\nB",
    "**Answer:** B",
    "**Answer: B**",
    "**Final Answer:** B",
    "Final answer: B.",
    "The answer is (B).",
    "the answer is: B",
    "The answer is $\\text{B}$.",
    "The correct option is B.",
    "The correct answer choice is (B).",
    "the correct choice is B",
    "Let me think.\n\nB",
    "Let me think.\n\n**(B)**",
    "Let me think.\nB.",
    "I think A. But the answer is B",
    "Option A is out: the answer is B, since c is finite.",
    "\\boxed{A}\nWait, that is wrong. The answer is B.",
    "If the answer were A we would see 2. Answer: B",
    "1) (B)",  # a list's number before the letter's line
    "The answer is B) B",  # the letter marked, then repeated bare
    "the answer is B because it is fastest",  # a connective after the letter (SmolLM2: "The correct option is A by")
]

# Near misses: none may score, whichever letter is gold.
LETTER_NEAR_MISSES = [
    "\\boxed{B or C}",
    "\\boxed{A, C}",
    "\\boxed{AB}",
    "\\boxed{Bohr}",
    "\\boxed{b}",
    "\\boxed{E}",
    "\\boxed{42}",
    "The answer is B.\nChecking once more: \\boxed{42}",  # the last stated answer is no letter
    "\\boxed{B",  # left open
    "Answer: none of these",
    "Answer: A or B",
    "Answer: (A) and (B)",
    "The answer is A/B.",
    "Answer: A uniform field",  # the article, not a choice
    "Because of the field, Bohr's model holds.",
    "the answer is b",
    "Option A: 10 m/s is wrong.",
]


# The same forms with the question's options, and the forms real models write with them (tests/fixtures/real_answers):
# a letter followed by its option's text, an announcement followed by such a letter, a final statement after a stray
# letter, a letter endorsed in words, an option's text stated as the answer.
OPTIONS = ["10 m/s", "3e8 m/s", "tetrahedron", "zero population growth"]
LETTER_FORMS_WITH_OPTIONS = [
    *LETTER_FORMS,
    "B) 3e8 m/s",
    "B. 3e8 m/s",
    "B: 3e8 m/s",
    "(B) 3e8 m/s",
    "**B)** 3e8 m/s",
    "**B) 3e8 m/s**",
    "B) 3E8 M/S.",
    "The correct option is B) 3e8 m/s.",
    "The answer is: B) 3e8 m/s",
    "Answer: B) 3e8 m/s, since nothing is faster.",
    "A)\nWait, light is faster.\nAnswer: B) 3e8 m/s",
    "A) 10 m/s\n\nThe correct answer is B) 3e8 m/s.",
    "Thus the answer is given. B) 3e8 m/s.",
    "B is correct.",
    "Option B is correct.",
    "Answer B is the correct option.",
    "I think that B) 3e8 m/s is correct.",
    "Choose option B.",
    "The correct answer is (B) which is the speed of light.",
    'So, "3e8 m/s" is the correct answer.',
    "The answer is 3e8 m/s.",
]
LETTER_NEAR_MISSES_WITH_OPTIONS = [
    *LETTER_NEAR_MISSES,
    "B) 42 m/s",  # the option's text matches no option
    "The correct answer is B) 42 m/s.",
    "B) tetrahedron",  # another option's text: the completion contradicts itself
    "B) 3e8 m/s\nThe correct answer is C) 3e8 m/s.",  # the last statement contradicts itself
    "A) 10 m/s\nB) 3e8 m/s\nC) tetrahedron\nD) zero population growth",  # the options reprinted
    "A) 10 m/s\nWhy not?\nB) 3e8 m/s\nMaybe.\nC) tetrahedron\nOr this.",  # a walk through the options
    "The answer is A) 10 m/s or B) 3e8 m/s.",
    "The correct answer is B) 3e8 m/s, and the correct answer, C) tetrahedron, too.",
    "B) 3e8 m/s is too fast for a sound wave.",  # the option's text, then no endorsement
    "The answer is: B) 3e8 m/s. A) 10 m/s and C) tetrahedron",  # a list of the options after the announcement
    "Bohr's model says 3e8 m/s.",  # a letter inside a word
    "The answer is 42 m/s.",
]


@pytest.mark.parametrize("completion", LETTER_FORMS_WITH_OPTIONS)
def test_every_form_is_read_with_the_options(completion):
    assert choice_letter.extract_letter(completion, OPTIONS) == "B"
    assert rewards.judge({"reward": "multiple_choice", "answer": "B", "choices": OPTIONS}, completion) == (True, 1.0)


@pytest.mark.parametrize("completion", LETTER_NEAR_MISSES_WITH_OPTIONS)
def test_near_misses_name_no_letter_with_the_options(completion):
    assert choice_letter.extract_letter(completion, OPTIONS) is None
    for letter in "ABCD":
        assert rewards.judge({"reward": "multiple_choice", "answer": letter, "choices": OPTIONS}, completion) == (
            False,
            0.0,
        )


# Forms SmolLM2 writes that need more than an option's text at a clause's end (tests/fixtures/real_answers): an
# announcement ending its line, a rejected second letter, a number without its unit, a long option restated with typos
# or a word changed, an option's text that goes on (a short one only in its own letter's sentence, negating nothing), an
# option's text ending a sentence that states the answer, "the correct option of".
OPTIONS_WRITTEN = ["42.4 Hz", "66.7 Hz", "Remove ants and measure subsequent leaf damage", "an excimer laser"]
FORMS_WRITTEN = [
    ("the answer is\n      B) B) \n\n    A) However the equation is", "B"),
    ("A\n the answer is\nB) 66.7 Hz", "B"),
    ("The correct answer will be B) 66.7 Hz rather than A) 42.4 Hz.", "B"),
    ("Therefore the answer is B) 66.7 and not B) 42.4, which is B).", "B"),
    ("B) 66.7", "B"),
    ("C) Remove ant and measure subsequent leaf damage.", "C"),
    ("C) Remove ants and measure subsequent leaf damage in the field, which tests the mutualism.", "C"),
    ("C) Remov nts and measure subsequent leaf damage.", "C"),  # two typos
    ("So, the correct answer is C) Remove ants and measured subsequent leaf damage", "C"),
    ("B) 66.7 Hz (rounded) is the frequency we need.", "B"),  # a short option's text goes on
    ("We must address it using the correct option of B) 66.7 Hz.", "B"),
    ("The answer would be 100 - 33.3 = 66.7.", "B"),  # the number without its unit, ending the statement
    ("The correct option is B by considering the frequency.", "B"),  # a connective after the letter
    ("So we choose frequency B.", "B"),  # one word between "choose" and the letter
    ("The correct answer to the question about the two lasers is option B.", "B"),
    ("B, 66.7 hz is the frequency.", "B"),  # a comma marks a letter that opens a line
    ("A) 42.4 Hz is wrong. So this is B) 66.7 Hz. It follows.", "B"),  # "is" before a marked letter and its text
    ("B) 66.7 Hz = 2 x 33.35 Hz", "B"),  # a short option's text going on into an equation
    ("The answer is B) 66.7 Hz.\nA) 42.4 Hz\nC) 42.4 Hz", "B"),  # a slip in a reprint of the options: no contradiction
    ("A) 42.4 Hz\n\nThe best laser to examine visible light is an excimer laser.", "D"),
    ("The answer to this question falls into the category of an excimer laser.", "D"),
    ('Then: "The correct answer is B) 66.7 Hz" - which is the simplest explanation.', "B"),  # a dash ends a clause
    ("66.7 Hz", "B"),  # a line that holds only an option's text
    ("1) 66.7 Hz\n\nThe frequency comes out at 66.7 Hz.", "B"),
    # forms of issue #33's part `again`
    ("B\nThis is the correct answer B. The reason for it is:", "B"),  # a full stop after a bare letter, then a sentence
    ("B). 66.7 Hz", "B"),  # a full stop after the mark
    ('A) The answer to the question is "B."', "B"),  # an announced letter in quotes
    ("B) 66.7 Hz\n\nStep 1: f = v / 2L.\n\nStep 2: the options.\nA) 42.4 Hz\nB) 66.7 Hz\nC) 42.4 Hz\nD) 66.7 Hz", "B"),
    ("C) Remove ants and measure subsequent, as the study did.", "C"),  # most of a long option, a clause ends
    ("C) Remove ants and measure subsequent leaf because damage is what the study counts.", "C"),
]
NEAR_MISSES_WRITTEN = [
    "Answer choices:\nA) 42.4 Hz, or so I thought.\nWait.\nB) 42.4 Hz",  # "Answer choices:" reaches no line
    "A) 42",  # 42.4 Hz: a number that is not the option's
    "B) 42.4 Hz rather than A) 66.7 Hz.",  # another option's text after the mark
    "C) Remove ants and measure subsequent leaf damage is incorrect.",  # the long option, called wrong
    "C) Remove ant and measure subsequent leaf damage is what they did.",  # a typo, then more words
    "C) Plant trees and measure subsequent leaf damage.",  # a key phrase changed: another statement
    "C) Remove ants and measures subsequent leaf damage is false.",  # restated, but called wrong
    "B) 66.7 Hz cannot be right.",  # a short option's text, negated
    "B) 66.7 Hz (D)",  # a short option's text, then another letter: no sentence goes on
    "A) 66.7 Hz is the frequency.",  # another letter's short option
    'B) 66.7 Hz\nThe correct answer is "Option C: 66.7 Hz"',  # quoted, the last statement contradicts itself
    "The answer is A, which is not what the others say. So this is B) 42.4 Hz.",  # "is B)" with another's text
    "The best laser to examine visible light is not an excimer laser.",
    "Option D is an excimer laser.",  # a description of an option, not a choice
    "It is 42.4 Hz or an excimer laser.",  # two options
    "1) 66.7 Hz\nis one value, and\n2) 42.4 Hz\nis another.",  # lines of two options' texts: a walk through them
    "Hz 66.7",
    # near misses of issue #33's part `again`
    "B) 66.7 Hz\nC) Remove ants\n\nThe answer is B (C) because both fit.",  # two letters offered last
    "A) 42.4 Hz is far too low.\n\nB) 66.7 Hz does not fit.\n\nC) Remove ants and measure subsequent leaf damage.",
    "To choose, here is a list:\n\n1. A.\n\n2. C.\n\n3. B.",  # numbered lines of different letters
    "C) Remove ants and measure subsequent growth, as the study did.",  # words changed inside the clause
    "C) Remove ants and measure, as the study did.",  # too little of the option to name it
    "A. The first is far too low.\nB) 66.7 Hz",  # "A." with a sentence still marks a line of a list of the options
]
OPTIONS_NUMBERS = ["3", "5", "7", "1"]


def test_a_restatement_between_two_close_options_is_not_read():
    """A long option restated with a word changed is read only where no other option comes as close (SmolLM2's
    "A: Protons and neutrons possess orbital and spin angular momentum, ..." for chemistry question 18)."""
    options = [
        "Protons and neutrons have orbital and spin angular momentum.",
        "Protons have spin angular momentum.",
        "Protons and neutrons possess orbital angular momentum only.",
        "Neutrons have no angular momentum.",
    ]
    read = choice_letter.extract_letter
    assert read("A: Protons and neutrons have orbital and spin angular momentum.", options) == "A"
    assert read("A: Protons and neutrons possess orbital and spin angular momentum.", options) is None
    lone = [options[0], *options[1:2], "Electrons are fermions.", options[3]]  # with no rival, the restatement is read
    assert read("A: Protons and neutrons possess orbital and spin angular momentum.", lone) == "A"


def test_a_line_holding_only_a_bare_integer_is_no_answer():
    """Option lines are read for texts like "66.7 Hz" or "1/3", not for an integer alone (a step's number, a count)."""
    assert choice_letter.extract_letter("1", OPTIONS_NUMBERS) is None
    assert choice_letter.extract_letter("Let us list them:\n1. 7\nand think.", OPTIONS_NUMBERS) is None
    assert choice_letter.extract_letter("The answer is 7.", OPTIONS_NUMBERS) == "C"  # announced, it is read


@pytest.mark.parametrize(("completion", "letter"), FORMS_WRITTEN)
def test_forms_a_real_model_writes_are_read(completion, letter):
    assert choice_letter.extract_letter(completion, OPTIONS_WRITTEN) == letter


@pytest.mark.parametrize("completion", NEAR_MISSES_WRITTEN)
def test_near_misses_a_real_model_writes_name_no_letter(completion):
    assert choice_letter.extract_letter(completion, OPTIONS_WRITTEN) is None


def test_without_the_options_a_letter_with_text_is_not_read():
    """A caller without the options cannot tell "B) 3e8 m/s" from "B) tetrahedron": neither is read."""
    assert choice_letter.extract_letter("B) 3e8 m/s") is None and choice_letter.extract_letter("B) tetrahedron") is None


@pytest.mark.parametrize("completion", LETTER_FORMS)
def test_every_common_form_of_a_letter_is_read(completion):
    assert choice_letter.extract_letter(completion) == "B"
    assert choice_letter.multiple_choice_reward(completion, "B") == 1.0
    assert all(choice_letter.multiple_choice_reward(completion, other) == 0.0 for other in "ACD")


@pytest.mark.parametrize("completion", LETTER_NEAR_MISSES)
def test_near_misses_name_no_letter(completion):
    assert choice_letter.extract_letter(completion) is None
    assert all(choice_letter.multiple_choice_reward(completion, letter) == 0.0 for letter in "ABCD")


@pytest.mark.parametrize(
    "completion,gold,expected",
    [
        ("\\boxed{B}", "C", 0.0),
        ("The answer is (C).", "C", 1.0),
        ("the answer is: D", "D", 1.0),
        ("\\boxed{B}\n\nAnswer: C", "C", 1.0),  # the last one stated
        ("Answer: C\n\n\\boxed{B}", "C", 0.0),
    ],
)
def test_multiple_choice_reward(completion, gold, expected):
    assert choice_letter.multiple_choice_reward(completion, gold) == expected


@pytest.mark.parametrize(
    "text,contents",
    [
        ("So $x=\\boxed{\\frac{1}{2}}$.", ["\\frac{1}{2}"]),
        ("$\\boxed 2$.", ["2"]),  # MATH's own answer extraction reads the box without braces up to "$"
        ("so the answer is \\boxed 9\nand more", ["9"]),
        ("$\\boxed {17}.$ and $\\boxed{17}$", ["17", "17"]),
        ("\\fbox{3} then \\boxed{4}", ["3", "4"]),
        ("\\boxed{}", [""]),
        ("\\boxed{\\boxed{11}\\times\\boxed{20}}", ["\\boxed{11}\\times\\boxed{20}", "11", "20"]),
        ("\\boxed{3", [None]),
        ("no box at all", []),
        ("\\boxedx{3}", []),
    ],
)
def test_boxes_are_read_as_math_reads_them(text, contents):
    assert [content for _, content in answer_text.boxes(text)] == contents
    assert answer_text.last_boxed(text) == (contents[-1] if contents else None)


@pytest.mark.parametrize(
    "answer,numbers,target,expected",
    [
        ("2 + 6 + 1", [6, 2, 1], 9, 1.0),
        ("(6 - 2) * 1", [6, 2, 1], 4, 1.0),
        ("6 / (3 - 1)", [6, 3, 1], 3, 1.0),
        ("8 / 3 * 3", [8, 3, 3], 8, 1.0),  # exact rationals: 8/3*3 is 8, not 7.999...
        ("7 / 2 + 1", [7, 2, 1], 4, 0.0),  # 4.5
        ("6 + 2", [6, 2, 1], 8, 0.0),  # 1 unused: the question says use all numbers
        ("6 + 6 + 1", [6, 2, 1], 13, 0.0),  # 6 reused
        ("6 / (2 - 2)", [6, 2, 2], 0, 0.0),  # division by zero
        ("-6 + 2 + 1", [6, 2, 1], -3, 0.0),  # unary minus is not an operation of the game
        ("6 + 2 + 1 =  9", [6, 2, 1], 9, 0.0),
        ("__import__('os').system('true')", [6, 2, 1], 9, 0.0),
        ("6 ** 2 + 1", [6, 2, 1], 37, 0.0),
        ("((6)) + (2 + (1))", [6, 2, 1], 9, 1.0),
    ],
)
def test_countdown_reward(answer, numbers, target, expected):
    assert rewards.countdown_reward(f"Let me think. <answer>{answer}</answer>", numbers, target) == expected


def test_countdown_at_most_once_mode_and_extraction():
    assert rewards.countdown_reward("<answer>6 + 2</answer>", [6, 2, 1], 8, use_all=False) == 1.0
    assert rewards.countdown_reward("<answer>6 + 6</answer>", [6, 2, 1], 12, use_all=False) == 0.0
    assert rewards.countdown_reward("<answer>1+1</answer> then <answer>6+2+1</answer>", [6, 2, 1], 9) == 1.0
    assert rewards.countdown_reward("\\boxed{6+2+1}", [6, 2, 1], 9) == 1.0
    assert rewards.countdown_reward("6+2+1", [6, 2, 1], 9) == 0.0, "no answer tag, no box: no answer"


def test_score_dispatches_on_the_record():
    assert rewards.score({"reward": "math", "answer": "68"}, "\\boxed{68}") == 1.0
    assert rewards.score({"reward": "multiple_choice", "answer": "A"}, "\\boxed{A}") == 1.0
    assert rewards.score({"reward": "countdown", "numbers": [1, 2], "target": 3}, "<answer>1+2</answer>") == 1.0
    with pytest.raises(ValueError, match="unknown reward kind"):
        rewards.score({"reward": "code", "id": "x"}, "")


FUZZ_RECORDS = [
    {"reward": "math", "answer": "3"},
    {"reward": "multiple_choice", "answer": "B"},
    {"reward": "countdown", "numbers": [1, 2, 3], "target": 6},
]


def test_fuzz_smoke_300_adversarial_completions():
    """A quick slice of the fuzz test below, for every CI run."""
    for i, completion in enumerate(adversarial_completions(300, seed=1)):
        assert 0.0 <= rewards.score(FUZZ_RECORDS[i % 3], completion) <= 1.0


def adversarial_completions(count: int, seed: int = 0):
    """Untrusted text of every kind a policy can emit, including attacks on parsers."""
    rng = random.Random(seed)
    pieces = [
        lambda: "\\boxed{" + "9" * rng.randint(1, 5000) + "}",
        lambda: "\\boxed{" + "^".join(["9"] * rng.randint(2, 8)) + "}",
        lambda: "\\boxed{" + "{" * rng.randint(1, 3000) + "1" + "}" * rng.randint(0, 3000),
        lambda: "(" * rng.randint(1, 5000) + "1" + ")" * rng.randint(0, 5000),
        lambda: "<answer>" + "(" * rng.randint(1, 300) + "1+2" + ")" * rng.randint(1, 300) + "</answer>",
        lambda: "<answer>" + "9" * rng.randint(1, 400) + "</answer>",
        lambda: "<answer>" + "*".join(str(rng.randint(1, 99)) for _ in range(rng.randint(1, 80))) + "</answer>",
        lambda: "__import__('os').system('echo pwned')",
        lambda: "\\boxed{__import__('os').getcwd()}",
        lambda: "<answer>exec('import os')</answer>",
        lambda: "\\boxed{\\frac{1}{0}}",
        lambda: "\\boxed{10^{10^{10}}}",
        lambda: "\\boxed{x" * rng.randint(1, 50),
        lambda: "".join(rng.choice(string.printable) for _ in range(rng.randint(0, 3000))),
        lambda: "".join(chr(rng.randint(0x80, 0x2FFFF)) for _ in range(rng.randint(0, 500))),
        lambda: "\x00\ud800\uffff" * rng.randint(1, 100),
        lambda: "The answer is (" + rng.choice("ABCDEFGH") + ")" * rng.randint(1, 10),
        lambda: "\\boxed{" + rng.choice(["A", "B", "\\text{C}", "(D)", "E"]) + "}",
        lambda: "\\boxed{\\begin{pmatrix}" + "1&" * rng.randint(1, 500) + "1\\end{pmatrix}}",
        lambda: "\\boxed{" + "\\sqrt{" * rng.randint(1, 200) + "2" + "}" * rng.randint(1, 200) + "}",
        lambda: "a" * rng.randint(10_000, 200_000) + "\\boxed{3}",
        lambda: "\\boxed{" + rng.choice(["\\infty", "nan", "zoo", "I", "oo", "True", "lambda x: x"]) + "}",
    ]
    for _ in range(count):
        yield "".join(rng.choice(pieces)() for _ in range(rng.randint(1, 3)))


@pytest.mark.slow
def test_fuzz_every_reward_on_10000_adversarial_completions():
    records = FUZZ_RECORDS
    for i, completion in enumerate(adversarial_completions(10_000)):
        record = records[i % 3] if i % 10 else records[0]  # every reward, and the math one most often
        reward = rewards.score(record, completion)
        assert 0.0 <= reward <= 1.0, (record, completion[:200])


def test_the_math_worker_ends_when_its_process_is_killed():
    """A training job killed by SIGKILL (SLURM's time limit, the OOM killer) must not leave its worker behind."""
    import subprocess
    import sys

    code = (
        "import os, signal; from klstudy.data import rewards; assert rewards.math_reward('\\\\boxed{2}', '2') == 1.0; "
        "print(rewards.MATH_VERIFIER._process.pid, flush=True); os.kill(os.getpid(), signal.SIGKILL)"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    worker = int(run.stdout.split()[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(worker):
        time.sleep(0.1)
    assert not _alive(worker), f"math-verify worker {worker} outlived its killed parent"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False
