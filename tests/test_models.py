"""Base models at paper scale: staged from the hub once, or failing at once with staging instructions."""

import huggingface_hub
import pytest

from klstudy.data import staging
from klstudy.train import models, tiny


def test_unreachable_hub_fails_at_once_naming_the_model(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.invalid")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    # "At once": the reachability probe answers, huggingface_hub (which retries) is never called.
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: pytest.fail("snapshot_download called"))
    with pytest.raises(staging.DataUnavailable, match=r"Qwen/Qwen2.5-7B.*hf download Qwen/Qwen2.5-7B --local-dir"):
        models.build_base_model("qwen", {"source": "hub", "hub_id": "Qwen/Qwen2.5-7B"}, [], tmp_path / "m")
    assert not (tmp_path / "m").exists()


def test_a_local_copy_is_used_without_the_network(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.invalid")
    tokenizer = tiny.build_tokenizer()
    spec = tiny.TinyModelSpec(hidden_size=64, num_heads=2, num_layers=1, intermediate_size=64)
    tiny.save(tiny.build_model(spec, tokenizer), tokenizer, tmp_path / "copy", spec, {})
    models.build_base_model(
        "qwen", {"source": "hub", "hub_id": "Qwen/Qwen2.5-7B", "local_dir": str(tmp_path / "copy")}, [], tmp_path / "m"
    )
    model, _ = models.load(tmp_path / "m")
    assert model.config.hidden_size == 64
    # the staged copy records its weights' digest, which is the source's: the same model, to the bit
    assert (tmp_path / "m" / models.WEIGHTS_RECORD).is_file()
    assert models.base_model_digest(tmp_path / "m") == models.weights_digest(tmp_path / "copy")


def test_the_weights_digest_tells_models_apart_by_one_bit(tmp_path):
    """The embedded warm start builds another model on another CPU (docs/claims.md): runs record which one."""
    import torch

    tokenizer = tiny.build_tokenizer()
    spec = tiny.TinyModelSpec(hidden_size=64, num_heads=2, num_layers=1, intermediate_size=64)
    model = tiny.build_model(spec, tokenizer)
    tiny.save(model, tokenizer, tmp_path / "a", spec, {})
    tiny.save(model, tokenizer, tmp_path / "again", spec, {"another": "build record"})  # metadata is not weights
    assert models.weights_digest(tmp_path / "a") == models.weights_digest(tmp_path / "again")
    with torch.no_grad():  # one weight moved by one unit in the last place
        weight = model.model.layers[0].mlp.up_proj.weight
        weight[0, 0] = torch.nextafter(weight[0, 0], torch.tensor(1.0))
    tiny.save(model, tokenizer, tmp_path / "b", spec, {})
    assert models.weights_digest(tmp_path / "b") != models.weights_digest(tmp_path / "a")
    # sharded: every shard is read (a change in the last shard changes the digest)
    model.save_pretrained(tmp_path / "sharded", max_shard_size="100KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    last = models.weight_files(tmp_path / "sharded")[-1]
    before = models.weights_digest(tmp_path / "sharded")
    last.write_bytes(last.read_bytes()[:-1] + bytes([last.read_bytes()[-1] ^ 1]))
    assert models.weights_digest(tmp_path / "sharded") != before
    # recorded at staging, read back without reading the weights again; computed where none was recorded
    assert models.base_model_digest(tmp_path / "a") == models.weights_digest(tmp_path / "a")
    assert models.record_weights_digest(tmp_path / "a") == models.base_model_digest(tmp_path / "a")


def test_a_local_copy_without_weights_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(staging.DataUnavailable, match="no config.json"):
        models.build_base_model(
            "q",
            {"source": "hub", "hub_id": "Qwen/Qwen2.5-7B", "local_dir": str(tmp_path / "empty")},
            [],
            tmp_path / "m",
        )


# ------------------------------------------------------------------ the guard a training job runs on what it saved


def _saved_tiny(path, dtype="float32", **spec):
    import torch

    tokenizer = tiny.build_tokenizer()
    spec = tiny.TinyModelSpec(**{"hidden_size": 64, "num_heads": 2, "num_layers": 1, "intermediate_size": 64, **spec})
    model = tiny.build_model(spec, tokenizer).to(getattr(torch, dtype))
    model.config.dtype = dtype
    tiny.save(model, tokenizer, path, spec, {})
    return path


def test_a_whole_saved_model_passes_and_counts_its_parameters(tmp_path):
    path = _saved_tiny(tmp_path / "m")
    model, _ = models.load(path)
    assert models.check_saved_model(path, "float32") == sum(p.numel() for p in model.parameters())
    bf16 = _saved_tiny(tmp_path / "b", dtype="bfloat16")
    assert models.config_dtype(bf16) == "bfloat16"
    assert models.check_saved_model(bf16, "bfloat16") == models.check_saved_model(path, "float32")


def test_the_guard_names_what_a_broken_save_lacks(tmp_path):
    import shutil

    whole = _saved_tiny(tmp_path / "whole")
    parameters = models.check_saved_model(whole, "float32")

    tokenizer_only = tmp_path / "tokenizer_only"  # what Trainer.save_model wrote under FSDP's SHARDED_STATE_DICT
    tiny.build_tokenizer().save_pretrained(tokenizer_only)
    with pytest.raises(models.SavedModelError, match="no config.json"):
        models.check_saved_model(tokenizer_only, "float32")
    shutil.copy(whole / "config.json", tokenizer_only)
    with pytest.raises(models.SavedModelError, match="no weights"):
        models.check_saved_model(tokenizer_only, "float32")

    with pytest.raises(models.SavedModelError, match="dtype float32, expected bfloat16"):
        models.check_saved_model(whole, "bfloat16")
    with pytest.raises(models.SavedModelError, match="expected 999"):
        models.check_saved_model(whole, "float32", parameters=999)
    bigger = _saved_tiny(tmp_path / "bigger", num_layers=2)
    with pytest.raises(models.SavedModelError, match=f"expected {parameters}"):
        models.check_saved_model(bigger, "float32", parameters=parameters)

    truncated = tmp_path / "truncated"  # a weight missing from the file
    shutil.copytree(whole, truncated)
    from safetensors.torch import load_file, save_file

    weights = load_file(truncated / "model.safetensors")
    del weights[next(name for name in weights if "mlp" in name)]
    save_file(weights, truncated / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(models.SavedModelError, match="mlp.*is missing"):
        models.check_saved_model(truncated, "float32")
    reshaped = _saved_tiny(tmp_path / "reshaped", hidden_size=64)
    config = (reshaped / "config.json").read_text().replace('"intermediate_size": 64', '"intermediate_size": 128')
    (reshaped / "config.json").write_text(config)
    with pytest.raises(models.SavedModelError, match="has shape"):
        models.check_saved_model(reshaped, "float32")


# ------------------------------------------------------------------------------------------- pinned embedded models
SMALL_SPEC = dict(hidden_size=64, num_layers=1, num_heads=2, intermediate_size=64, sft_steps=3, sft_batch=4)


def _warm_start_file(tmp_path):
    path = tmp_path / "warm_math.jsonl"
    from klstudy.config import dataset_settings

    entry = {"kind": "arithmetic", "levels": ["add1"], "size": 8, "seed": 0, "split": "warmup"}
    staging.prepare("warm_math", dataset_settings("warm_math", entry), path)
    return path


def _pinned_build(tmp_path):
    """A small embedded model built as base_model builds one, and the config entry that pins it."""
    warm = _warm_start_file(tmp_path)
    spec = {"source": "embedded", "warm_start_data": {"warm_math": 1}, "spec": SMALL_SPEC}
    models.build_base_model("tiny", spec, [warm], tmp_path / "pinned")
    pinned = {"path": str(tmp_path / "pinned"), "sha256": models.base_model_digest(tmp_path / "pinned")}
    return {**spec, "pinned": pinned}, warm


def test_a_pinned_embedded_model_is_staged_as_built_not_built_again(tmp_path, monkeypatch):
    spec, warm = _pinned_build(tmp_path)
    monkeypatch.setattr(tiny, "warm_start", lambda *a, **k: pytest.fail("the warm start ran"))
    lines = []
    models.build_base_model("tiny", spec, [warm], tmp_path / "staged", log=lines.append)
    assert models.base_model_digest(tmp_path / "staged") == spec["pinned"]["sha256"]
    assert models.weights_digest(tmp_path / "staged") == spec["pinned"]["sha256"]
    assert "pinned copy of" in lines[0] and spec["pinned"]["sha256"] in lines[1]
    model, _ = models.load(tmp_path / "staged")
    assert model.config.hidden_size == 64


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda spec, _: spec["spec"].update(sft_steps=4), r"models\.tiny\.pinned:.*\(sft_steps: 3 there, 4 asked\)"),
        (lambda spec, warm: spec["spec"].pop("hidden_size"), r"hidden_size: 64 there, 128 asked"),  # a default
        (lambda spec, warm: warm.write_text(warm.read_text().replace("add", "sum", 1)), r"other data than"),
        (lambda spec, warm: spec["pinned"].update(sha256="0" * 64), r"have SHA-256 [0-9a-f]{64}, not the sha256"),
    ],
    ids=["another spec", "another default", "other warm-start data", "other weights"],
)
def test_a_pinned_copy_that_is_not_the_configured_build_is_refused(tmp_path, change, message):
    spec, warm = _pinned_build(tmp_path)
    spec = {**spec, "spec": dict(spec["spec"]), "pinned": dict(spec["pinned"])}
    change(spec, warm)
    with pytest.raises(ValueError, match=message):
        models.build_base_model("tiny", spec, [warm], tmp_path / "staged")


def test_a_pinned_path_without_a_build_is_a_config_error(tmp_path):
    import yaml

    from klstudy.config import REPO_ROOT, ConfigError, validate_config

    config = yaml.safe_load((REPO_ROOT / "config.yaml").read_text())
    config["models"]["tiny"]["pinned"] = {"path": str(tmp_path), "sha256": "0" * 64}
    with pytest.raises(ConfigError, match=r"models\.tiny\.pinned\.path.*no built model.*pin-base-model --model tiny"):
        validate_config(config)
    config["models"]["tiny"]["pinned"] = {"path": str(tmp_path), "sha256": "not hex"}
    with pytest.raises(ConfigError, match=r"models\.tiny\.pinned\.sha256"):
        validate_config(config)
