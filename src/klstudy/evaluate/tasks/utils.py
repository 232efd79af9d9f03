"""Functions the klstudy lm-eval tasks call: load a staged dataset, render its prompt, score k completions.

Scoring is ``klstudy.data.rewards.judge``, the reward RL trained with; model text is never executed.
"""

from __future__ import annotations

from pathlib import Path

import datasets

from klstudy.data import rewards, staging


def load_records(data_dir: str, name: str, limit: int | None = None, **_) -> datasets.DatasetDict:
    """``{data_dir}/{name}.jsonl`` (the prepare_data rule's output) as lm-eval's test split.

    ``data_dir`` and ``limit`` come from the TaskManager's metadata, ``name`` from the task's dataset_kwargs.
    """
    records = staging.read_jsonl(Path(data_dir) / f"{name}.jsonl")[:limit]
    rows = [{"id": r["id"], "prompt": r["prompt"], **{k: r.get(k) for k in rewards.SCORING_FIELDS}} for r in records]
    for row in rows:  # one column type per field, whatever the task family
        row["numbers"] = row["numbers"] or []
        row["target"] = row["target"] or 0
        row["choices"] = row["choices"] or []
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def doc_to_text(doc: dict) -> str:
    return doc["prompt"]


def process_results(doc: dict, results: list[list[str]]) -> dict:
    """lm-eval hook: ``results`` is [the k repeats] — one request, whose filtered response (the task's
    take_first_k filter) is the list of all k completions. lm-eval logs the same list as the sample's
    ``filtered_resps``. mean_at_k: the fraction of the k completions that the reward counts as right; unread_at_k:
    the fraction from which it reads no answer at all (a low score from unread answers is not one from wrong ones)."""
    (completions,) = results
    verdicts = [rewards.judge(doc, completion) for completion in completions]
    return {
        "mean_at_k": sum(verdict.reward for verdict in verdicts) / len(verdicts),
        "unread_at_k": sum(not verdict.read for verdict in verdicts) / len(verdicts),
    }
