"""Base models as local directories in Hugging Face format, so that no training or evaluation job downloads.

- ``source: embedded``: the tiny model of ``tiny.py``, built and warm-started here from staged datasets.
- ``source: hub``: a hub model (e.g. ``Qwen/Qwen2.5-7B``) downloaded once into the directory. When the hub
  cannot be reached the build fails at once, naming the model and how to stage it by hand.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from klstudy import data, tiny


def build_embedded(spec: dict, warm_start_records: list[dict], out: Path, log=print) -> dict:
    """Build, warm-start and save the tiny model; returns its build metadata."""
    model_spec = tiny.TinyModelSpec(**spec.get("spec", {}))
    tokenizer = tiny.build_tokenizer()
    model = tiny.build_model(model_spec, tokenizer)
    start = time.perf_counter()
    losses = tiny.warm_start(model, tokenizer, warm_start_records, model_spec, log=log)
    metadata = {
        "parameters": sum(p.numel() for p in model.parameters()),
        "warm_start_examples": len(warm_start_records),
        "warm_start_seconds": round(time.perf_counter() - start, 1),
        "final_loss": sum(losses[-20:]) / max(1, len(losses[-20:])),
    }
    tiny.save(model, tokenizer, out, model_spec, metadata)
    return metadata


def stage_hub_model(spec: dict, out: Path) -> None:
    """Download (or copy from ``local_dir``) a hub model into ``out``."""
    import huggingface_hub

    hub_id = spec["hub_id"]
    source = spec.get("local_dir")
    if source is None and os.environ.get("HF_HUB_OFFLINE") != "1" and not data.hub_reachable():
        raise data.DataUnavailable(
            f"cannot reach {data.hub_endpoint()} to download model {hub_id!r}. {data.staging_help(hub_id, 'model')}"
        )
    if source is not None:
        if not (Path(source) / "config.json").is_file():
            raise data.DataUnavailable(f"model {hub_id!r}: local_dir {source!r} has no config.json")
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(Path(source).resolve(), out)
        return
    huggingface_hub.snapshot_download(
        hub_id,
        revision=spec.get("revision", "main"),
        local_dir=out,
        allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken"],
    )


def build_base_model(name: str, spec: dict, warm_start_paths: list[Path], out: Path, log=print) -> None:
    out = Path(out)
    if spec["source"] == "hub":
        stage_hub_model(spec, out)
        log(f"model {name}: {spec['hub_id']} staged in {out}")
        return
    copies = spec["warm_start_data"]  # dataset name -> copies in the mixture
    unnamed = [str(path) for path in warm_start_paths if Path(path).stem not in copies]
    if unnamed:
        raise ValueError(
            f"model {name}: warm-start file(s) {unnamed} not named in its warm_start_data {sorted(copies)}"
        )
    records = [record for path in warm_start_paths for record in data.read_jsonl(path) * copies[Path(path).stem]]
    metadata = build_embedded(spec, records, out, log=log)
    log(f"model {name}: {json.dumps(metadata)}")
