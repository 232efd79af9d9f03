"""The reference copies of the paper's datasets (KLSTUDY_REFDATA; shared/refdata/SOURCES.md says what each is) laid
out as `hf download --repo-type dataset` gives the Hub's repositories: what a user points `local_dir`
at. Test infrastructure only: the copies are never committed to the project."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import datasets

REFDATA_VARIABLE = "KLSTUDY_REFDATA"
MMLU_SPLITS = {"test": "test", "validation": "val", "dev": "dev"}  # the Hub's split name: the folder in the copies
MMLU_FEATURES = datasets.Features(
    question=datasets.Value("string"),
    subject=datasets.Value("string"),
    choices=datasets.Sequence(datasets.Value("string")),
    answer=datasets.ClassLabel(names=["A", "B", "C", "D"]),
)
MATH_FEATURES = datasets.Features(
    {column: datasets.Value("string") for column in ("problem", "level", "type", "solution")}
)


def refdata_dir() -> Path | None:
    """The reference copies, or None when the variable is unset or names no directory."""
    value = os.environ.get(REFDATA_VARIABLE)
    return Path(value) if value and Path(value).is_dir() else None


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def write_configs_readme(root: Path, configs: dict[str, list[str]]) -> None:
    """README.md whose `configs:` name each config's files (`<config>/<split>-*`), as the Hub's dataset cards do."""
    lines = ["---", "configs:"]
    for config, splits in configs.items():
        lines += [f"- config_name: {config}", "  data_files:"]
        lines += [f"  - split: {split}\n    path: {config}/{split}-*" for split in splits]
    (root / "README.md").write_text("\n".join([*lines, "---", ""]), encoding="utf-8")


def hendrycks_math(refdata: Path, root: Path) -> Path:
    """EleutherAI/hendrycks_math: <subject>/{train,test}-00000-of-00001.parquet, one config per subject."""
    by_subject: dict[str, dict[str, list[dict]]] = {}
    for split in ("train", "test"):
        for row in read_jsonl(refdata / "math" / f"{split}.jsonl"):
            subject = row["unique_id"].split("/")[1]
            by_subject.setdefault(subject, {}).setdefault(split, []).append(
                {column: row[column] for column in MATH_FEATURES}
            )
    for subject, splits in by_subject.items():
        for split, rows in splits.items():
            (root / subject).mkdir(parents=True, exist_ok=True)
            datasets.Dataset.from_list(rows, features=MATH_FEATURES).to_parquet(
                root / subject / f"{split}-00000-of-00001.parquet"
            )
    write_configs_readme(root, {subject: list(splits) for subject, splits in by_subject.items()})
    return root


def math500(refdata: Path, root: Path) -> Path:
    """HuggingFaceH4/MATH-500: test.jsonl at the root."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "test.jsonl").write_bytes((refdata / "math500" / "test.jsonl").read_bytes())
    return root


def mmlu(refdata: Path, root: Path, subjects: list[str]) -> Path:
    """cais/mmlu: <subject>/{test,validation,dev}-00000-of-00001.parquet, one config per subject."""
    for subject in subjects:
        (root / subject).mkdir(parents=True, exist_ok=True)
        for split, folder in MMLU_SPLITS.items():
            with open(refdata / "mmlu" / folder / f"{subject}_{folder}.csv", newline="", encoding="utf-8") as handle:
                rows = [
                    {"question": q, "subject": subject, "choices": [a, b, c, d], "answer": "ABCD".index(letter)}
                    for q, a, b, c, d, letter in csv.reader(handle)
                ]
            datasets.Dataset.from_list(rows, features=MMLU_FEATURES).to_parquet(
                root / subject / f"{split}-00000-of-00001.parquet"
            )
    write_configs_readme(root, {subject: list(MMLU_SPLITS) for subject in subjects})
    return root


def lay_out(refdata: Path, root: Path, mmlu_subjects: list[str]) -> dict[str, Path]:
    """Every reference copy in the Hub's layout under ``root``, by Hub dataset id."""
    return {
        "EleutherAI/hendrycks_math": hendrycks_math(refdata, root / "hendrycks_math"),
        "HuggingFaceH4/MATH-500": math500(refdata, root / "MATH-500"),
        "cais/mmlu": mmlu(refdata, root / "mmlu", mmlu_subjects),
    }
