"""Functions the klstudy lm-eval tasks call: load a staged dataset, render its prompt, score k completions.

Scoring is ``klstudy.rewards.score``, the reward RL trained with; model text is never executed.
"""

from __future__ import annotations

from pathlib import Path

import datasets

from klstudy import data, rewards

# Record fields a reward needs; Countdown records carry their numbers and target.
SCORING_FIELDS = ("answer", "reward", "numbers", "target")


def load_records(data_dir: str, name: str, limit: int | None = None, **_) -> datasets.DatasetDict:
    """``{data_dir}/{name}.jsonl`` (the prepare_data rule's output) as lm-eval's test split.

    ``data_dir`` and ``limit`` come from the TaskManager's metadata, ``name`` from the task's dataset_kwargs.
    """
    records = data.read_jsonl(Path(data_dir) / f"{name}.jsonl")[:limit]
    rows = [{"id": r["id"], "prompt": r["prompt"], **{k: r.get(k) for k in SCORING_FIELDS}} for r in records]
    for row in rows:  # one column type per field, whatever the task family
        row["numbers"] = row["numbers"] or []
        row["target"] = row["target"] or 0
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def doc_to_text(doc: dict) -> str:
    return doc["prompt"]


def mean_at_k(doc: dict, completions: list[str]) -> float:
    """Fraction of the k completions that the reward counts as right."""
    return sum(rewards.score(doc, completion) for completion in completions) / len(completions)


def process_results(doc: dict, results: list[list[str]]) -> dict:
    """lm-eval hook: ``results`` is [the k repeats] — one request, whose filtered response (the task's
    take_first_k filter) is the list of all k completions. lm-eval logs the same list as the sample's
    ``filtered_resps``."""
    (completions,) = results
    return {"mean_at_k": mean_at_k(doc, completions)}
