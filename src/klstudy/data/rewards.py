"""Verifiable rewards: 1.0 for a correct final answer, 0.0 otherwise, whatever the model wrote.

Model output is untrusted text. It is never passed to eval, exec, sympy.parse_expr or reasoning-gym's
score_answer (which runs sympy.parse_expr). Every reward looks only at a bounded tail of the
completion, never raises, and returns within a time limit:

- ``math``: math-verify (gold first, \\boxed{} extraction first). math-verify's own timeouts use
  signal.alarm, which works only in the main thread and cannot interrupt C code (a sympy power such as
  9^{9^{9^9}} computes in C). So the check runs in a persistent worker process, forked once, which is
  killed and forked again when a call exceeds its time limit. That holds in any thread.
- ``multiple_choice``: the letter of the last place where the completion states a choice (choice_letter.py's
  ``extract_letter`` says which places count: boxes, "Answer: X" and its kin, a line that is only a letter).
- ``countdown``: our own arithmetic parser over exact fractions (digits, + - * / and parentheses only),
  each given number used exactly once, as the reasoning-gym question asks ("using all of these numbers").
  Unlike reasoning-gym's scorer, there is no partial credit (0.01 / 0.05) for well-formed wrong answers.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import threading
from collections import Counter
from fractions import Fraction
from typing import NamedTuple

from klstudy.data.answer_text import last_boxed, tail
from klstudy.data.choice_letter import extract_letter

MATH_TIMEOUT_SECONDS = 0.5


# ---------------------------------------------------------------------------------------------- math


def _math_verify_once(gold: str, completion: str) -> tuple[bool, bool]:
    """(whether the completion states an answer, math-verify's verdict), gold first, \\boxed{} first; its own (signal)
    timeouts off.

    The verdict: a box first (the paper's §2), else the last expression math-verify finds anywhere, which it
    finds in almost any text. So "states an answer" asks less of luck: a box, or an expression that math-verify's
    anchors announce ("the final answer is", "answer:"), as tests/fixtures/real_answers measures."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    def read(anywhere: bool):
        latex = LatexExtractionConfig(boxed_match_priority=0, try_extract_without_anchor=anywhere)
        return parse(
            completion, [latex, ExprExtractionConfig(try_extract_without_anchor=anywhere)], parsing_timeout=None
        )

    gold_parsed = parse(
        f"\\boxed{{{gold}}}", extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()], parsing_timeout=None
    )
    answer = read(anywhere=True)
    correct = bool(gold_parsed and answer and verify(gold_parsed, answer, timeout_seconds=None))
    return bool(answer and read(anywhere=False)), correct


def _prime_math_verify() -> None:
    """Import math-verify and build its parsers (about 1 s) in this process, on our own input."""
    import logging

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns that we handle timeouts: we do
    _math_verify_once("\\frac{1}{2}", "\\boxed{0.5}")


def _math_worker(connection, parent_end) -> None:
    """Child process: answer (gold, completion) requests with (read, verdict) until the parent is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The fork copied the parent's end of the pipe: close it, so that recv() sees end-of-file, and this worker
    # exits, when the parent dies (even by SIGKILL, e.g. at a SLURM time limit) instead of lingering.
    parent_end.close()
    while True:
        try:
            gold, completion = connection.recv()
        except EOFError:
            return
        try:
            judged = _math_verify_once(gold, completion)
        except BaseException:  # noqa: BLE001 — any failure on untrusted text is a wrong answer, and none read
            judged = (False, False)
        connection.send(judged)


class IsolatedMathVerifier:
    """math-verify in a killable worker process; one request at a time (thread-safe)."""

    def __init__(self, timeout: float = MATH_TIMEOUT_SECONDS):
        self.timeout = timeout
        self.timeouts = 0  # calls cut off at the timeout (each one killed the worker and scored 0)
        self._lock = threading.Lock()
        self._process = None
        self._connection = None
        self._owner = None

    def _start(self) -> None:
        # fork: the child inherits the parent's primed math-verify, so a restart after a kill takes
        # milliseconds instead of the second an import would.
        _prime_math_verify()
        context = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
        parent, child = context.Pipe()
        self._process = context.Process(
            target=_math_worker, args=(child, parent), daemon=True, name="klstudy-math-verify"
        )
        self._process.start()
        child.close()
        self._connection, self._owner = parent, os.getpid()

    def _stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.join()
            self._connection.close()
        self._process = self._connection = None

    def __call__(self, gold: str, completion: str) -> tuple[bool, bool]:
        """(whether an answer was read, whether it equals ``gold``); (False, False) for a call cut off."""
        with self._lock:
            if self._process is None or self._owner != os.getpid() or not self._process.is_alive():
                self._start()
            try:
                self._connection.send((gold, completion))
                if self._connection.poll(self.timeout):
                    read, correct = self._connection.recv()
                    return bool(read), bool(correct)
                self.timeouts += 1
            except (EOFError, OSError, BrokenPipeError):
                pass
            self._stop()  # too slow or dead: kill it; the next call forks a fresh one
            return False, False

    def warm_up(self) -> None:
        """Start the worker now, outside any timed call."""
        with self._lock:
            if self._process is None:
                self._start()


MATH_VERIFIER = IsolatedMathVerifier()


def math_reward(completion: str, gold: str, verifier: IsolatedMathVerifier = MATH_VERIFIER) -> float:
    """1.0 if the completion's final answer equals ``gold`` by math-verify, else 0.0.

    ``verifier``: the worker and its time limit (staging's self-check allows more time than a training step).
    """
    return float(verifier(str(gold), tail(completion))[1])


# ------------------------------------------------------------------------------------------ countdown

MAX_EXPRESSION_CHARS = 200
MAX_NUMBER_DIGITS = 6
MAX_DEPTH = 20
_TOKEN = re.compile(r"\s*(?:(\d+)|([-+*/()]))")
_ANSWER_TAG = re.compile(r"<answer>(.{0,400}?)</answer>", re.S)


class InvalidExpression(ValueError):
    pass


def evaluate_arithmetic(expression: str) -> tuple[Fraction, list[int]]:
    """Value (exact) and the numbers used, of an expression of integers, + - * / and parentheses.

    A recursive-descent parser over a bounded string; anything else is InvalidExpression.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise InvalidExpression("too long")
    tokens, position = [], 0
    expression = expression.strip()
    while position < len(expression):
        match = _TOKEN.match(expression, position)
        if not match:
            raise InvalidExpression(f"unexpected character at {position}")
        number, operator = match.groups()
        if number is not None and len(number) > MAX_NUMBER_DIGITS:
            raise InvalidExpression("number too long")
        tokens.append(int(number) if number is not None else operator)
        position = match.end()
    numbers: list[int] = []
    index = 0

    def peek():
        return tokens[index] if index < len(tokens) else None

    def take():
        nonlocal index
        index += 1
        return tokens[index - 1]

    def expr(depth):
        if depth > MAX_DEPTH:
            raise InvalidExpression("nested too deeply")
        value = term(depth)
        while peek() in ("+", "-"):
            value = value + term(depth) if take() == "+" else value - term(depth)
        return value

    def term(depth):
        value = factor(depth)
        while peek() in ("*", "/"):
            operator, right = take(), factor(depth)
            if operator == "*":
                value = value * right
            elif right == 0:
                raise InvalidExpression("division by zero")
            else:
                value = value / right
        return value

    def factor(depth):
        token = take() if peek() is not None else None
        if isinstance(token, int):
            numbers.append(token)
            return Fraction(token)
        if token == "(":
            value = expr(depth + 1)
            if take() if peek() == ")" else None:
                return value
        raise InvalidExpression("malformed")

    value = expr(0)
    if index != len(tokens):
        raise InvalidExpression("trailing tokens")
    return value, numbers


def extract_countdown_answer(completion: str) -> str | None:
    text = tail(completion)
    tagged = _ANSWER_TAG.findall(text)
    if tagged:
        return tagged[-1]
    return last_boxed(text)


def countdown_reward(completion: str, numbers, target, use_all: bool = True) -> float:
    """1.0 if the final expression evaluates exactly to ``target`` using the given numbers.

    ``use_all``: every number exactly once (the reasoning-gym question); otherwise each at most once.
    """
    answer = extract_countdown_answer(completion)
    if answer is None:
        return 0.0
    try:
        value, used = evaluate_arithmetic(answer)
    except InvalidExpression:
        return 0.0
    given, used = Counter(int(n) for n in numbers), Counter(used)
    allowed = used == given if use_all else not (used - given)
    return float(allowed and value == Fraction(int(target)))


# ----------------------------------------------------------------------------------------- dispatch

# The record fields a reward reads (every job that scores keeps these of each record, and only these).
SCORING_FIELDS = ("answer", "reward", "numbers", "target", "choices")


class Verdict(NamedTuple):
    read: bool  # an answer could be read from the completion (right or wrong)
    reward: float


def judge(record: dict, completion: str, verifier: IsolatedMathVerifier = MATH_VERIFIER) -> Verdict:
    """Whether the completion states an answer the record's reward can read, and its reward (the ``reward`` field
    names the kind). "Not read" tells a completion that never answered from one that answered wrong."""
    kind = record["reward"]
    if kind == "math":
        read, correct = verifier(str(record["answer"]), tail(completion))
        return Verdict(read, float(correct))
    if kind == "multiple_choice":
        letter = extract_letter(completion, record.get("choices"))
        return Verdict(letter is not None, float(letter == record["answer"].strip().upper()))
    if kind == "countdown":
        return Verdict(extract_countdown_answer(completion) is not None,
                       countdown_reward(completion, record["numbers"], record["target"]))  # fmt: skip
    raise ValueError(f"record {record.get('id')!r} has unknown reward kind {kind!r}")


def score(record: dict, completion: str, verifier: IsolatedMathVerifier = MATH_VERIFIER) -> float:
    """The reward of ``completion`` for a dataset record (``judge``'s reward)."""
    return judge(record, completion, verifier).reward
