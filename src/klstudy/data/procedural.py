"""Procedural stand-ins for the paper's datasets: same record schema and prompt formats, same roles.

| role (paper)                      | embedded stand-in                                               |
|-----------------------------------|-----------------------------------------------------------------|
| MATH train, MATH test, MATH500    | ``arithmetic`` add1w, sub1w: one-digit + and −, four phrasings   |
| MATH² (harder, in-domain)         | ``arithmetic`` level sum3: three-term sums                       |
| MMLU college physics              | ``mc_compare``: which of four numbers is largest (A–D)          |
| MMLU college chemistry            | ``mc_length``: how many letters a word has (A–D)                |
| MMLU college biology              | ``mc_next``: which letter follows a given one (A–D)             |
| Countdown                         | reasoning-gym ``countdown`` with 3 numbers in 1..9              |

Every problem has a *region* (warmup, train or heldout; ``REGIONS``) fixed by a hash of its text, so the
warm start, RL training and evaluation never share a problem whatever their sizes and seeds, as MATH train
and test do not. Longer column-wise levels (add2, sub2, add3, mul1) exist for larger embedded models; add1m and sub1m
ask the one-digit facts in 320 phrasings, so that a fact cannot be tied to one sentence (docs/claims.md, pilots).
Every record carries ``solution``: a worked solution in the format the base model is warm-started on.
"""

from __future__ import annotations

import random
import string
import zlib

from klstudy.data import prompts

ARITHMETIC_LEVELS = {
    "add1": "one-digit addition",
    "sub1": "one-digit subtraction with a non-negative result",
    "mul1": "one-digit multiplication",
    "add1w": "one-digit addition, asked in one of several phrasings",
    "sub1w": "one-digit subtraction, asked in one of several phrasings",
    "add1m": "one-digit addition, asked in one of 320 phrasings (a prefix, a question, a suffix)",
    "sub1m": "one-digit subtraction, asked in one of 320 phrasings (a prefix, a question, a suffix)",
    "sum3": "three-term sums of one-digit numbers",
    "add2": "two-digit addition, column by column",
    "sub2": "two-digit subtraction, column by column",
    "add3": "three-digit addition, column by column",
}
# Each problem space is cut by a hash of the problem text into three disjoint regions (percent ranges):
# evaluation sets draw from "heldout", the base model's warm start from "warmup", RL training from
# "train". So RL trains on problems the base model never saw, as the paper's RL trains a pretrained model
# on MATH train, and no evaluation problem was seen by either stage.
REGIONS = {"heldout": range(0, 30), "warmup": range(30, 60), "train": range(60, 100)}


def region(text: str) -> str:
    bucket = zlib.crc32(text.encode()) % 100
    return next(name for name, percent in REGIONS.items() if bucket in percent)


def _digits(n: int, width: int) -> list[int]:
    return [int(c) for c in str(n).zfill(width)][::-1]  # ones first


def _column_addition(a: int, b: int) -> str:
    width = max(len(str(a)), len(str(b)))
    steps, carry = [], 0
    for place, (x, y) in enumerate(zip(_digits(a, width), _digits(b, width), strict=True)):
        total = x + y + carry
        terms = f"{x}+{y}" + (f"+{carry}" if carry else "")
        steps.append(f"{_PLACES[place]}: {terms}={total}")
        carry = total // 10
    return ", ".join(steps)


def _column_subtraction(a: int, b: int) -> str:
    width = len(str(a))
    steps, borrow = [], 0
    for place, (x, y) in enumerate(zip(_digits(a, width), _digits(b, width), strict=True)):
        x -= borrow
        borrow = int(x < y)
        top = x + 10 * borrow
        steps.append(f"{_PLACES[place]}: {top}-{y}={top - y}" + (" borrow 1" if borrow else ""))
    return ", ".join(steps)


_PLACES = ("ones", "tens", "hundreds", "thousands")
_PHRASINGS = ("What is {a} {op} {b}?", "Compute {a} {op} {b}.", "Find the {name}: {a} {op} {b}.", "{a} {op} {b} = ?")
# add1m, sub1m: so many phrasings of each fact that a problem's sentence says nothing of its answer beyond the two
# numbers, and a model cannot tie a fact to the sentence it read it in (with add1w's four, RL learned its training
# questions and nothing of the same facts asked otherwise: docs/record/).
_MANY_PHRASINGS = tuple(
    prefix + body + suffix
    for prefix in ("", "Question: ", "Quick one. ", "Please help: ", "Try this: ")
    for body in (*_PHRASINGS, "What do you get from {a} {op} {b}?", "Calculate {a}{op}{b}.", "Evaluate {a} {op} {b}.",
                 "Work out {a} {op} {b}.", "{a}{op}{b}=?", "What does {a} {op} {b} make?", "Give {a} {op} {b}.",
                 "Tell me {a} {op} {b}.", "How much is {a} {op} {b}?", "Solve {a} {op} {b}.", "{a} {op} {b} is what?",
                 "The {name} {a} {op} {b} is?")
    for suffix in ("", " Thanks.", " Be careful.", " Take your time.")
)  # fmt: skip


def _arithmetic_problem(level: str, rng: random.Random) -> tuple[str, str, int]:
    """(question, worked reasoning, answer) for one problem of the level."""
    if level in ("add1w", "sub1w", "add1m", "sub1m"):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        if level.startswith("sub") and a < b:
            a, b = b, a
        op, value, name = ("+", a + b, "sum") if level.startswith("add") else ("-", a - b, "difference")
        phrasings = _MANY_PHRASINGS if level.endswith("m") else _PHRASINGS
        question = rng.choice(phrasings).format(a=a, b=b, op=op, name=name)
        return question, f"{a}{op}{b}={value}.", value
    if level in ("add1", "sub1", "mul1"):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        if level == "sub1" and a < b:
            a, b = b, a
        op, value = {"add1": ("+", a + b), "sub1": ("-", a - b), "mul1": ("*", a * b)}[level]
        return f"What is {a} {op} {b}?", f"{a}{op}{b}={value}.", value
    if level == "add2":
        a, b = rng.randint(10, 99), rng.randint(1, 99)
        return f"What is {a} + {b}?", _column_addition(a, b) + ".", a + b
    if level == "sub2":
        a = rng.randint(10, 99)
        b = rng.randint(1, a)
        return f"What is {a} - {b}?", _column_subtraction(a, b) + ".", a - b
    if level == "sum3":
        a, b, c = rng.randint(0, 9), rng.randint(0, 9), rng.randint(0, 9)
        return f"What is {a} + {b} + {c}?", f"{a}+{b}={a + b}, {a + b}+{c}={a + b + c}.", a + b + c
    if level == "add3":
        a, b = rng.randint(100, 999), rng.randint(10, 999)
        return f"What is {a} + {b}?", _column_addition(a, b) + ".", a + b
    raise ValueError(f"unknown arithmetic level {level!r}; known: {', '.join(ARITHMETIC_LEVELS)}")


def _choices(correct, distractors, rng):
    options = [correct, *distractors]
    rng.shuffle(options)
    return options, prompts.LETTERS[options.index(correct)]


def _mc_compare(rng):
    numbers = rng.sample(range(10, 100), 4)
    largest = max(numbers)
    options, letter = _choices(largest, [n for n in numbers if n != largest], rng)
    return "Which number is the largest?", options, letter, f"The largest is {largest}."


def _mc_length(rng):
    word = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 8)))
    wrong = rng.sample([n for n in range(1, 10) if n != len(word)], 3)
    options, letter = _choices(len(word), wrong, rng)
    spelled = " ".join(word)
    return f"How many letters are in the word '{word}'?", options, letter, f"{spelled}: {len(word)} letters."


def _mc_next(rng):
    i = rng.randrange(25)
    before, after = string.ascii_lowercase[i], string.ascii_lowercase[i + 1]
    wrong = rng.sample([c for c in string.ascii_lowercase if c != after], 3)
    options, letter = _choices(after, wrong, rng)
    return (
        f"Which letter comes right after '{before}' in the alphabet?",
        options,
        letter,
        f"After {before} comes {after}.",
    )


MULTIPLE_CHOICE = {"mc_compare": _mc_compare, "mc_length": _mc_length, "mc_next": _mc_next}


def _draw_unique(make, size, want_region, rng, limit_factor=200):
    """Draw ``size`` distinct problems from ``want_region`` (by the key ``make`` returns first)."""
    seen, records = set(), []
    for _ in range(size * limit_factor):
        key, record = make(rng)
        if key in seen or region(key) != want_region:
            continue
        seen.add(key)
        records.append(record)
        if len(records) == size:
            return records
    raise ValueError(f"only {len(records)} distinct {want_region} problems found; ask for fewer than {size}")


def arithmetic(name: str, size: int, seed: int, levels, split: str) -> list[dict]:
    """Math-role records: {id, prompt, answer, reward='math', solution, level, ...}."""
    rng = random.Random(f"{name}:{seed}")

    def make(rng):
        level = rng.choice(list(levels))
        question, reasoning, value = _arithmetic_problem(level, rng)
        record = dict(
            prompt=prompts.math_prompt(question),
            answer=str(value),
            reward="math",
            solution=f"{reasoning} The answer is \\boxed{{{value}}}.",
            level=level,
            problem=question,
        )
        return question, record

    return _number(name, _draw_unique(make, size, split, rng))


def multiple_choice(name: str, kind: str, size: int, seed: int, split: str) -> list[dict]:
    """MMLU-role records with letter answers."""
    rng = random.Random(f"{name}:{seed}")
    generate = MULTIPLE_CHOICE[kind]

    def make(rng):
        question, options, letter, reasoning = generate(rng)
        record = dict(
            prompt=prompts.multiple_choice_prompt(question, [str(o) for o in options]),
            answer=letter,
            reward="multiple_choice",
            solution=f"{reasoning} The answer is \\boxed{{{letter}}}.",
            subject=kind,
            choices=[str(o) for o in options],
        )
        return question + "|" + ",".join(map(str, options)), record

    return _number(name, _draw_unique(make, size, split, rng))


def _number(name, records):
    return [{"id": f"{name}-{i:05d}", **record} for i, record in enumerate(records)]
