"""Datasets: the common schema, determinism, disjoint train/held-out regions, hub loading and its failure."""

import csv
import json
import re

import datasets
import hub_layout
import pytest

from klstudy import config
from klstudy.data import choice_letter, procedural, rewards, staging


def test_procedural_sets_follow_the_schema_and_their_own_reward():
    records = procedural.arithmetic("math_train", 200, 0, list(procedural.ARITHMETIC_LEVELS), "train")
    staging.check_records(records, "math_train")
    for record in records:
        assert rewards.math_reward(record["solution"], record["answer"]) == 1.0, record
        assert "\\boxed{}" in record["prompt"] and record["prompt"].startswith(record["problem"])
    for kind in procedural.MULTIPLE_CHOICE:
        mc = procedural.multiple_choice(kind, kind, 50, 0, "heldout")
        staging.check_records(mc, kind)
        assert all(choice_letter.multiple_choice_reward(r["solution"], r["answer"]) == 1.0 for r in mc)
        assert {r["answer"] for r in mc} == {"A", "B", "C", "D"}


def test_worked_arithmetic_is_right():
    for level in procedural.ARITHMETIC_LEVELS:
        for record in procedural.arithmetic(level, 10, 3, [level], "train"):
            terms = re.findall(r"\d+|[-+*]", record["problem"])  # "Find the sum: 3 + 5." -> 3, +, 5
            value = int(terms[0])
            for op, operand in zip(terms[1::2], terms[2::2], strict=True):
                value = {"+": value + int(operand), "-": value - int(operand), "*": value * int(operand)}[op]
            assert int(record["answer"]) == value >= 0, record


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    spec = config.dataset_settings(
        "math_train", {"kind": "arithmetic", "size": 100, "seed": 7, "levels": ["add2", "sub2"], "split": "train"}
    )
    staging.prepare("math_train", spec, tmp_path / "a.jsonl")
    staging.prepare("math_train", spec, tmp_path / "b.jsonl")
    staging.prepare("math_train", {**spec, "seed": 8}, tmp_path / "c.jsonl")
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert (tmp_path / "a.jsonl").read_bytes() != (tmp_path / "c.jsonl").read_bytes()


def test_warm_up_train_and_held_out_problems_never_overlap():
    levels = ["add1", "sub1", "add2", "sub2"]
    regions = {
        split: {r["problem"] for r in procedural.arithmetic(split, 400, 0, levels, split)}
        for split in procedural.REGIONS
    }
    assert all(regions.values())
    assert not regions["train"] & regions["heldout"]
    assert not regions["warmup"] & (regions["train"] | regions["heldout"])


def test_countdown_from_reasoning_gym_is_deterministic_and_solvable():
    difficulty = dict(min_numbers=3, max_numbers=3, min_value=1, max_value=9, min_target=5, max_target=30)
    first, again = (
        staging.countdown("cd", 20, 3, "train", **difficulty),
        staging.countdown("cd", 20, 3, "train", **difficulty),
    )
    assert first == again
    staging.check_records(first, "cd")
    assert all(rewards.countdown_reward(r["solution"], r["numbers"], r["target"]) == 1.0 for r in first)


def test_bad_records_name_the_dataset_and_record():
    with pytest.raises(staging.InvalidRecords, match="dataset 'x', record 2: field 'answer'"):
        staging.check_records(
            [{"id": "1", "prompt": "p", "answer": "a", "reward": "math"}, {"id": "2", "prompt": "p"}], "x"
        )
    with pytest.raises(staging.InvalidRecords, match="duplicate id"):
        staging.check_records([{"id": "1", "prompt": "p", "answer": "a", "reward": "math"}] * 2, "x")


def test_unreachable_hub_fails_at_once_without_a_file(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.invalid")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    # "At once": the reachability probe answers, the datasets library (which retries for minutes) is never called.
    monkeypatch.setattr(datasets, "load_dataset", lambda *args, **kwargs: pytest.fail("load_dataset was called"))
    out = tmp_path / "mmlu.jsonl"
    spec = {"kind": "mmlu", "hub_id": "cais/mmlu", "subject": "college_physics", "splits": ["test"]}
    hint = "cais/mmlu.*hf download cais/mmlu --repo-type dataset --local-dir"
    with pytest.raises(staging.DataUnavailable, match=hint):
        staging.prepare("mmlu_physics", spec, out)
    assert not out.exists() and not list(tmp_path.iterdir())


def write_hub_snapshot(root, configs: dict[str, dict[str, list[dict]]]):
    """A local repo in the hub's layout: data files per config and split, declared in README.md."""
    for name, splits in configs.items():
        for split, rows in splits.items():
            path = root / name / f"{split}-00000-of-00001.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    hub_layout.write_configs_readme(root, {name: list(splits) for name, splits in configs.items()})


def test_mmlu_loads_from_a_local_snapshot_in_the_hub_format(tmp_path):
    row = {"question": "What is c?", "subject": "college_physics", "choices": ["1", "3e8 m/s", "2", "4"], "answer": 1}
    write_hub_snapshot(tmp_path, {"college_physics": {"test": [row] * 3, "validation": [row], "dev": [row]}})
    spec = config.dataset_settings(
        "mmlu_physics",
        {
            "kind": "mmlu",
            "hub_id": "cais/mmlu",
            "subject": "college_physics",
            "splits": ["test", "validation", "dev"],
            "local_dir": str(tmp_path),
        },
    )
    records = staging.prepare("mmlu_physics", spec, tmp_path / "out.jsonl")
    assert len(records) == 5 and {r["answer"] for r in records} == {"B"}
    assert "B) 3e8 m/s" in records[0]["prompt"]


def test_math_loaders_on_local_snapshots(tmp_path):
    math_row = {"problem": "Find x.", "level": "Level 2", "type": "Algebra", "solution": "So $x=\\boxed{\\frac12}$."}
    write_hub_snapshot(tmp_path / "math", {s: {"train": [math_row]} for s in staging.MATH_SUBJECTS})
    records = staging.prepare(
        "math_train",
        config.dataset_settings(
            "math_train",
            {
                "kind": "hendrycks_math",
                "hub_id": "EleutherAI/hendrycks_math",
                "split": "train",
                "local_dir": str(tmp_path / "math"),
            },
        ),
        tmp_path / "m.jsonl",
    )
    assert len(records) == 7 and records[0]["answer"] == "\\frac12"
    row500 = {
        "problem": "1+1?",
        "solution": "\\boxed{2}",
        "answer": "2",
        "subject": "Algebra",
        "level": 1,
        "unique_id": "test/a.json",
    }
    write_hub_snapshot(tmp_path / "m500", {"default": {"test": [row500]}})
    records = staging.prepare(
        "math500",
        config.dataset_settings(
            "math500",
            {
                "kind": "math500",
                "hub_id": "HuggingFaceH4/MATH-500",
                "split": "test",
                "local_dir": str(tmp_path / "m500"),
            },
        ),
        tmp_path / "m500.jsonl",
    )
    assert records[0]["answer"] == "2" and records[0]["source"].endswith("test/a.json")


def math_squared_spec(local_dir, **settings) -> dict:
    entry = {"kind": "math_squared", "hub_id": "veds12/math-squared", "split": "train", "local_dir": str(local_dir)}
    return config.dataset_settings("math_squared", {**entry, **settings})


def write_csv_snapshot(root, header: list[str], rows: list[list[str]]):
    """The Hub's layout of veds12/math-squared: one CSV file at the root (`datasets` reads it as split 'train')."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "math^2_final.csv", "w", newline="") as handle:
        csv.writer(handle).writerows([header, *rows])


def test_math_squared_columns_come_from_the_config(tmp_path):
    write_csv_snapshot(tmp_path / "m2", ["Q", "Sol"], [["1+1?", "So $\\boxed{2}$."], ["2+2?", "$4$"]])
    spec = math_squared_spec(tmp_path / "m2", columns={"problem": ["Q"], "answer": ["Sol"]})
    records = staging.prepare("math_squared", spec, tmp_path / "m2.jsonl")
    assert [r["answer"] for r in records] == ["2", "4"]  # a solution's box; a bare answer without its "$"
    assert records[0]["prompt"].startswith("1+1?") and records[0]["gold_rule"] == "one box"


def test_math_squared_without_its_columns_fails_naming_them_and_the_key(tmp_path):
    write_csv_snapshot(tmp_path / "m2", ["Q", "Sol"], [["1+1?", "2"]])
    with pytest.raises(staging.InvalidRecords) as error:
        staging.prepare("math_squared", math_squared_spec(tmp_path / "m2"), tmp_path / "m2.jsonl")
    message = str(error.value)
    assert "['question', 'problem', 'Question', 'Problem']" in message  # the schema's default guess
    assert "data.math_squared.columns.problem" in message and "['Q', 'Sol']" in message
    assert not (tmp_path / "m2.jsonl").exists()


def test_a_gold_answer_its_reward_cannot_read_fails_staging_naming_it(tmp_path):
    write_csv_snapshot(tmp_path / "m2", ["question", "answer"], [["a?", "2"], ["b?", "}"], ["c?", "3"]])
    with pytest.raises(staging.InvalidRecords, match=r"1 bare gold answers do not score 1.*: math_squared-00001$"):
        staging.prepare("math_squared", math_squared_spec(tmp_path / "m2"), tmp_path / "m2.jsonl")
    assert not (tmp_path / "m2.jsonl").exists()


def test_reference_solutions_below_the_threshold_fail_staging(tmp_path):
    """Each solution's main answer is -3, but it ends by boxing another one it also accepts: the gold rule takes
    -3, math-verify reads the last box of the solution (3), so no reference solution scores 1."""
    row = {
        "problem": "d?",
        "level": "Level 1",
        "type": "Algebra",
        "solution": "$d=\\boxed{-3}$.\n\nNote: $\\boxed{3}$ is also accepted.",
    }
    write_hub_snapshot(tmp_path / "math", {s: {"test": [row]} for s in staging.MATH_SUBJECTS})
    entry = {
        "kind": "hendrycks_math",
        "hub_id": "EleutherAI/hendrycks_math",
        "split": "test",
        "local_dir": str(tmp_path / "math"),
    }
    with pytest.raises(
        staging.InvalidRecords, match=r"0 of 7 reference solutions score 1 \(0.0000 < min_reference_pass 0.99\)"
    ):
        staging.prepare("math_test", config.dataset_settings("math_test", entry), tmp_path / "t.jsonl")
    records = staging.prepare(
        "math_test", config.dataset_settings("math_test", {**entry, "min_reference_pass": 0}), tmp_path / "t.jsonl"
    )
    assert {r["answer"] for r in records} == {"-3"}
    report = json.loads(staging.check_path(tmp_path / "t.jsonl").read_text())
    assert report["reference_solutions"]["passed"] == 0 and report["bare_gold"]["passed"] == 7


def test_staging_writes_the_self_check_beside_the_data(tmp_path):
    rows = [
        {"problem": "x?", "level": "Level 1", "type": "Algebra", "solution": "$x = \\boxed 2$."},
        {"problem": "y?", "level": "Level 1", "type": "Algebra", "solution": "So there are $\\boxed{}$ of them."},
        {
            "problem": "Enter all solutions, separated by commas.",
            "level": "Level 1",
            "type": "Algebra",
            "solution": "$x=\\boxed{1}$ or $x=\\boxed{9}$.",
        },
    ]
    plain = {"problem": "z?", "level": "Level 1", "type": "Algebra", "solution": "$z = \\boxed{5}$."}
    write_hub_snapshot(
        tmp_path / "math", {"algebra": {"train": rows}, **{s: {"train": [plain]} for s in staging.MATH_SUBJECTS[1:]}}
    )
    entry = {
        "kind": "hendrycks_math",
        "hub_id": "EleutherAI/hendrycks_math",
        "split": "train",
        "size": 9,
        "local_dir": str(tmp_path / "math"),
        "min_reference_pass": 0.5,
    }
    records = staging.prepare("math_train", config.dataset_settings("math_train", entry), tmp_path / "m.jsonl")
    assert [r["answer"] for r in records] == ["2", "1, 9"] + ["5"] * 6
    report = json.loads(staging.check_path(tmp_path / "m.jsonl").read_text())
    assert report["rows_read"] == 9 and report["staged"] == 8
    assert [entry["id"] for entry in report["set_aside"]] == ["math_train-algebra-00001"]
    assert "no answer box" in report["set_aside"][0]["reason"]
    assert report["bare_gold"] == {"scored": 8, "passed": 8, "failed_ids": []}
    reference = report["reference_solutions"]  # the set-aside record counts as a failure
    assert reference["scored"] == 9 and reference["passed"] in (7, 8) and reference["rate"] == reference["passed"] / 9
    assert report["gold_rules"] == {"one box": 7, "joined": 1}
    assert report["several_boxed"]["joined"] == ["math_train-algebra-00002"]


def test_two_local_snapshots_laid_out_alike_each_stage_their_own_rows(tmp_path):
    """datasets' shared cache once gave the second snapshot the first one's rows."""
    spec = {"kind": "math500", "hub_id": "HuggingFaceH4/MATH-500", "split": "test"}
    answers = {}
    for copy, answer in (("first", "2"), ("second", "3")):
        row = {"problem": "x?", "solution": f"\\boxed{{{answer}}}", "answer": answer, "unique_id": "test/a/1.json"}
        write_hub_snapshot(tmp_path / copy / "m500", {"default": {"test": [row] * int(answer)}})
        entry = config.dataset_settings("math500", {**spec, "local_dir": str(tmp_path / copy / "m500")})
        answers[copy] = [r["answer"] for r in staging.prepare("math500", entry, tmp_path / f"{copy}.jsonl")]
    assert answers == {"first": ["2", "2"], "second": ["3", "3", "3"]}


def test_many_phrasings_ask_each_fact_in_sentences_of_every_region():
    """add1m: the held-out questions ask facts that RL's training region asks too, in other sentences (over a
    hundred templates), so that what RL learns of a fact can be measured on questions it never saw."""
    heldout = procedural.arithmetic("h", 300, 0, ["add1m"], "heldout")
    train = procedural.arithmetic("t", 300, 0, ["add1m"], "train")
    assert len({re.sub(r"\d", "#", r["problem"]) for r in heldout}) > 100
    fact = re.compile(r"(\d)\s*\+\s*(\d)")
    heldout_facts = {fact.search(r["problem"]).groups() for r in heldout}
    train_facts = {fact.search(r["problem"]).groups() for r in train}
    assert not {r["problem"] for r in heldout} & {r["problem"] for r in train}
    assert len(heldout_facts & train_facts) > 0.8 * len(heldout_facts)
