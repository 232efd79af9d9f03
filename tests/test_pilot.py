"""From the pilot to the grid (klstudy.run.pilot): config/pilot-7b.yaml is what config/paper.yaml makes of it, and
`klstudy calibrate` prices the grid at the step times a pilot measured."""

import json

import pytest
import yaml
from workflow_helpers import ROOT

from klstudy.config import all_cells, validate_config
from klstudy.run import pilot


def load(name):
    return yaml.safe_load((ROOT / name).read_text())


def test_the_pilot_config_is_written_from_the_papers():
    """Change the paper's settings (or its cluster's names) and this fails until `klstudy pilot-config` rewrites it."""
    assert (ROOT / "config" / "pilot-7b.yaml").read_text() == pilot.config_text(
        pilot.pilot_7b(load("config/paper.yaml"))
    )


def test_the_pilot_holds_a_cell_of_each_kind_of_training_at_the_papers_settings():
    """On-policy (both 7-8B models), off-policy, asynchronous on math and on Countdown: the paper's trainer settings."""
    tried, paper = validate_config(load("config/pilot-7b.yaml")), validate_config(load("config/paper.yaml"))
    assert sorted((c["study"], c["model"]) for c in all_cells(tried)) == [
        ("pilot_async_countdown", "qwen3-4b-instruct-2507"), ("pilot_async_math", "qwen2.5-7b"),
        ("pilot_offpolicy_k1_loss", "qwen2.5-7b"), ("pilot_onpolicy", "llama-3.1-8b-instruct"),
        ("pilot_onpolicy", "qwen2.5-7b")]  # fmt: skip
    assert not set(tried["studies"]) & set(paper["studies"]), "no pilot cell is one of the grid's"
    for name, study in tried["studies"].items():
        changed = ("steps", "eval_every", "checkpoint_every", "vllm_importance_sampling")
        same = {k: v for k, v in study["train"].items() if k not in changed}
        paper_train = paper["studies"][name.removeprefix("pilot_")]["train"]
        assert same == {k: paper_train[k] for k in same}, name  # the paper's settings
    logged = [name for name, study in tried["studies"].items() if study["train"]["vllm_importance_sampling"]]
    assert logged == ["pilot_async_math"]  # one cell logs vLLM's log-probs against the trainer's


@pytest.mark.parametrize("name", ["config/pilot.yaml", "config/pilot-7b.yaml"])
def test_every_pilot_cell_reaches_two_checkpoints_and_crosses_a_slice_boundary(name):
    """At the estimate's throughputs (estimate.cell_times), with the startup allowance and the save before the limit,
    each cell reaches its second checkpoint in its first job and is still training when that job ends."""
    config = validate_config(load(name))
    assert pilot.slicing_problems(config) == []


def test_a_pilot_job_too_short_or_too_long_is_named():
    config = validate_config(load("config/pilot-7b.yaml"))
    config["resources"]["train"]["runtime"] = 30  # the old pilot's: no 7B cell saves twice in it
    assert any("pilot_offpolicy_k1_loss qwen2.5-7b: its second checkpoint" in p for p in pilot.slicing_problems(config))
    config["resources"]["train"]["runtime"] = 480  # the 0.5B pilot's old runtime: nothing slices
    assert all("crossing no slice boundary" in p for p in pilot.slicing_problems(config))


def write_cell(results, run, model, async_level, gpus, seconds, lengths, status="ok"):
    """A finished cell as `klstudy train` leaves it: summary.json and metrics.jsonl with one row per step."""
    cell_dir = results / "runs" / run
    cell_dir.mkdir(parents=True)
    train = {"async_level": async_level, "batch_prompts": 256, "rollouts": 5}
    summary = {"status": status, "processes": gpus, "cell": {"run": run, "model": model, "train": train}}
    (cell_dir / "summary.json").write_text(json.dumps(summary))
    rows = [{"step": i + 1, "time": 30.0 + seconds * i, "response_length": length} for i, length in enumerate(lengths)]
    (cell_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_calibrate_prices_each_study_at_the_rate_of_a_pilot_cell_of_its_model_and_kind(tmp_path):
    tried, paper = validate_config(load("config/pilot-7b.yaml")), validate_config(load("config/paper.yaml"))
    write_cell(tmp_path, "onpolicy/qwen2.5-7b/x", "qwen2.5-7b", 0, 8, 100.0, [400, 600])
    write_cell(tmp_path, "async_math/qwen2.5-7b/x", "qwen2.5-7b", 10, 8, 50.0, [744])
    write_cell(tmp_path, "onpolicy/llama/x", "llama-3.1-8b-instruct", 0, 8, 100.0, [500, 500], status="collapsed")
    measured = pilot.measured(tmp_path)
    assert [(m.run, m.seconds_per_step, m.response_length) for m in measured] == [
        ("onpolicy/qwen2.5-7b/x", 100.0, 500.0)
    ]  # fmt: skip (one gap; the async cell has none, the other stopped)
    # 256 × 5 × (256 + 500) tokens × 7.6e9 parameters in 100 s on 8 GPUs
    assert measured[0].rate(tried) == pytest.approx(256 * 5 * 756 * 7.6e9 / 800)
    lines = pilot.calibrate(paper, tried, tmp_path)
    offpolicy = next(line for line in lines if line.startswith("offpolicy_k1_reward:"))
    study = paper["studies"]["offpolicy_k1_reward"]["train"]  # 4 β × 3 seeds: 12 cells of 250 steps of 1024 × 5
    at_max = 12 * 250 * 1024 * 5 * (256 + 1024) * 7.6e9 / measured[0].rate(tried) / 3600
    assert study["steps"] == 250 and offpolicy.startswith(f"offpolicy_k1_reward: {at_max:,.0f} GPU-hours"), lines
    assert "onpolicy: no finished pilot cell of llama-3.1-8b-instruct: not calibrated" in lines


def test_calibrate_without_a_finished_pilot_says_so(tmp_path):
    paper = validate_config(load("config/paper.yaml"))
    assert pilot.calibrate(paper, paper, tmp_path) == [f"calibrate: no finished cell under {tmp_path}/runs: run the "
                                                       "pilot first"]  # fmt: skip
