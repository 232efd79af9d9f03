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


def available_device() -> str:
    """Where a job that runs a model computes: the GPU when one is visible, else the CPU."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def load(path, device: str = "cpu"):
    """A saved model, in the dtype it was saved in, on ``device``, and its tokenizer: the Auto classes, as every
    downstream stage loads them."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype="auto", device_map=device)
    return model.eval(), AutoTokenizer.from_pretrained(path)


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
        revision=spec["revision"],
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


# ---------------------------------------------------------------------------------------------------- saved models
# What a training job saves (final/, snapshots) is read back by every later job (lm-eval, vLLM, Fig. 12). A save that
# wrote a tokenizer and no weights (Trainer.save_model under FSDP's SHARDED_STATE_DICT does exactly that) would be
# found only there, after the GPU-days of training: so a training job checks its own outputs before it says `ok`.

_SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}


class SavedModelError(RuntimeError):
    """A saved model is incomplete: no config, no weights, a missing or misshapen weight, or the wrong dtype."""


def config_dtype(model_dir: Path) -> str:
    """The dtype a model directory's config.json declares (``dtype``, or ``torch_dtype`` before transformers 5)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return str(config.get("dtype") or config.get("torch_dtype") or "float32").removeprefix("torch.")


def safetensors_header(path: Path) -> dict:
    """{tensor name: {"dtype", "shape"}} of one .safetensors file, read from its header (no weights loaded)."""
    with open(path, "rb") as handle:
        length = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(length))
    header.pop("__metadata__", None)
    return header


def saved_tensors(model_dir: Path) -> dict:
    """Every tensor of a saved model (single file or sharded with an index), from the headers."""
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (model_dir / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise SavedModelError(
            f"{model_dir}: no weights (neither model.safetensors nor model.safetensors.index.json); found "
            f"{sorted(p.name for p in model_dir.iterdir()) if model_dir.is_dir() else 'no directory'}"
        )
    tensors = {}
    for name in files:
        if not (model_dir / name).is_file():
            raise SavedModelError(f"{model_dir}: the index names weight file {name}, which is missing")
        tensors.update(safetensors_header(model_dir / name))
    return tensors


def check_saved_model(model_dir: Path, dtype: str, parameters: int | None = None) -> int:
    """Raise SavedModelError unless ``model_dir`` is a model that ``AutoModelForCausalLM.from_pretrained`` loads
    whole: config.json, and a weight of the right shape for every parameter of the architecture it declares, in
    ``dtype``, ``parameters`` in all (when given). Returns the parameter count. Reads headers only (cheap at 7B)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise SavedModelError(f"{model_dir}: no config.json")
    declared = config_dtype(model_dir)
    if declared != dtype:
        raise SavedModelError(f"{model_dir}: config.json says dtype {declared}, expected {dtype}")
    tensors = saved_tensors(model_dir)
    with torch.device("meta"):
        architecture = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    count = 0
    for name, parameter in architecture.named_parameters():  # tied weights appear once
        saved = tensors.get(name)
        if saved is None:
            raise SavedModelError(f"{model_dir}: weight {name} is missing ({len(tensors)} tensors saved)")
        if list(saved["shape"]) != list(parameter.shape):
            expected = list(parameter.shape)
            raise SavedModelError(f"{model_dir}: weight {name} has shape {saved['shape']}, expected {expected}")
        if _SAFETENSORS_DTYPES.get(saved["dtype"], saved["dtype"]) != dtype:
            raise SavedModelError(f"{model_dir}: weight {name} is {saved['dtype']}, expected {dtype}")
        count += parameter.numel()
    if parameters is not None and count != parameters:
        raise SavedModelError(f"{model_dir}: {count} parameters, expected {parameters} (the base model's)")
    return count
