"""The preflight's GPU rows: at the paper's scale, the GPU kind named and able to compute in bfloat16; each study's
colocated vLLM engine beside training, per model, on one GPU of cluster.gpu_model, planned by train/gpu_memory.py from
the model's staged config.json and the staged prompts (the estimate's assumed prompt length where the data are not
staged yet)."""

from __future__ import annotations

import functools
from pathlib import Path

from klstudy.config import train_gpus
from klstudy.run import estimate
from klstudy.run.check import FAIL, OK, SKIP, WARN, Check

# One GPU's memory (GiB, as nvidia-smi reports it) by the GRES names clusters give it; a name that covers two sizes
# (a100: 40 or 80 GB) is left out, and cluster.gpu_memory_gib says which.
KNOWN_GPUS = {
    "h100": 79.6, "h100_80gb": 79.6, "nvidia_h100_80gb_hbm3": 79.6, "h200": 140.4, "nvidia_h200": 140.4,
    "a100_80gb": 80.0, "a100-80gb": 80.0, "nvidia_a100-sxm4-80gb": 80.0, "a100_40gb": 40.0, "a100-40gb": 40.0,
    "nvidia_a100-sxm4-40gb": 40.0, "l40s": 44.4, "a40": 44.4, "a6000": 47.5, "l4": 22.0,
}  # fmt: skip


# GRES names of GPUs without bfloat16 (before Ampere), on which the paper's bf16 models cannot train as configured.
NO_BF16 = {"v100", "v100s", "v100_32gb", "v100-32gb", "tesla_v100-sxm2-32gb", "tesla_v100-sxm2-16gb", "p100", "t4",
           "tesla_t4", "rtx8000", "quadro_rtx_8000"}  # fmt: skip


def gpu_model_check(config: dict) -> Check | None:
    """At the paper's scale: the GPU kind is named (by GRES or by node feature), and it computes in bfloat16 (None: the
    embedded scale)."""
    if config["scale"] != "paper":
        return None
    model, constraint = config["cluster"].get("gpu_model"), config["cluster"].get("constraint")
    if not model and not constraint:
        unset = "cluster.gpu_model and cluster.constraint unset: a node of any GPUs would do (without bfloat16, 40 GB)"
        return Check("GPU model", FAIL, unset, "set cluster.gpu_model to the GRES name of the GPUs the plans assume "
                     "(sinfo -o %G), or cluster.constraint to their node feature (sinfo -o %f)")  # fmt: skip
    if not model:
        gib = config["cluster"].get("gpu_memory_gib")
        return Check("GPU model", OK, f"nodes with feature {constraint}" + (f", {gib:g} GiB" if gib else ""))
    if model.lower() in NO_BF16:
        return Check("GPU model", FAIL, f"{model} has no bfloat16, in which the paper's models train",
                     "an Ampere or later GPU (A100, H100, ...)")  # fmt: skip
    gib = gpu_memory_gib(config["cluster"])
    return Check("GPU model", OK, f"{model}, {gib:g} GiB" if gib else model)


def gpu_memory_gib(cluster: dict) -> float | None:
    """cluster.gpu_memory_gib, else gpu_model's size where KNOWN_GPUS has it, else None."""
    model = (cluster.get("gpu_model") or "").lower()
    return cluster.get("gpu_memory_gib") or KNOWN_GPUS.get(model)


def _model_dir(config: dict, root: Path, model: str) -> Path | None:
    """Where a model's config.json and tokenizer are before the run: staged, or its local copy."""
    staged, local = root / "results/models" / model, config["models"][model].get("local_dir")
    found = [path for path in (staged, Path(local) if local else None) if path and (path / "config.json").exists()]
    return found[0] if found else None


@functools.cache  # studies that share a model and data (onpolicy, unbiased) tokenize them once
def _longest_prompt(root: Path, model_dir: Path, datasets: tuple[str, ...]) -> tuple[int, str]:
    """The longest staged prompt of ``datasets`` in the model's chat template, and where it came from (the estimate's
    assumed length where a dataset is not staged yet)."""
    from transformers import AutoTokenizer

    from klstudy.data import staging
    from klstudy.train import gpu_memory

    paths = [root / f"results/data/{name}.jsonl" for name in datasets]
    if not all(path.exists() for path in paths):
        return estimate.PROMPT_TOKENS, f"prompts assumed {estimate.PROMPT_TOKENS} tokens (data not staged)"
    prompts = [record["prompt"] for path in paths for record in staging.read_jsonl(path)]
    longest = gpu_memory.longest_prompt(AutoTokenizer.from_pretrained(model_dir), prompts)
    return longest, f"longest prompt {longest} tokens"


def _vllm_cells(config: dict):
    """(study, its settings, model) of every study that generates with vLLM beside training."""
    for study, spec in config["studies"].items():
        yield from ((study, spec, model) for model in spec["models"] if spec["train"]["generation"] == "vllm")


def checks(config: dict, root: Path) -> list[Check]:
    """Each study's colocated vLLM engine (generation: vllm) beside training, per model, on one GPU of
    cluster.gpu_model: the plan of train/gpu_memory.py from the staged config.json and prompts."""
    from klstudy.train import gpu_memory

    gib = gpu_memory_gib(config["cluster"])
    checks = [row for row in [gpu_model_check(config)] if row]
    for study, spec, model in _vllm_cells(config):
        what, model_dir = f"GPU memory: {study} {model}", _model_dir(config, root, model)
        if model_dir is None:
            checks.append(Check(what, SKIP, "config.json not staged yet: `make stage CONFIG=…` first, then rerun"))
            continue
        prompt, source = _longest_prompt(root, model_dir, (spec["train_data"], spec["heldout_data"]))
        shape, gpu = gpu_memory.Shape.read(model_dir), int((gib or 80) * gpu_memory.GIB)
        plan = gpu_memory.training_plan(model, shape, spec["train"], train_gpus(config, study), prompt, gpu)
        if gib is None:
            checks.append(Check(what, WARN, f"GPU memory unknown; on 80 GiB: {plan.describe()}; {source}",
                                "set cluster.gpu_memory_gib (or a gpu_model that names one size)"))  # fmt: skip
        elif plan.problem():
            remedy = "a GPU with more memory, more GPUs a cell (studies.<study>.gpus), a smaller micro_batch or shorter"
            checks.append(Check(what, FAIL, f"{plan.problem()}; {source}", remedy + " responses"))
        else:
            checks.append(Check(what, OK, f"{plan.describe()}; {source}"))
    return checks


def plan_table(config: dict, shapes: dict, prompt_tokens: int, gib: float) -> list[str]:
    """docs/paper-scale.md's table: the plan of every study that generates with vLLM, per model, on a GPU of ``gib``
    GiB, from each model's Shape (``shapes``) and a prompt of ``prompt_tokens``."""
    from klstudy.train import gpu_memory

    gpu = int(gib * gpu_memory.GIB)
    lines = ["| study | model | `max_model_len` | vLLM share | weights (GiB) | KV cache (GiB) | sequences at once | "
             "training (GiB) | per GPU (GiB) |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for study, spec, model in _vllm_cells(config):
        plan = gpu_memory.training_plan(model, shapes[model], spec["train"], train_gpus(config, study), prompt_tokens,
                                        gpu)  # fmt: skip
        lines.append(
            f"| `{study}` | {model} | {plan.max_model_len} | {plan.share:.2f} | {gpu_memory.gib(plan.weights)} | "
            f"{gpu_memory.gib(plan.kv)} | {min(plan.concurrent, plan.sequences)} of {plan.sequences} | "
            f"{gpu_memory.gib(plan.training)} | {gpu_memory.gib(plan.total)} ({plan.total / gpu:.0%}) |"
        )
    return lines
