"""Base models at paper scale: staged from the hub once, or failing at once with staging instructions."""

import huggingface_hub
import pytest

from klstudy import data, models, tiny


def test_unreachable_hub_fails_at_once_naming_the_model(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.invalid")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    # "At once": the reachability probe answers, huggingface_hub (which retries) is never called.
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: pytest.fail("snapshot_download called"))
    with pytest.raises(data.DataUnavailable, match=r"Qwen/Qwen2.5-7B.*huggingface-cli download Qwen/Qwen2.5-7B"):
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
    model, _ = tiny.load(tmp_path / "m")
    assert model.config.hidden_size == 64


def test_a_local_copy_without_weights_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(data.DataUnavailable, match="no config.json"):
        models.build_base_model(
            "q",
            {"source": "hub", "hub_id": "Qwen/Qwen2.5-7B", "local_dir": str(tmp_path / "empty")},
            [],
            tmp_path / "m",
        )
