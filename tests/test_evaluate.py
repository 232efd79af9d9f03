"""Evaluation through the real lm-eval-harness (HF backend, CPU) on a tiny model, and the mean@k metric."""

import json

import pytest
import yaml
from workflow_helpers import ROOT

from klstudy.data import procedural, staging
from klstudy.evaluate import harness
from klstudy.evaluate.tasks import utils
from klstudy.train import tiny


def test_mean_at_k_and_unread_by_hand():
    doc = {"answer": "11", "reward": "math", "numbers": [], "target": 0}
    completions = ["so \\boxed{11}", "\\boxed{12}", "The answer is \\boxed{11}.", "no answer at all"]
    # lm-eval passes one request's filtered response: [the k completions] (the sample's logged filtered_resps).
    assert utils.process_results(doc, [completions]) == {"mean_at_k": 0.5, "unread_at_k": 0.25}
    assert utils.process_results(doc, [completions[:1]]) == {"mean_at_k": 1.0, "unread_at_k": 0.0}
    letter = {"answer": "C", "reward": "multiple_choice", "numbers": [], "target": 0, "choices": []}
    three = ["\\boxed{C}", "\\boxed{A}", "I cannot tell."]
    third = pytest.approx(1 / 3)
    assert utils.process_results(letter, [three]) == {"mean_at_k": third, "unread_at_k": third}


def test_every_task_file_names_a_staged_dataset():
    assert harness.task_names() == sorted(
        [
            "countdown_test",
            "math500",
            "math_squared",
            "math_test",
            "mmlu_college_biology",
            "mmlu_college_chemistry",
            "mmlu_college_physics",
        ]
    )


@pytest.fixture(scope="module")
def harness_inputs(tmp_path_factory):
    """An untrained tiny model and five staged questions."""
    path = tmp_path_factory.mktemp("eval")
    spec = tiny.TinyModelSpec(hidden_size=64, num_layers=1, num_heads=2, intermediate_size=128, sft_steps=0)
    tokenizer = tiny.build_tokenizer()
    tiny.save(tiny.build_model(spec, tokenizer), tokenizer, path / "model", spec, {})
    (path / "data").mkdir()
    records = procedural.multiple_choice("mmlu_college_biology", "mc_next", 5, 0, "heldout")
    staging.write_jsonl(records, path / "data" / "mmlu_college_biology.jsonl")
    records = procedural.arithmetic("math500", 5, 0, ["add1w", "sub1w"], "heldout")
    staging.write_jsonl(records, path / "data" / "math500.jsonl")
    return path


@pytest.fixture(scope="module")
def harness_run(harness_inputs):
    path = harness_inputs
    return harness.run(path / "model", ["mmlu_college_biology"], path / "data", k=4, max_tokens=16, limit=3)[
        "mmlu_college_biology"
    ]


def test_harness_keeps_all_k_repeats_and_averages_them(harness_run):
    samples = harness_run["samples"]
    assert len(samples) == 3  # limit
    for sample in samples:
        assert len(sample["filtered_resps"][0]) == 4  # lm-eval's default filter would keep 1
        assert len(set(sample["filtered_resps"][0])) > 1  # sampled, not four copies of one completion
        assert {key: sample[key] for key in ("mean_at_k", "unread_at_k")} == utils.process_results(
            sample["doc"], sample["filtered_resps"]
        )
    expected = sum(s["mean_at_k"] for s in samples) / len(samples)
    assert harness_run["mean_at_k"] == pytest.approx(expected)
    assert harness_run["unread"] == pytest.approx(sum(s["unread_at_k"] for s in samples) / len(samples))


def test_harness_scores_every_repeat_with_the_reward(harness_inputs, monkeypatch):
    """An untrained model is never right, so swap in a reward that often is: the score lm-eval reports must be
    the mean over questions of the mean over all k repeats of that reward (a part-right question included)."""
    from klstudy.data import rewards

    monkeypatch.setattr(rewards, "judge", lambda record, completion: rewards.Verdict(True, float(len(completion) % 2)))
    path = harness_inputs
    result = harness.run(path / "model", ["mmlu_college_biology"], path / "data", k=4, max_tokens=16, limit=3)
    result = result["mmlu_college_biology"]
    per_question = [sum(len(c) % 2 for c in s["filtered_resps"][0]) / 4 for s in result["samples"]]
    assert [s["mean_at_k"] for s in result["samples"]] == per_question
    assert 0 < result["mean_at_k"] == pytest.approx(sum(per_question) / 3)


def test_requests_sample_at_temperature_one_without_a_per_request_seed(harness_run):
    for sample in harness_run["samples"]:
        prompt, generation = sample["arguments"][0]
        assert prompt.startswith("<|im_start|>user\n")  # the chat template was applied
        assert generation["do_sample"] is True and generation["temperature"] == 1.0 and generation["top_p"] == 1.0
        assert "seed" not in generation
        assert generation["until"]  # never lm-eval's default "\n\n"


def test_results_record_the_library_versions(harness_run):
    from importlib.metadata import version

    assert harness_run["versions"] == {
        "lm_eval_version": version("lm_eval"),
        "transformers_version": version("transformers"),
        "torch_version": version("torch"),
    }
    assert harness_run["backend"] == "hf"


def test_one_call_for_several_tasks_scores_each_as_its_own_call(harness_inputs):
    """evaluation.jobs per_model evaluates every task in one lm-eval call: with greedy decoding each task's
    completions and scores equal those of a call for that task alone, and no task's results land in another's."""
    path = harness_inputs
    settings = dict(k=2, max_tokens=12, limit=3, temperature=0)
    tasks = ["mmlu_college_biology", "math500"]
    together = harness.run(path / "model", tasks, path / "data", **settings)
    assert list(together) == tasks
    for task in tasks:
        alone = harness.run(path / "model", [task], path / "data", **settings)[task]
        assert together[task]["task"] == task and [s["doc"] for s in together[task]["samples"]] == [
            s["doc"] for s in alone["samples"]
        ]
        assert [s["resps"] for s in together[task]["samples"]] == [s["resps"] for s in alone["samples"]]
        assert together[task]["mean_at_k"] == alone["mean_at_k"]
    questions = {task: {s["doc"]["prompt"] for s in together[task]["samples"]} for task in tasks}
    assert not questions["math500"] & questions["mmlu_college_biology"]


def test_hf_backend_runs_on_the_gpu_when_there_is_one(monkeypatch):
    """evaluation.hf: auto puts the model on the GPU in its saved dtype; on a CPU, float32; explicit values are kept."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    auto = {"device": "auto", "dtype": "auto"}
    assert harness.model_arguments("hf", "m", auto) == "pretrained=m,device=cuda,dtype=auto"
    explicit = {"device": "cuda:1", "dtype": "float16"}
    assert harness.model_arguments("hf", "m", explicit) == "pretrained=m,device=cuda:1,dtype=float16"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert harness.model_arguments("hf", "m", auto) == "pretrained=m,device=cpu,dtype=float32"
    assert harness.model_arguments("hf", "m", {"device": "cpu", "dtype": "bfloat16"}).endswith("cpu,dtype=bfloat16")


def test_evaluation_job_hands_the_backends_own_section_to_lm_eval(monkeypatch, tmp_path):
    """`klstudy evaluate` passes evaluation.hf (not evaluation.vllm) to the hf backend: its device reaches lm-eval."""
    from klstudy.config import validate_config
    from klstudy.run import cli

    seen = {}

    def fake_run(model, tasks, data_dir, **kwargs):
        seen.update(kwargs)
        return {task: {"mean_at_k": 0.5, "stderr": 0.1, "unread": 0.0, "k": 1, "samples": []} for task in tasks}

    monkeypatch.setattr(harness, "run", fake_run)
    config = validate_config(yaml.safe_load((ROOT / "config.yaml").read_text()))
    section = {**config["evaluation"], "hf": {"device": "cuda:3", "dtype": "bfloat16"}}
    cli.main(["evaluate", "--model", "m", "--task", "math500", "--data-dir", "d", "--settings", json.dumps(section),
              "--out", str(tmp_path / "o.json"), "--samples", str(tmp_path / "s.jsonl")])  # fmt: skip
    assert seen["backend"] == "hf" and seen["backend_settings"] == {"device": "cuda:3", "dtype": "bfloat16"}
    assert config["evaluation"]["hf"] == {"device": "auto", "dtype": "auto"}  # the schema's defaults


def test_evaluation_seeds_pool_each_questions_samples_and_keep_each_seeds_score(harness_inputs, monkeypatch):
    """evaluation.seeds [0, 1]: each seed's run is the run alone under that seed, and the pooled score is the mean over
    questions of each question's mean under both (lm-eval's stderr over those question means)."""
    from klstudy.data import rewards

    monkeypatch.setattr(rewards, "judge", lambda record, completion: rewards.Verdict(True, float(len(completion) % 2)))
    path, settings = harness_inputs, dict(k=3, max_tokens=16, limit=4)
    alone = [
        harness.run(path / "model", ["math500"], path / "data", seed=seed, **settings)["math500"] for seed in (0, 1)
    ]
    assert [s["resps"] for s in alone[0]["samples"]] != [s["resps"] for s in alone[1]["samples"]]  # seeds differ
    result = harness.run_seeds(path / "model", ["math500"], path / "data", [0, 1], **settings)["math500"]
    assert [(each["seed"], each["mean_at_k"]) for each in result["per_seed"]] == [
        (0, alone[0]["mean_at_k"]),
        (1, alone[1]["mean_at_k"]),
    ]
    per_question = [(a["mean_at_k"] + b["mean_at_k"]) / 2 for a, b in zip(*(r["samples"] for r in alone), strict=True)]
    assert result["mean_at_k"] == pytest.approx(sum(per_question) / 4)
    mean = sum(per_question) / 4
    spread = (sum((x - mean) ** 2 for x in per_question) / 3) ** 0.5
    assert result["stderr"] == pytest.approx(spread / 2)
    assert [s["engine_seed"] for s in result["samples"]] == [0] * 4 + [1] * 4


@pytest.mark.parametrize("seeds, expected", [(None, [7]), ([3, 5], [3, 5])])
def test_the_evaluation_job_runs_the_configured_seeds_or_the_training_seed(monkeypatch, tmp_path, seeds, expected):
    from klstudy.config import validate_config
    from klstudy.run import cli

    seen = []

    def fake_run(model, tasks, data_dir, seed, **kwargs):
        seen.append(seed)
        sample = {"doc_id": 0, "mean_at_k": seed / 10}
        return {task: {"task": task, "mean_at_k": seed / 10, "stderr": None, "unread": 0.0, "k": 1,
                       "results": {}, "samples": [sample]} for task in tasks}  # fmt: skip

    monkeypatch.setattr(harness, "run", fake_run)
    config = validate_config(yaml.safe_load((ROOT / "config.yaml").read_text()))
    section = {**config["evaluation"], "seeds": seeds}
    cli.main(["evaluate", "--model", "m", "--task", "math500", "--data-dir", "d", "--settings", json.dumps(section),
              "--seed", "7", "--out", str(tmp_path / "o.json"), "--samples", str(tmp_path / "s.jsonl")])  # fmt: skip
    row = json.loads((tmp_path / "o.json").read_text())
    assert seen == expected and row["engine_seeds"] == expected
    assert row["mean_at_k"] == pytest.approx(sum(expected) / 10 / len(expected))


@pytest.mark.parametrize("template", ["on", "off"])
def test_a_vllm_job_without_an_engine_length_measures_its_prompts(harness_inputs, monkeypatch, tmp_path, template):
    """evaluation.vllm.max_model_len null: the job's longest prompt (as the model receives it) + max_tokens + slack
    reaches lm-eval's engine arguments; a length set in the config is kept."""
    from klstudy.config import validate_config
    from klstudy.data import staging
    from klstudy.run import cli
    from klstudy.train import gpu_memory, models

    seen = []
    monkeypatch.setattr(
        harness,
        "run",
        lambda model, tasks, data_dir, seed, **kwargs: (
            seen.append(kwargs)
            or {
                task: {"task": task, "mean_at_k": 0.0, "stderr": None, "unread": 0.0, "k": 1, "samples": []}
                for task in tasks
            }
        ),
    )
    config = validate_config(yaml.safe_load((ROOT / "config.yaml").read_text()))
    path, tasks = harness_inputs, ["math500", "mmlu_college_biology"]
    for length in (None, 777):
        section = {
            **config["evaluation"],
            "backend": "vllm",
            "vllm": {**config["evaluation"]["vllm"], "max_model_len": length},
        }
        cli.main(["evaluate", "--model", str(path / "model"), "--task", *tasks, "--data-dir", str(path / "data"),
                  "--settings", json.dumps(section), "--chat-template", template,
                  "--out", str(tmp_path / "a.json"), str(tmp_path / "b.json"),
                  "--samples", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")])  # fmt: skip
    tokenizer = models.load(path / "model")[1]
    prompts = [r["prompt"] for task in tasks for r in staging.read_jsonl(path / "data" / f"{task}.jsonl")]
    longest = gpu_memory.longest_prompt(tokenizer, prompts, chat_template=template == "on")
    measured = longest + config["evaluation"]["max_tokens"] + gpu_memory.SLACK
    assert [kwargs["backend_settings"]["max_model_len"] for kwargs in seen] == [measured, 777]
