"""Datasets as staged JSONL files: the paper's (from the Hugging Face Hub) and their embedded stand-ins.

Every dataset, whatever its origin, becomes ``results/data/{name}.jsonl`` with one schema:

    id       unique within the file
    prompt   the user message (chat template applied later, by the trainer or the evaluator)
    answer   the gold answer: a LaTeX/number string, a letter A-D, or a Countdown target
    reward   which verifiable reward scores it: math | multiple_choice | countdown (rewards.py)
    ...      source fields: solution, level, subject, numbers, target, source (dataset id) ...

Training and evaluation jobs read only these files, so compute nodes never touch the network.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from pathlib import Path
from urllib.parse import urlparse

from klstudy import procedural, prompts, rewards

REQUIRED_FIELDS = {"id": str, "prompt": str, "answer": str, "reward": str}
REWARD_KINDS = ("math", "multiple_choice", "countdown")


class DataUnavailable(RuntimeError):
    """A hub dataset cannot be reached; the message says how to stage it by hand."""


class InvalidRecords(ValueError):
    """Records that break the common schema; the message names the dataset and the record."""


# ------------------------------------------------------------------------------------- files


def check_records(records: list[dict], name: str) -> None:
    seen = set()
    for line, record in enumerate(records, 1):
        for field, kind in REQUIRED_FIELDS.items():
            if not isinstance(record.get(field), kind) or not record[field]:
                raise InvalidRecords(
                    f"dataset {name!r}, record {line}: field {field!r} missing or not a {kind.__name__}"
                )
        if record["reward"] not in REWARD_KINDS:
            raise InvalidRecords(f"dataset {name!r}, record {line}: reward {record['reward']!r} not in {REWARD_KINDS}")
        if record["reward"] == "countdown" and not ({"numbers", "target"} <= record.keys()):
            raise InvalidRecords(f"dataset {name!r}, record {line}: countdown records need 'numbers' and 'target'")
        if record["id"] in seen:
            raise InvalidRecords(f"dataset {name!r}, record {line}: duplicate id {record['id']!r}")
        seen.add(record["id"])
    if not records:
        raise InvalidRecords(f"dataset {name!r} is empty")


def write_jsonl(records: list[dict], path: Path) -> None:
    """Write atomically (temporary file, then rename): a failure never leaves a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False, encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False, sort_keys=True) + "\n")
    os.replace(handle.name, path)


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


# ----------------------------------------------------------------------------------- the hub


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co")


def hub_reachable(timeout: float = 5.0) -> bool:
    url = urlparse(hub_endpoint())
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def staging_help(dataset_id: str, kind: str = "dataset") -> str:
    repo_type = "--repo-type dataset " if kind == "dataset" else ""
    return (
        f"To stage it by hand: on a machine with Hub access run "
        f"`huggingface-cli download {repo_type}{dataset_id} --local-dir DIR`, copy DIR to this machine and "
        f"set `local_dir: DIR` for this {kind} in the config (or populate HF_HOME there and set HF_HUB_OFFLINE=1)."
    )


def load_hub_rows(dataset_id: str, config: str | None, split: str, local_dir: str | None = None) -> list[dict]:
    """Rows of one split of a hub dataset, from the hub or from a local snapshot of the same repo.

    Fails at once (a 5-second probe, not the datasets library's retries) when the hub is unreachable.
    """
    import datasets

    source = local_dir or dataset_id
    if local_dir is None and os.environ.get("HF_HUB_OFFLINE") != "1" and not hub_reachable():
        raise DataUnavailable(
            f"cannot reach {hub_endpoint()} to download dataset {dataset_id!r}. {staging_help(dataset_id)}"
        )
    try:
        return list(datasets.load_dataset(source, config, split=split))
    except (ConnectionError, OSError, FileNotFoundError, ValueError) as error:
        raise DataUnavailable(
            f"could not load dataset {dataset_id!r} from {source!r}: {error}. {staging_help(dataset_id)}"
        ) from error


MATH_SUBJECTS = (
    "algebra",
    "counting_and_probability",
    "geometry",
    "intermediate_algebra",
    "number_theory",
    "prealgebra",
    "precalculus",
)


def hendrycks_math(name, rows_by_subject: dict[str, list[dict]], dataset_id: str) -> list[dict]:
    """MATH (problem, level, type, solution): the gold answer is the solution's last \\boxed{}."""
    records = []
    for subject, rows in rows_by_subject.items():
        for i, row in enumerate(rows):
            answer = rewards.last_boxed(row["solution"])
            if answer is None:
                raise InvalidRecords(f"dataset {dataset_id!r} ({subject}, row {i}): no \\boxed{{}} answer in solution")
            records.append(
                dict(
                    id=f"{name}-{subject}-{i:05d}",
                    prompt=prompts.math_prompt(row["problem"]),
                    answer=answer,
                    reward="math",
                    solution=row["solution"],
                    level=row.get("level"),
                    subject=row.get("type", subject),
                    source=dataset_id,
                )
            )
    return records


def math500(name, rows, dataset_id) -> list[dict]:
    """MATH-500 (problem, solution, answer, subject, level, unique_id)."""
    return [
        dict(
            id=f"{name}-{i:05d}",
            prompt=prompts.math_prompt(row["problem"]),
            answer=str(row["answer"]),
            reward="math",
            solution=row.get("solution"),
            level=row.get("level"),
            subject=row.get("subject"),
            source=f"{dataset_id}:{row.get('unique_id', i)}",
        )
        for i, row in enumerate(rows)
    ]


def _column(row: dict, candidates, dataset_id):
    for column in candidates:
        if column in row and row[column] not in (None, ""):
            return row[column]
    raise InvalidRecords(f"dataset {dataset_id!r}: none of the columns {candidates} found; it has {sorted(row)}")


def math_squared(name, rows, dataset_id) -> list[dict]:
    """MATH² (210 rows, one CSV). Its column names are taken from the first that exists."""
    records = []
    for i, row in enumerate(rows):
        answer = _column(row, ("answer", "Answer", "final_answer", "solution", "Solution"), dataset_id)
        answer = rewards.last_boxed(str(answer)) or str(answer)
        records.append(
            dict(
                id=f"{name}-{i:05d}",
                prompt=prompts.math_prompt(
                    str(_column(row, ("question", "problem", "Question", "Problem"), dataset_id))
                ),
                answer=answer.strip(),
                reward="math",
                source=dataset_id,
            )
        )
    return records


def mmlu(name, rows_by_split: dict[str, list[dict]], dataset_id: str, subject: str) -> list[dict]:
    """MMLU (question, choices[4], answer index) over the listed splits: letter answers."""
    records = []
    for split, rows in rows_by_split.items():
        for i, row in enumerate(rows):
            records.append(
                dict(
                    id=f"{name}-{split}-{i:04d}",
                    prompt=prompts.multiple_choice_prompt(row["question"], [str(c) for c in row["choices"]]),
                    answer=prompts.LETTERS[int(row["answer"])],
                    reward="multiple_choice",
                    choices=[str(c) for c in row["choices"]],
                    subject=subject,
                    source=f"{dataset_id}:{subject}:{split}",
                )
            )
    return records


def countdown(name, size: int, seed: int, split: str, **difficulty) -> list[dict]:
    """Countdown from reasoning-gym (deterministic for a seed); split by the question's hash region."""
    import reasoning_gym

    records, drawn = [], 0
    while len(records) < size:
        batch = reasoning_gym.create_dataset("countdown", size=4 * size, seed=seed + drawn, **difficulty)
        drawn += 1
        for entry in batch:
            if procedural.region(entry["question"]) != split or len(records) == size:
                continue
            numbers, target = entry["metadata"]["numbers"], entry["metadata"]["target"]
            records.append(
                dict(
                    id=f"{name}-{len(records):05d}",
                    prompt=prompts.countdown_prompt(entry["question"]),
                    answer=str(target),
                    reward="countdown",
                    numbers=[int(n) for n in numbers],
                    target=int(target),
                    solution=f"<answer>{entry['metadata']['expression']}</answer>",
                    source="reasoning-gym:countdown",
                )
            )
        if drawn > 50:
            raise InvalidRecords(f"dataset {name!r}: could not draw {size} {split} Countdown problems")
    return records


# ------------------------------------------------------------------------------------- dispatch


def build(name: str, spec: dict) -> list[dict]:
    """Records of dataset ``name`` from its config entry (``spec['kind']`` chooses the source)."""
    kind = spec["kind"]
    local_dir = spec.get("local_dir")
    if kind == "arithmetic":
        return procedural.arithmetic(name, spec["size"], spec["seed"], spec["levels"], spec["split"])
    if kind in procedural.MULTIPLE_CHOICE:
        return procedural.multiple_choice(name, kind, spec["size"], spec["seed"], spec["split"])
    if kind == "countdown":
        return countdown(name, spec["size"], spec["seed"], spec["split"], **spec.get("difficulty", {}))
    if kind == "hendrycks_math":
        rows = {s: load_hub_rows(spec["hub_id"], s, spec["split"], local_dir) for s in MATH_SUBJECTS}
        return hendrycks_math(name, rows, spec["hub_id"])
    if kind == "math500":
        return math500(name, load_hub_rows(spec["hub_id"], None, spec["split"], local_dir), spec["hub_id"])
    if kind == "math_squared":
        return math_squared(name, load_hub_rows(spec["hub_id"], None, spec["split"], local_dir), spec["hub_id"])
    if kind == "mmlu":
        rows = {split: load_hub_rows(spec["hub_id"], spec["subject"], split, local_dir) for split in spec["splits"]}
        return mmlu(name, rows, spec["hub_id"], spec["subject"])
    raise ValueError(f"dataset {name!r}: unknown kind {kind!r}")


def prepare(name: str, spec: dict, out: Path) -> list[dict]:
    records = build(name, spec)
    if "size" in spec and len(records) != spec["size"]:
        raise InvalidRecords(f"dataset {name!r}: built {len(records)} records, config asks for {spec['size']}")
    check_records(records, name)
    write_jsonl(records, out)
    return records
