"""GPU memory plans (train/gpu_memory.py) from the paper's models' published configs and the H200's measured peaks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from klstudy.config import train_gpus, validate_config
from klstudy.train import gpu_memory, standins, tiny
from klstudy.train.gpu_memory import GIB, Shape

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "tests/fixtures/model-configs"
RECORDS = ROOT / "docs/record/gpu"
GPU = 80 * GIB  # an A100 80GB, the paper's (App. B)
PROMPT = 400  # tokens: a long MATH question in the chat template (the preflight measures the staged data's)


def shape(model: str) -> Shape:
    return Shape.of(json.loads((CONFIGS / f"{model}.json").read_text()))


@pytest.mark.parametrize(
    "model, published, kv_per_token, context_kv_gib",
    [
        ("llama-3.1-8b-instruct", 8.030e9, 131_072, 16.0),  # 2 × 32 layers × 8 heads × 128 × 2 bytes
        ("qwen2.5-7b", 7.615e9, 57_344, 7.0),
        ("qwen3-4b-instruct-2507", 4.022e9, 147_456, 36.0),
    ],
)
def test_shapes_read_from_config_json(model, published, kv_per_token, context_kv_gib):
    """Parameters within 0.1 % of the published counts (norms and biases left out), KV bytes per token, and the KV
    cache of one sequence as long as the model's context: what TRL's colocated engine is asked for today."""
    found = shape(model)
    assert found.parameters == pytest.approx(published, rel=1e-3)
    assert found.kv_bytes_per_token == kv_per_token
    assert found.kv_bytes_per_token * found.context / GIB == pytest.approx(context_kv_gib)


@pytest.mark.parametrize("model", ["llama-3.1-8b-instruct", "qwen3-4b-instruct-2507"])
def test_trls_defaults_leave_no_room_for_one_sequence_of_the_models_context(model):
    """TRL's colocated engine without max_model_len or a share: the model's context in 30 % of the GPU."""
    found = shape(model)
    engine = gpu_memory.Plan(
        model,
        GPU,
        found.context,
        160,
        2 * found.parameters,
        found.kv_bytes_per_token * found.context,
        training=int(GPU * (0.7 - gpu_memory.HEADROOM)),
    )  # fmt: skip (training leaves the engine TRL's 30 % of the GPU)
    assert engine.problem() and f"one {found.context}-token sequence needs" in engine.problem()


def test_the_pilots_model_fits_even_so():
    """Qwen2.5-0.5B's 32,768-token context fits TRL's 30 %: why the pilot never showed the failure."""
    config = {**standins.SHAPES["qwen2.5-0.5b"], "max_position_embeddings": 32_768}
    small = Shape.of(config)
    engine = gpu_memory.Plan("qwen2.5-0.5b", GPU, small.context, 160, 2 * small.parameters,
                             small.kv_bytes_per_token * small.context,
                             training=int(GPU * (0.7 - gpu_memory.HEADROOM)))  # fmt: skip
    assert engine.problem() is None


def paper_plans():
    config = validate_config(yaml.safe_load((ROOT / "config/paper.yaml").read_text()))
    for study, spec in config["studies"].items():
        for model in spec["models"]:
            yield study, gpu_memory.training_plan(model, shape(model), spec["train"], train_gpus(config, study),
                                                  PROMPT, GPU)  # fmt: skip


@pytest.mark.parametrize("study, plan", list(paper_plans()), ids=lambda x: x if isinstance(x, str) else x.model)
def test_every_paper_cell_gets_an_engine_that_fits_beside_training(study, plan):
    assert plan.problem() is None, plan.describe()
    assert plan.max_model_len == PROMPT + (4096 if study.startswith("async") else 1024) + gpu_memory.SLACK
    assert 1 <= plan.concurrent and plan.kv <= plan.sequences * plan.kv_per_sequence
    assert plan.total <= plan.gpu * (1 - gpu_memory.HEADROOM)
    assert 0.3 < plan.share < 0.95


def test_a_gpu_too_small_fails_naming_the_model_and_the_numbers():
    config = validate_config(yaml.safe_load((ROOT / "config/paper.yaml").read_text()))
    train = config["studies"]["async_math"]["train"]
    plan = gpu_memory.training_plan("qwen2.5-7b", shape("qwen2.5-7b"), train, 8, PROMPT, 40 * GIB)
    assert plan.problem().startswith("qwen2.5-7b: one 4504-token sequence needs 0.2 GiB of KV cache, but a 40.0 GiB")


@pytest.mark.parametrize("record", sorted(RECORDS.glob("step-phases-*-h200.json")), ids=lambda p: p.stem)
def test_training_memory_covers_the_update_peaks_measured_on_an_h200(record):
    """One process, no sharding: the states (16 + 2 bytes a parameter), a micro-batch's activations and the reserve
    are at least the update's measured peak, and over it by no more than the reserve and the 0.5B's activations."""
    measured = json.loads(record.read_text())
    settings, step = measured["settings"], measured["steps"][0]
    dims = standins.SHAPES[measured["shape"]]  # the stand-in that was measured
    found = Shape.of({**dims, "vocab_size": 151_936, "max_position_embeddings": 32_768})
    assert found.parameters == pytest.approx(measured["parameters"], rel=1e-3)
    tokens = (step["prompt_tokens"] + step["completion_tokens"]) / step["sequences"]  # ≈ 1,130 a sequence
    predicted = gpu_memory.training_bytes(found, 1, settings["micro_batch"], round(tokens)) / GIB
    peak = measured["peak_gib"]["update"]
    assert peak <= predicted <= peak + 3.0, (predicted, peak)


def test_the_longest_prompt_is_counted_in_the_chat_template():
    tokenizer = tiny.build_tokenizer()
    prompts = ["1 + 1?", "What is the sum of the first ten primes, written in words?"]
    counted = gpu_memory.longest_prompt(tokenizer, prompts)
    message = [{"role": "user", "content": prompts[1]}]
    templated = tokenizer.apply_chat_template(message, add_generation_prompt=True, return_dict=True)["input_ids"]
    assert counted == len(templated) > len(tokenizer(prompts[1])["input_ids"])
    assert gpu_memory.longest_prompt(tokenizer, prompts, chat_template=False) == len(tokenizer(prompts[1])["input_ids"])


def test_the_paper_scale_page_shows_the_plans_as_computed():
    """docs/paper-scale.md's plan table is memory_plans.plan_table's, line for line (80 GiB, 400-token prompts)."""
    from klstudy.run.memory_plans import plan_table

    config = validate_config(yaml.safe_load((ROOT / "config/paper.yaml").read_text()))
    table = plan_table(config, {model: shape(model) for model in config["models"]}, PROMPT, GPU / GIB)
    assert "\n".join(table) in (ROOT / "docs/paper-scale.md").read_text()
