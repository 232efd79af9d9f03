"""Datasets as staged JSONL files: the paper's (from the Hugging Face Hub) and their embedded stand-ins.

Every dataset, whatever its origin, becomes ``results/data/{name}.jsonl`` with one schema:

    id       unique within the file
    prompt   the user message (chat template applied later, by the trainer or the evaluator)
    answer   the gold answer: a LaTeX/number string, a letter A-D, or a Countdown target
    reward   which verifiable reward scores it: math | multiple_choice | countdown (rewards.py)
    ...      source fields: solution, level, subject, numbers, target, source (dataset id), gold_rule ...

Beside it, ``{name}.check.json`` holds the gold self-check (gold.py): every bare gold answer scored by its own
reward, every reference solution too, the records set aside and why. Training and evaluation jobs read only these
files, so compute nodes never touch the network.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from pathlib import Path
from urllib.parse import urlparse

from klstudy.data import gold, procedural, prompts

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
    repo_type = " --repo-type dataset" if kind == "dataset" else ""
    return (
        f"To stage it by hand: on a machine with Hub access run huggingface_hub's CLI "
        f"`hf download {dataset_id}{repo_type} --local-dir DIR` (.venv/bin/hf here), copy DIR to this machine and "
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
        if local_dir is None:
            return list(datasets.load_dataset(source, config, split=split))
        # A throwaway cache: datasets' own cache served one local snapshot's rows for another laid out the same way
        # (same folder and file names, other contents); staging reads each snapshot once, so nothing is lost.
        with tempfile.TemporaryDirectory(prefix="klstudy-datasets-cache-") as cache:
            return list(datasets.load_dataset(source, config, split=split, cache_dir=cache))
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


def hendrycks_math(name, rows_by_subject: dict[str, list[dict]], dataset_id: str, check: gold.SelfCheck) -> list[dict]:
    """MATH (problem, level, type, solution): the gold answer is read from the solution by gold.py's rule; a row
    whose solution gives none is returned with ``set_aside`` (its reason) instead of an answer."""
    records = []
    for subject, rows in rows_by_subject.items():
        for i, row in enumerate(rows):
            answer = gold.math_gold(row["problem"], row["solution"], check.equal)
            record = dict(
                id=f"{name}-{subject}-{i:05d}",
                prompt=prompts.math_prompt(row["problem"]),
                answer=answer.answer,
                gold_rule=answer.rule,
                reward="math",
                solution=row["solution"],
                level=row.get("level"),
                subject=row.get("type", subject),
                source=dataset_id,
            )
            if answer.answer is None:
                record["set_aside"] = "no answer box in the solution (empty, open or only 'also accepted' boxes)"
            records.append(record)
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


def _column(rows: list[dict], candidates: list[str], name: str, dataset_id: str, key: str) -> str:
    """The first of ``candidates`` (the config's ``columns.<key>``) that the rows have."""
    have = sorted(rows[0]) if rows else []
    for column in candidates:
        if column in have:
            return column
    raise InvalidRecords(
        f"dataset {name!r} ({dataset_id}): none of the columns {list(candidates)} (config key "
        f"'data.{name}.columns.{key}') is in the file, which has the columns {have}; set that key to the column "
        f"that holds the {key}"
    )


def math_squared(name, rows, dataset_id, columns: dict, check: gold.SelfCheck) -> list[dict]:
    """MATH² (210 rows, one CSV). Its column names come from the config (``columns``: the first of each list that
    the file has). An answer that holds boxes is a solution, read by gold.py's rule; one in "$...$" is unwrapped."""
    problem_column = _column(rows, columns["problem"], name, dataset_id, "problem")
    answer_column = _column(rows, columns["answer"], name, dataset_id, "answer")
    records = []
    for i, row in enumerate(rows):
        problem, answer = str(row[problem_column] or ""), str(row[answer_column] or "").strip()
        if len(answer) > 1 and answer[0] == answer[-1] == "$":  # "$4$": the answer, in inline math
            answer = answer[1:-1].strip()
        record = dict(
            id=f"{name}-{i:05d}", prompt=prompts.math_prompt(problem), answer=answer, reward="math", source=dataset_id
        )
        if "\\boxed" in answer or "\\fbox" in answer:
            read = gold.math_gold(problem, answer, check.equal)
            record.update(answer=read.answer, gold_rule=read.rule, solution=answer)
            if read.answer is None:
                record["set_aside"] = "no answer box in the answer column's solution"
        records.append(record)
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
        for entry in batch:  # each puzzle is generated when it is reached (25 ms each): stop once there are enough
            if len(records) == size:
                break
            if procedural.region(entry["question"]) != split:
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


def build(name: str, spec: dict, check: gold.SelfCheck) -> list[dict]:
    """Records of dataset ``name`` from its config entry (``spec['kind']`` chooses the source), set-aside ones
    included (they carry ``set_aside``)."""
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
        return hendrycks_math(name, rows, spec["hub_id"], check)
    if kind == "math500":
        return math500(name, load_hub_rows(spec["hub_id"], None, spec["split"], local_dir), spec["hub_id"])
    if kind == "math_squared":
        rows = load_hub_rows(spec["hub_id"], None, spec["split"], local_dir)
        return math_squared(name, rows, spec["hub_id"], spec["columns"], check)
    if kind == "mmlu":
        rows = {split: load_hub_rows(spec["hub_id"], spec["subject"], split, local_dir) for split in spec["splits"]}
        return mmlu(name, rows, spec["hub_id"], spec["subject"])
    raise ValueError(f"dataset {name!r}: unknown kind {kind!r}")


def check_path(out: Path) -> Path:
    """Where the self-check report of the dataset staged at ``out`` goes: ``{name}.check.json`` beside it."""
    return Path(out).with_suffix(".check.json")


def prepare(name: str, spec: dict, out: Path) -> list[dict]:
    """Build the dataset, check it (schema, size, gold self-check), then write it and its report; a dataset that
    fails any check is not written, and the error names the records."""
    check = gold.SelfCheck()
    built = build(name, spec, check)
    if "size" in spec and len(built) != spec["size"]:
        raise InvalidRecords(f"dataset {name!r}: read {len(built)} rows, config asks for {spec['size']}")
    records = [r for r in built if "set_aside" not in r]
    set_aside = [{"id": r["id"], "reason": r["set_aside"]} for r in built if "set_aside" in r]
    check_records(records, name)
    report = check.report(name, records, set_aside, spec["min_reference_pass"])
    print(gold.summary(report), flush=True)
    problems = gold.failures(report)
    if problems:
        raise InvalidRecords(f"dataset {name!r} fails its gold self-check: " + "; ".join(problems))
    write_jsonl(records, out)
    check_path(out).write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return records
