"""The real-answer fixture (tests/fixtures/real_answers: what SmolLM2-135M-Instruct wrote for the real MMLU subjects and
MATH-500, labelled by LABELLING.md) and the field's extractors it is compared with.

    KLSTUDY_REFDATA=../shared/refdata .venv/bin/python tests/real_answers.py

prints docs/data.md's tables: on each part of the fixture (`mmlu`, on which the letter rule was built; `heldout`,
`fresh` and `again`, each generated and labelled before the rule met it), how often each extractor reads the labelled
letter, reads another, or reads one where the label is none, and every completion where ours departs from the label;
then the MATH-500 part. The questions' options and gold answers come from the reference copies (KLSTUDY_REFDATA),
staged by the prepare_data rule's code with config/paper.yaml's entries; the fixture holds completions and ids only.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import datasets
import hub_layout
import yaml

from klstudy import config
from klstudy.data import choice_letter, prompts, rewards, staging

FIXTURE = Path(__file__).parent / "fixtures" / "real_answers"
MMLU_TASKS = ("mmlu_college_physics", "mmlu_college_chemistry", "mmlu_college_biology")
MATH_TASKS = ("math500",)


def completion_key(row: dict) -> tuple:
    """A label belongs to this text of this (task, question, repeat), and to no other."""
    return (row["task"], row["id"], row["repeat"], hashlib.sha256(row["completion"].encode()).hexdigest())


def labelled_completions() -> list[dict]:
    """Every completion of the fixture with its label (LABELLING.md): a letter, a math answer, or None."""
    labels = {tuple(row["key"]): row for row in staging.read_jsonl(FIXTURE / "labels.jsonl")}
    rows = staging.read_jsonl(FIXTURE / "completions.jsonl")
    missing = [completion_key(row)[:3] for row in rows if completion_key(row) not in labels]
    if missing:
        raise AssertionError(f"{len(missing)} completions have no label in labels.jsonl, e.g. {missing[:3]}")
    for row in rows:
        label = labels[completion_key(row)]
        row.update(label=label["label"], doubtful=label.get("doubtful", False))
    return rows


def staged_records(refdata: Path, tasks=MMLU_TASKS + MATH_TASKS) -> dict[str, dict[str, dict]]:
    """The fixture's tasks staged from the reference copies as prepare_data stages them: {task: {id: record}}."""
    paper = config.validate_config(yaml.safe_load((config.REPO_ROOT / "config" / "paper.yaml").read_text()))
    subjects = [paper["data"][task]["subject"] for task in tasks if paper["data"][task]["kind"] == "mmlu"]
    datasets.disable_progress_bars()
    with tempfile.TemporaryDirectory(prefix="klstudy-real-answers-") as work, contextlib.redirect_stdout(io.StringIO()):
        local_dirs = hub_layout.lay_out(refdata, Path(work) / "hub", subjects)
        staged = {}
        for task in tasks:
            settings = {**paper["data"][task], "local_dir": str(local_dirs[paper["data"][task]["hub_id"]])}
            records = staging.prepare(task, settings, Path(work) / f"{task}.jsonl")
            staged[task] = {record["id"]: record for record in records}
    return staged


# ------------------------------------------------------------------------------ the field's letter extractors
# Each takes completions and, for each, the question's four options, and returns a letter A-D or None for each: lm-eval
# applies a filter to a whole batch (its flexible filter builds a table of every Unicode punctuation mark per call).


def _each(read: Callable) -> Callable:
    """A batch extractor from one that reads one completion."""

    def read_each(completions: list[str], choices: list) -> list[str | None]:
        return [read(completion, options) for completion, options in zip(completions, choices, strict=True)]

    return read_each


def mmlu_pro(completion: str, choices) -> str | None:
    """MMLU-Pro's published extractor (TIGER-AI-Lab/MMLU-Pro, compute_accuracy.py): "answer is (X)", else the last
    "Answer: X", else the last standalone capital letter A-J anywhere."""
    for pattern, flags in ((r"answer is \(?([A-J])\)?", 0), (r".*[aA]nswer:\s*([A-J])", 0)):
        match = re.search(pattern, completion, flags)
        if match:
            return _letter(match.group(1))
    match = re.search(r"\b[A-J]\b(?!.*\b[A-J]\b)", completion, re.DOTALL)
    return _letter(match.group(0)) if match else None


def _letter(text: str | None) -> str | None:
    """What lm-eval's exact_match (ignore_case, ignore_punctuation) would compare with a target "X" or "(X)"."""
    if text is None:
        return None
    stripped = re.sub(r"[^\w\s]", "", text).strip().upper()
    return stripped if stripped in prompts.LETTERS else None


def _lm_eval_filters(task_dir: str, name: str) -> list[dict]:
    """A filter pipeline of lm-eval's own MMLU task files, as the installed lm-eval ships it."""
    import lm_eval

    path = Path(lm_eval.__file__).parent / "tasks" / "mmlu" / task_dir
    template = next(path.glob("_*template_yaml"))
    text = template.read_text().replace("!function", "")
    (pipeline,) = [entry for entry in yaml.safe_load(text)["filter_list"] if entry["name"] == name]
    return pipeline["filter"]


def lm_eval_extractor(task_dir: str, name: str) -> Callable:
    """The batch extractor of one of lm-eval's MMLU filter pipelines: its answers compared as exact_match would."""

    def read(completions: list[str], choices: list) -> list[str | None]:
        from lm_eval.api.registry import get_filter
        from lm_eval.filters import extraction, selection  # noqa: F401  (importing them registers their filters)

        responses, docs = [[completion] for completion in completions], [{"choices": list(c)} for c in choices]
        for step in _lm_eval_filters(task_dir, name):
            arguments = {key: value for key, value in step.items() if key != "function"}
            responses = get_filter(step["function"])(**arguments).apply(responses, docs)
        return [_letter(response if isinstance(response, str) else response[0]) for response in responses]

    return read


def klstudy_letter(completion: str, choices) -> str | None:
    return choice_letter.extract_letter(completion, choices)


OURS = "klstudy (choice_letter.extract_letter)"
LETTER_EXTRACTORS: dict[str, Callable] = {
    OURS: _each(klstudy_letter),
    # the first line, stripped, compared whole with the letter
    "lm-eval mmlu_generative (get_response)": lm_eval_extractor("generative", "get_response"),
    # what follows "The answer is" (or kin), compared whole
    "lm-eval mmlu_flan_cot_zeroshot (strict-match)": lm_eval_extractor("flan_cot_zeroshot", "strict-match"),
    # the last "(X)", else an option's text, else ": X"
    "lm-eval mmlu_flan_cot_zeroshot (flexible-extract)": lm_eval_extractor("flan_cot_zeroshot", "flexible-extract"),
    "MMLU-Pro (compute_accuracy.py)": _each(mmlu_pro),
}


def agreement(rows: list[dict], records: dict, extractor: Callable) -> dict:
    """On multiple-choice rows: how many committed completions read as their label, as another letter, as none;
    how many none completions read as some letter."""
    counts = dict.fromkeys(("committed", "read_as_label", "read_other", "unread", "none", "none_read"), 0)
    reads = extractor([row["completion"] for row in rows], [records[row["task"]][row["id"]]["choices"] for row in rows])
    for row, read in zip(rows, reads, strict=True):
        if row["label"] is None:
            counts["none"] += 1
            counts["none_read"] += read is not None
        else:
            counts["committed"] += 1
            key = "unread" if read is None else "read_as_label" if read == row["label"] else "read_other"
            counts[key] += 1
    return counts


def math_reading(rows: list[dict], records: dict) -> dict:
    """On MATH-500 rows: committed answers the reward reads as labelled (math-verify: the label scores 1); none
    completions the reward reads an answer from, and those it scores right against the question's gold."""
    counts = dict.fromkeys(("committed", "read_as_label", "none", "none_read", "none_scored"), 0)
    for row in rows:
        record = records[row["task"]][row["id"]]
        if row["label"] is None:
            verdict = rewards.judge(record, row["completion"])
            counts["none"] += 1
            counts["none_read"] += verdict.read
            counts["none_scored"] += verdict.reward == 1.0
        else:
            counts["committed"] += 1
            labelled = {**record, "answer": row["label"]}
            counts["read_as_label"] += rewards.judge(labelled, row["completion"]).reward == 1.0
    return counts


def main() -> None:
    refdata = hub_layout.refdata_dir()
    if refdata is None:
        raise SystemExit(f"{hub_layout.REFDATA_VARIABLE} is unset or names no directory")
    rows = labelled_completions()
    records = staged_records(refdata)
    for part in ("mmlu", "heldout", "fresh", "again", "seed2"):
        letters = [row for row in rows if row["task"] in MMLU_TASKS and row["part"] == part]
        print(f"\nPart {part}:\n")
        print("| extractor | committed read as labelled | read as another letter | unread | none read as a letter "
              "| agreeing with the label |\n|---|---|---|---|---|---|")  # fmt: skip
        for name, extractor in LETTER_EXTRACTORS.items():
            c = agreement(letters, records, extractor)
            agreeing = c["read_as_label"] + c["none"] - c["none_read"]
            print(f"| {name} | {c['read_as_label']} / {c['committed']} ({c['read_as_label'] / c['committed']:.1%}) "
                  f"| {c['read_other']} | {c['unread']} | {c['none_read']} / {c['none']} "
                  f"| {agreeing} / {len(letters)} ({agreeing / len(letters):.1%}) |")  # fmt: skip
        print("\nDepartures of ours from the labels:")
        for row in letters:
            read = klstudy_letter(row["completion"], records[row["task"]][row["id"]]["choices"])
            if read != row["label"]:
                fields = ("task", "id", "repeat", "label", "doubtful")
                departure = {**{field: row[field] for field in fields}, "read": read}
                print(json.dumps({**departure, "completion": row["completion"][-300:]}))
    maths = [row for row in rows if row["task"] in MATH_TASKS]
    print("\nMATH-500:", json.dumps(math_reading(maths, records)))


if __name__ == "__main__":
    sys.exit(main())
