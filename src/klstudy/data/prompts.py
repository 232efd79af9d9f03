"""Prompt formats, shared by both scales so that the embedded stand-ins look like the paper's data.

A dataset record holds the *user message* in ``prompt``; the chat template (the model's own) is applied
by the trainer and the evaluator, or left out for the paper's "Baseline (No-CT)".
"""

MATH = "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}."

MULTIPLE_CHOICE = (
    "Answer the following multiple choice question. Think step by step, then give the letter of the "
    "correct option within \\boxed{{}}.\n\n{question}\n\nA) {A}\nB) {B}\nC) {C}\nD) {D}"
)

COUNTDOWN = "{question}\nPut the final expression inside <answer></answer> tags."

LETTERS = ("A", "B", "C", "D")


def math_prompt(problem: str) -> str:
    return MATH.format(problem=problem.strip())


def multiple_choice_prompt(question: str, choices) -> str:
    if len(choices) != 4:
        raise ValueError(f"multiple choice needs 4 options, got {len(choices)}")
    return MULTIPLE_CHOICE.format(question=question.strip(), **dict(zip(LETTERS, choices, strict=True)))


def countdown_prompt(question: str) -> str:
    return COUNTDOWN.format(question=question.strip())


def chat_prompt(tokenizer, prompt: str) -> str:
    """A user message in the model's own chat template, ready for the assistant's answer."""
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
    )
