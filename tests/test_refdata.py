"""The paper's real datasets (MATH train and test, MATH-500, three MMLU subjects), laid out as the Hub's repositories
and staged by the prepare_data rule's own command with config/paper.yaml's entries: sizes, gold answers against
lm-eval's and MATH-500's, letters against the copies, the self-check's figures.

The copies are found through KLSTUDY_REFDATA (.ci/run sets it to ../shared/refdata where that exists; a user points
it at their own copies, laid out as shared/refdata/SOURCES.md says). Without it every test here is skipped, saying
why. MATH² is not among the copies; Countdown is generated, not staged from the Hub (test_data.py covers both).
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import hub_layout
import pytest
import yaml

from klstudy import config
from klstudy.data import answer_text, gold, staging

REFDATA = hub_layout.refdata_dir()
pytestmark = [
    pytest.mark.real,  # the real model and real data tier: `make test-real` (docs/testing.md)
    pytest.mark.skipif(
        REFDATA is None,
        reason=f"{hub_layout.REFDATA_VARIABLE} is unset or names no directory: set it to copies of the paper's "
        "datasets laid out as shared/refdata/SOURCES.md says (.ci/run sets it where ../shared/refdata exists)",
    ),
]

PAPER = config.validate_config(yaml.safe_load((config.REPO_ROOT / "config" / "paper.yaml").read_text()))
HUB_KINDS = ("hendrycks_math", "math500", "mmlu")
STAGED = [name for name, spec in PAPER["data"].items() if spec["kind"] in HUB_KINDS]


@pytest.fixture(scope="module")
def staged(tmp_path_factory) -> dict[str, dict]:
    """Each Hub dataset of config/paper.yaml staged as the prepare_data rule stages it (its command, its settings
    plus local_dir), all at once: by name, its exit status, log, records and self-check report."""
    root = tmp_path_factory.mktemp("refdata")
    subjects = [PAPER["data"][name]["subject"] for name in STAGED if PAPER["data"][name]["kind"] == "mmlu"]
    local_dirs = hub_layout.lay_out(REFDATA, root / "hub", subjects)
    jobs = {}
    for name in STAGED:
        settings = {**PAPER["data"][name], "local_dir": str(local_dirs[PAPER["data"][name]["hub_id"]])}
        out, log = root / "data" / f"{name}.jsonl", root / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "klstudy", "prepare-data", "--name", name]
        command += ["--settings", json.dumps(settings), "--out", str(out)]
        jobs[name] = (subprocess.Popen(command, stdout=open(log, "w"), stderr=subprocess.STDOUT), out, log)
    results = {}
    for name, (process, out, log) in jobs.items():
        status = process.wait(timeout=1200)
        results[name] = {
            "status": status,
            "log": log.read_text(),
            "records": staging.read_jsonl(out) if out.exists() else [],
            "report": json.loads(staging.check_path(out).read_text()) if staging.check_path(out).exists() else None,
        }
    return results


@pytest.fixture(scope="module")
def check():
    return gold.SelfCheck()


@pytest.mark.parametrize("name", STAGED)
def test_every_hub_dataset_stages_with_its_configured_size(staged, name):
    result = staged[name]
    assert result["status"] == 0, result["log"][-3000:]
    report = result["report"]
    assert report["rows_read"] == PAPER["data"][name]["size"]
    assert len(result["records"]) == report["staged"] == report["rows_read"] - len(report["set_aside"])
    assert report["bare_gold"]["passed"] == report["bare_gold"]["scored"] == report["staged"]
    assert f"dataset {name}: {report['rows_read']} rows read" in result["log"]  # the counts are in the job's log
    print(gold.summary(report))  # the figures docs/data.md quotes (pytest -s shows them)


def reference_rows(split: str) -> list[dict]:
    return hub_layout.read_jsonl(REFDATA / "math" / f"{split}.jsonl")


@pytest.mark.parametrize("name,split", [("math_train", "train"), ("math_test", "test")])
def test_only_solutions_without_an_answer_box_are_set_aside(staged, name, split):
    """Found independently: the solutions whose every box is empty (MATH train's two `\\boxed{}`)."""
    boxless = {
        row["solution"]
        for row in reference_rows(split)
        if all(not (c or "").strip() for _, c in answer_text.boxes(row["solution"]))
    }
    set_aside = {entry["id"] for entry in staged[name]["report"]["set_aside"]}
    assert len(set_aside) == len(boxless) == {"math_train": 2, "math_test": 0}[name]


def lm_eval_gold(solution: str) -> str | None:
    """lm-eval's hendrycks_math task's gold answer (its own code, as MATH's authors wrote it)."""
    from lm_eval.tasks.hendrycks_math.utils import last_boxed_only_string, remove_boxed

    try:
        return remove_boxed(last_boxed_only_string(solution))
    except (AssertionError, TypeError):  # no box, or a \fbox, which its remove_boxed refuses
        return None


@pytest.mark.parametrize("name", ["math_train", "math_test"])
def test_gold_answers_are_lm_evals_except_where_the_rule_says_why(staged, name):
    """Every gold answer equals lm-eval's own extraction, except: lists joined (step 4), a dropped "also accepted"
    or blank box (step 2), and lm-eval's misreading of `\\boxed {17}` (a space before the brace) as "{17}."."""
    departures = {"joined": 0, "dropped box": 0, "space before brace": 0}
    for record in staged[name]["records"]:
        theirs = lm_eval_gold(record["solution"])
        if (theirs or "").strip() == record["answer"]:  # whitespace around a box's content means nothing to the reward
            continue
        if record["gold_rule"] == "joined":
            departures["joined"] += 1
        elif len(gold.answer_boxes(record["solution"])) < len(answer_text.boxes(record["solution"])):
            departures["dropped box"] += 1
        else:
            assert theirs == "{" + record["answer"] + "}.", (record["id"], theirs, record["answer"])
            departures["space before brace"] += 1
    print(name, departures)
    assert (
        departures
        == {
            "math_train": {"joined": 12, "dropped box": 1, "space before brace": 1},
            "math_test": {"joined": 8, "dropped box": 2, "space before brace": 0},
        }[name]
    )


def test_math_test_gold_agrees_with_math500s_curated_answers(staged, check):
    """MATH-500 (PRM800K's curated answers) holds 500 MATH test problems: our gold for each equals its answer."""
    gold_by_problem = {record["prompt"]: record["answer"] for record in staged["math_test"]["records"]}
    disagreements = []
    for record in staged["math500"]["records"]:
        ours = gold_by_problem[record["prompt"]]
        if not check.equal(ours, record["answer"]):
            disagreements.append((record["source"], ours, record["answer"]))
    assert disagreements == []


def test_known_odd_solutions_get_the_gold_the_rule_promises(staged):
    by_solution = {r["solution"]: r for name in ("math_train", "math_test") for r in staged[name]["records"]}
    rows = {row["unique_id"]: row for split in ("train", "test") for row in reference_rows(split)}
    expected = {
        "train/algebra/24014.json": "2",  # \boxed 2
        "train/algebra/25040.json": "9",
        "train/algebra/1397.json": "17",  # \boxed {17}. then \boxed{17}
        "test/algebra/1730.json": "-3",  # Note: \boxed{3} is also accepted
        "test/intermediate_algebra/747.json": "(3,-5)",  # \boxed{(0,0)} is also an acceptable answer
        "train/intermediate_algebra/1964.json": "1, 9",  # Enter all possible values, separated by commas
    }
    assert {uid: by_solution[rows[uid]["solution"]]["answer"] for uid in expected} == expected


@pytest.mark.parametrize("name", [n for n in STAGED if PAPER["data"][n]["kind"] == "mmlu"])
def test_mmlu_letters_are_the_copies_letters(staged, name):
    subject = PAPER["data"][name]["subject"]
    letters = []
    for split in PAPER["data"][name]["splits"]:
        folder = hub_layout.MMLU_SPLITS[split]
        with open(REFDATA / "mmlu" / folder / f"{subject}_{folder}.csv", newline="", encoding="utf-8") as handle:
            letters += [row[-1] for row in csv.reader(handle)]
    assert [record["answer"] for record in staged[name]["records"]] == letters


def test_reference_solutions_score_as_the_report_says(staged):
    """The self-check's figures hold (docs/data.md, gold answers): MATH's own solutions, scored as completions, score 1
    but for answers they list as alternatives or spread over boxes math-verify reads one of."""
    rates = {
        name: staged[name]["report"]["reference_solutions"]["rate"] for name in ("math_train", "math_test", "math500")
    }
    assert all(rate >= PAPER["data"][name]["min_reference_pass"] for name, rate in rates.items())
    assert rates["math500"] == 1.0
    assert all(staged[name]["report"]["reference_solutions"]["rate"] is None for name in STAGED if "mmlu" in name)


def test_fig12s_questions_span_the_real_math_test_sets_subjects(staged):
    """The real MATH test set is staged subject by subject: its first 200 questions are one subject, the seeded draw
    of config/paper.yaml (divergence.prompts, divergence.prompt_seed) spans all seven."""
    from klstudy.evaluate.divergence import chosen_prompts

    records = staged["math_test"]["records"]
    subject_of = {record["prompt"]: record["subject"] for record in records}
    section = PAPER["divergence"]
    first = {subject_of[p] for p in chosen_prompts(records, section["prompts"], None)}
    drawn = [subject_of[p] for p in chosen_prompts(records, section["prompts"], section["prompt_seed"])]
    assert len(first) == 1 and len(set(drawn)) == 7, (first, sorted(set(drawn)))
    print({subject: drawn.count(subject) for subject in sorted(set(drawn))})
