"""The embedded base model: tokenizer round trip, Hugging Face loading, determinism, and its pass@1 window."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from klstudy.config import validate_config
from klstudy.data import rewards, staging
from klstudy.data.prompts import chat_prompt
from klstudy.train import models, tiny

ROOT = Path(__file__).resolve().parents[1]
SMALL = dict(hidden_size=64, num_layers=1, num_heads=2, intermediate_size=128, sft_steps=5, sft_batch=4)


@pytest.mark.parametrize(
    "text",
    [
        "What is 3 + 4?\nPlease reason step by step.",
        "  leading and trailing spaces  ",
        "tabs\tand\n\nblank lines",
        "\\boxed{\\frac{1}{2}} and {unbalanced",
        "unicode: π ≈ 3.14, naïve café, 数学, emoji 🙂",
    ],
)
def test_tokenizer_round_trips_every_byte(text):
    tokenizer = tiny.build_tokenizer()
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert len(ids) == len(text.encode("utf-8"))  # one token per byte: no merges


def test_chat_template_and_special_tokens():
    tokenizer = tiny.build_tokenizer()
    rendered = chat_prompt(tokenizer, "Hi")
    assert rendered == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    for token in tiny.SPECIAL_TOKENS:
        assert len(tokenizer(token, add_special_tokens=False)["input_ids"]) == 1
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"


def _build(path, records, **spec):
    spec = tiny.TinyModelSpec(**{**SMALL, **spec})
    tokenizer = tiny.build_tokenizer()
    model = tiny.build_model(spec, tokenizer)
    tiny.warm_start(model, tokenizer, records, spec, log=lambda message: None)
    tiny.save(model, tokenizer, path, spec, {})
    return model


def _records():
    from klstudy.data import procedural

    return procedural.arithmetic("w", 12, 0, ["add1"], "warmup")


def test_saved_model_loads_with_auto_classes_and_chat_template(tmp_path):
    model = _build(tmp_path / "m", _records())
    loaded, tokenizer = models.load(tmp_path / "m")
    assert type(loaded).__name__ == "Qwen2ForCausalLM"
    assert tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([[5, 6, 7, 8]])
    torch.testing.assert_close(loaded(ids).logits, model(ids).logits)
    assert loaded.config.hidden_size // loaded.config.num_attention_heads >= 32  # what vLLM's CPU kernels serve


def test_same_seed_same_weights_other_seed_other_weights(tmp_path):
    first = _build(tmp_path / "a", _records(), seed=3).state_dict()
    again = _build(tmp_path / "b", _records(), seed=3).state_dict()
    other = _build(tmp_path / "c", _records(), seed=4).state_dict()
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in first)


def _stage_configured_base_model(tmp_path, pinned: bool):
    """config.yaml's base model staged by the `base-model` stage as the workflow runs it (its pinned copy), or built
    afresh on this machine from the same spec and data; returns the config (defaults filled) and the model's build."""
    config = validate_config(yaml.safe_load((ROOT / "config.yaml").read_text()))  # defaults filled, as the workflow's
    model_spec = dict(config["models"]["tiny"])
    if not pinned:
        model_spec.pop("pinned")
    paths = []
    for name in model_spec["warm_start_data"]:
        paths.append(tmp_path / f"{name}.jsonl")
        staging.prepare(name, config["data"][name], paths[-1])
    subprocess.run(
        [sys.executable, "-m", "klstudy", "base-model", "--name", "tiny", "--settings", json.dumps(model_spec),
         "--warm-start-data", *map(str, paths), "--out", str(tmp_path / "tiny")],
        check=True, env={"PYTHONPATH": str(ROOT / "src"), "PATH": str(Path(sys.executable).parent)}, timeout=900,
    )  # fmt: skip
    return config, json.loads((tmp_path / "tiny" / "klstudy_build.json").read_text())


def _heldout_pass_at_1(config, model_dir, tmp_path) -> float:
    """Held-out pass@1 at T = 1 of the on-policy study's held-out questions, 4 samples each, at its token budget."""
    heldout_name = config["studies"]["onpolicy"]["heldout_data"]
    heldout = staging.prepare(heldout_name, config["data"][heldout_name], tmp_path / "heldout.jsonl")
    model, tokenizer = models.load(model_dir)
    samples, max_tokens = 4, config["studies"]["onpolicy"]["train"]["max_response_tokens"]
    prompts = [r["prompt"] for r in heldout] * samples
    completions = tiny.sample(model, tokenizer, prompts, max_tokens, temperature=1.0, seed=0)
    scores = [rewards.score(r, c) for r, c in zip(heldout * samples, completions, strict=True)]
    return sum(scores) / len(scores)


@pytest.mark.deep  # the deep tier: `make test-deep` (docs/testing.md)
def test_the_pinned_base_model_is_config_yamls_build_and_starts_rl_inside_the_pass_at_1_window(tmp_path):
    """config.yaml's base model is its pinned copy, checked by the stage against config.yaml's spec and warm-start data
    as they stand now (a change to either fails here until the copy is rebuilt with `klstudy pin-base-model`), and
    RL starts from a held-out pass@1 at T = 1 in [0.15, 0.6]."""
    config, build = _stage_configured_base_model(tmp_path, pinned=True)
    assert models.base_model_digest(tmp_path / "tiny") == config["models"]["tiny"]["pinned"]["sha256"]
    pass_at_1 = _heldout_pass_at_1(config, tmp_path / "tiny", tmp_path)
    print(f"held-out pass@1 at T=1: {pass_at_1:.3f}; build: {build}")
    assert 0.15 <= pass_at_1 <= 0.6


@pytest.mark.slow  # 145 s (the whole build of config.yaml's base model): `make test-all`, and after any change to it
def test_configured_base_model_built_afresh_starts_rl_inside_the_pass_at_1_window(tmp_path):
    """The base model of config.yaml built on this machine instead of staged from its pinned copy: held-out pass@1
    at T = 1 in [0.15, 0.6]. Whether it is the pinned copy to the bit depends on the CPU (docs/claims.md): printed,
    not asserted. Its build time is recorded in klstudy_build.json (and docs/data.md), not asserted."""
    config, build = _stage_configured_base_model(tmp_path, pinned=False)
    same = models.base_model_digest(tmp_path / "tiny") == config["models"]["tiny"]["pinned"]["sha256"]
    pass_at_1 = _heldout_pass_at_1(config, tmp_path / "tiny", tmp_path)
    print(f"held-out pass@1 at T=1: {pass_at_1:.3f}; the pinned copy to the bit: {same}; build: {build}")
    assert 0.15 <= pass_at_1 <= 0.6


def test_warm_start_file_missing_from_the_spec_is_a_clear_error(tmp_path):
    spec = {"source": "embedded", "warm_start_data": {"warm_math": 1}, "spec": {}}
    with pytest.raises(ValueError, match=r"warm_countdown.jsonl.*not named in its warm_start_data \['warm_math'\]"):
        models.build_base_model("tiny", spec, [tmp_path / "warm_countdown.jsonl"], tmp_path / "out")
