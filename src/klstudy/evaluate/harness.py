"""Evaluation with lm-eval-harness: mean@k on klstudy's tasks (src/klstudy/evaluate/tasks), with lm-eval's hf backend
(on the GPU when there is one, else the CPU) or its vllm backend.

The task files are shipped in the package and loaded with ``include_path``; they read the staged
``results/data/*.jsonl`` (passed as lm-eval metadata), never the hub. The number of samples k, min_p and the
generation length come from the config: a small task file written next to the outputs includes the shipped
one and overrides them, so the shipped files stay the single definition of each task.
"""

from __future__ import annotations

import json
import math
import statistics
import tempfile
from pathlib import Path
from unittest import mock

import yaml

from klstudy.train import vllm_cpu

TASKS_DIR = Path(__file__).parent / "tasks"
BACKENDS = ("hf", "vllm")


def task_names() -> list[str]:
    return sorted(path.stem.removeprefix("klstudy_") for path in TASKS_DIR.glob("klstudy_*.yaml"))


def _override_task(task: str, k: int, min_p: float, max_tokens: int, temperature: float, directory: Path) -> str:
    """A task file that includes the shipped one with k repeats (all kept), min_p and max_gen_toks; temperature 0
    is greedy decoding (for checks that two backends generate the same text; the paper samples at 1)."""
    template = yaml.safe_load((TASKS_DIR / "_template_yaml").read_text().replace("!function", ""))
    name = f"klstudy_{task}_k{k}"
    sampling = {"do_sample": temperature > 0, "temperature": temperature}
    override = {
        "include": str(TASKS_DIR / f"klstudy_{task}.yaml"),
        "task": name,
        "repeats": k,
        "filter_list": [{"name": "all_repeats", "filter": [{"function": "take_first_k", "k": k}]}],
        "generation_kwargs": {**template["generation_kwargs"], **sampling, "min_p": min_p, "max_gen_toks": max_tokens},
    }
    (directory / f"{name}.yaml").write_text(yaml.safe_dump(override))
    return name


def hf_placement(device: str = "auto", dtype: str = "auto") -> dict:
    """Device and dtype of lm-eval's hf backend (config evaluation.hf). ``auto``: the GPU when one is visible, in the
    dtype the model was saved in (bf16 for the paper's models); on a CPU, float32 (what the vLLM comparison of
    tests/test_vllm.py uses, and faster than bf16 on most CPUs)."""
    from klstudy.train.models import available_device

    device = available_device() if device == "auto" else device
    if dtype == "auto" and device == "cpu":
        dtype = "float32"
    return {"device": device, "dtype": dtype}


def model_arguments(backend: str, model_dir: Path, settings: dict) -> str:
    """lm-eval's model_args for ``backend`` from its config section (evaluation.hf or evaluation.vllm)."""
    if backend == "hf":
        placement = {key: settings[key] for key in ("device", "dtype") if key in settings}
        parts = {"pretrained": model_dir, **hf_placement(**placement)}
    else:
        # config evaluation.vllm (its defaults in the schema) and the job's engine seed: never a per-request seed in
        # gen_kwargs, with which every repeat of a question would be identical.
        parts = {"pretrained": model_dir, **{key: value for key, value in settings.items() if value is not None}}
        if vllm_cpu.on_cpu():  # vLLM's CPU backend (vllm_cpu.py); a GPU engine is configured by the settings alone
            vllm_cpu.configure_environment()
            parts.update(vllm_cpu.ENGINE_ARGUMENTS)
    return ",".join(f"{key}={value}" for key, value in parts.items())


def _add_versions(results: dict) -> None:
    from importlib.metadata import version

    results.update({f"{name}_version": version(name) for name in ("lm_eval", "transformers", "torch")})
    if "vllm" in str(results.get("config", {}).get("model")):
        results["vllm_version"] = version("vllm")


def run(
    model_dir: Path,
    tasks: list[str],
    data_dir: Path,
    k: int = 32,
    min_p: float = 0.0,
    max_tokens: int = 1024,
    temperature: float = 1.0,
    chat_template: bool = True,
    backend: str = "hf",
    seed: int = 0,
    limit: int | None = None,
    batch_size: int = 64,
    backend_settings: dict | None = None,
) -> dict[str, dict]:
    """lm-eval's results for each task, in one lm-eval call (one model load; requests of all tasks batched together):
    {task: {'results': ..., 'samples': [...], 'mean_at_k': ..., 'stderr': ..., 'unread': ...}}. ``backend_settings``:
    the backend's config section (evaluation.hf: device, dtype; evaluation.vllm: the engine's arguments)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    if backend not in BACKENDS:
        raise ValueError(f"evaluation backend {backend!r} is not one of {BACKENDS}")
    if len(set(tasks)) != len(tasks) or not tasks:
        raise ValueError(f"evaluation tasks {tasks!r}: give each task once")
    with tempfile.TemporaryDirectory(prefix="klstudy-tasks-") as overrides:
        names = {task: _override_task(task, k, min_p, max_tokens, temperature, Path(overrides)) for task in tasks}
        # include_defaults=False: indexing lm-eval's thousands of built-in tasks costs ~11 s per job here.
        manager = TaskManager(
            include_path=[str(TASKS_DIR), overrides],
            include_defaults=False,
            metadata={"data_dir": str(data_dir), "limit": limit},
        )
        # lm-eval's environment report runs `pip list` through torch's collect_env (~2 s per job); the
        # environment is pinned by requirements.lock, so the results keep the versions that matter instead.
        with mock.patch("lm_eval.evaluator.add_env_info", _add_versions):
            output = lm_eval.simple_evaluate(
                model=backend,
                model_args=model_arguments(backend, model_dir, {**(backend_settings or {}), "seed": seed}),
                tasks=list(names.values()),
                task_manager=manager,
                apply_chat_template=chat_template,
                batch_size=batch_size,
                log_samples=True,
                random_seed=seed,
                numpy_random_seed=seed,
                torch_random_seed=seed,
            )
    return {task: _task_result(output, task, name, k) for task, name in names.items()}


def run_seeds(model_dir: Path, tasks: list[str], data_dir: Path, seeds: list[int], **settings) -> dict[str, dict]:
    """``run`` under each engine seed (evaluation.seeds), each task's results pooled (``pooled``); one seed: run's
    results as they are."""
    by_seed = [run(model_dir, tasks, data_dir, seed=seed, **settings) for seed in seeds]
    if len(seeds) == 1:
        return by_seed[0]
    return {task: pooled([results[task] for results in by_seed], seeds) for task in tasks}


def pooled(results: list[dict], seeds: list[int]) -> dict:
    """One task's results under several engine seeds as one: a question's score is the mean of its samples under
    every seed, mean_at_k and its stderr are taken over questions as lm-eval takes them (mean, sample std / √n), and
    per_seed keeps each seed's own mean_at_k, stderr and unread. Every sample record says its seed."""
    scores: dict = {}
    samples = []
    for result, seed in zip(results, seeds, strict=True):
        for sample in result["samples"]:
            scores.setdefault(sample["doc_id"], []).append(sample["mean_at_k"])
            samples.append({**sample, "engine_seed": seed})
    if any(len(each) != len(seeds) for each in scores.values()):
        raise ValueError(f"evaluation seeds {seeds}: not every question of {results[0]['task']} was scored under each")
    questions = [statistics.fmean(each) for each in scores.values()]
    stderr = statistics.stdev(questions) / math.sqrt(len(questions)) if len(questions) > 1 else None
    per_seed = [{"seed": seed, **{key: result[key] for key in ("mean_at_k", "stderr", "unread")}}
                for result, seed in zip(results, seeds, strict=True)]  # fmt: skip
    return {
        **results[0],
        "mean_at_k": statistics.fmean(questions),
        "stderr": stderr,
        "unread": statistics.fmean(result["unread"] for result in results),
        "per_seed": per_seed,
        "results": {str(seed): result["results"] for result, seed in zip(results, seeds, strict=True)},
        "samples": samples,
    }


def _task_result(output: dict, task: str, name: str, k: int) -> dict:
    """One task's part of lm-eval's output, JSON-safe."""
    metrics = output["results"][name]
    return {
        "task": task,
        "k": k,
        "mean_at_k": metrics["mean_at_k,all_repeats"],
        "stderr": metrics.get("mean_at_k_stderr,all_repeats"),
        "unread": metrics["unread_at_k,all_repeats"],  # the fraction of completions from which no answer was read
        "results": json.loads(json.dumps({name: metrics}, default=str)),
        "config": json.loads(json.dumps({name: output.get("configs", {}).get(name)}, default=str)),
        "backend": output["config"]["model"],  # as lm-eval records it
        "model_args": output["config"].get("model_args"),  # where and in which dtype it ran (device=cuda, dtype=...)
        "versions": {
            key: output.get(key)
            for key in ("lm_eval_version", "transformers_version", "torch_version", "vllm_version")
            if key in output
        },
        "samples": json.loads(json.dumps(output["samples"][name], default=str)),
    }
