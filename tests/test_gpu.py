"""The GPU suite (`make test-gpu`, marker `gpu`): the paper's scale on one GPU, every stage through the `klstudy`
commands that the workflow's rules run, on a stand-in of Qwen2.5-0.5B (standins.py: its shape and 151,936-token
vocabulary, random bf16 weights built here, no hub). Snakemake's part is tested on CPUs; this suite needs only the
package's own Python dependencies.

- Three cells under `accelerate launch --config_file config/accelerate/fsdp.yaml --num_processes 1` (FSDP2, bf16,
  transformers' generation): on-policy K1 in the reward and the loss, K1 in the loss with 4 updates per batch, and K3
  in the loss asynchronous (level 2), each with micro-batches (gradient accumulation).
- A cell killed (SIGKILL) after step 3 and run again: it resumes from its FSDP checkpoint of step 2.
- A slice boundary (train/slices.py): the asynchronous cell, warned of its job's end as SLURM warns it, saves an FSDP
  checkpoint after step 1 and stops, leaving the slice mark; the next slice resumes from it and finishes the cell.
- The training jobs run two rounds at a time, sharing the GPU (about 10 GiB each at this shape): the first attempts
  together, then the two resumptions, so that the suite fits the minutes a lent GPU gives. Their tokens/s are
  therefore those of a shared GPU (benchmarks/step_phases.py measures one job alone).
- lm-eval's hf backend on the GPU (`klstudy evaluate`), Fig. 12 on the GPU (`klstudy divergence`).

It asserts that every final/ and snapshot loads in bf16, one metrics line per step (the first with the reference's
first-step agreement, reference.py), the resume, and prints generated
tokens/s, trained tokens/s and peak GPU memory per cell (docs/paper-scale.md); with
KLSTUDY_GPU_SUITE_REPORT=FILE it also writes them there as JSON. Without a CUDA device it is skipped, saying so;
KLSTUDY_GPU_SUITE_ON_CPU=1 rehearses it on a CPU at the embedded model's shape: every command and assertion except
those of the GPU itself (accelerate runs the FSDP launch config without FSDP on a CPU).
"""

import json
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from workflow_helpers import ROOT, validated_cell

from klstudy import config
from klstudy.config import CHECKPOINT_COMPLETE
from klstudy.data import staging
from klstudy.train import models, slices, standins

pytestmark = pytest.mark.gpu
CUDA = torch.cuda.is_available()
if not CUDA and os.environ.get("KLSTUDY_GPU_SUITE_ON_CPU") != "1":
    pytest.skip(
        "no CUDA device found: the GPU suite runs with `make test-gpu` on a machine with one "
        "(KLSTUDY_GPU_SUITE_ON_CPU=1 rehearses it on a CPU)",
        allow_module_level=True,
    )
SHAPE = os.environ.get("KLSTUDY_GPU_SUITE_SHAPE", "qwen2.5-0.5b" if CUDA else "tiny")
FSDP = "config/accelerate/fsdp.yaml"
REPORT: dict = {"device": torch.cuda.get_device_name() if CUDA else "cpu", "shape": SHAPE, "cells": {}}

# The embedded study's procedural datasets (config.yaml's entries), staged with `klstudy prepare-data`.
DATASETS = {
    "math_train": {"kind": "arithmetic", "levels": ["add1w", "sub1w"], "size": 64, "seed": 0, "split": "train"},
    "math_test": {"kind": "arithmetic", "levels": ["add1w", "sub1w"], "size": 16, "seed": 0, "split": "heldout"},
    "math500": {"kind": "arithmetic", "levels": ["add1w", "sub1w"], "size": 16, "seed": 1, "split": "heldout"},
    "mmlu_college_biology": {"kind": "mc_next", "size": 16, "seed": 0, "split": "heldout"},
}
# 8 prompts × 4 rollouts × 32 tokens per batch, micro-batches of 16; a learning rate at which random weights move
# visibly (Fig. 12's KL after 2 steps must be > 0 in bf16), not the paper's 1e-6. Responses are short because
# transformers' generation takes about 80 ms per token whatever the batch (an H200, docs/record/gpu.md): at 128 tokens
# the suite outran the 15 minutes a GPU is lent for; what it checks (FSDP, saves, resume, the backends) is the same.
TRAIN = dict(steps=4, batch_prompts=8, minibatch_prompts=8, micro_batch=16, rollouts=4, learning_rate=1e-4,
             max_response_tokens=32, eval_every=2, heldout_samples=1, checkpoint_every=2, delete_checkpoints=False,
             gradient_checkpointing=False, accelerate_config=FSDP)  # fmt: skip
# Random weights earn no task reward: K1 in the loss (gradient β·∇log π whatever the rewards) is what moves the cells
# whose policy must change (Fig. 12 needs a KL > 0); the reward placement is exercised by k1-both.
CELLS = {
    "onpolicy": dict(kl="k1-both", train=TRAIN),
    "four_updates": dict(kl="k1-loss", train={**TRAIN, "steps": 3, "minibatch_prompts": 2, "micro_batch": 8}),
    "async": dict(kl="k3-loss", train={**TRAIN, "async_level": 2, "advantage": "mean", "loss_type": "dr_grpo"}),
}
KILLED = dict(kl="k1-loss", train=TRAIN, snapshot_steps=[2, 4])  # killed after step 3; Fig. 12 reads its snapshots
KILL_AT = 3
SLICED = "async"  # the cell run in two slices: SLURM's warning (slices.py) during step 1 stops it after that step
SLICE_END = {"KLSTUDY_WARN_AT_STEP": "1"}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _command(*args, env=None, launch=False) -> tuple[list[str], dict]:
    """A `klstudy` command as a rule runs it; ``launch``: under `accelerate launch`, FSDP config, one process, on a
    port of its own (jobs run side by side)."""
    command = [sys.executable, "-m", "klstudy", *args]
    if launch:
        accelerate = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ROOT / FSDP)]
        command = [*accelerate, "--num_processes", "1", "--main_process_port", str(_free_port()), "-m", "klstudy",
                   *args]  # fmt: skip
    # src first, then whatever PYTHONPATH already holds (on a machine without a registry: the carried wheels).
    python_path = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
    return command, {**os.environ, "PYTHONPATH": python_path, **(env or {})}


def _klstudy(*args, env=None, launch=False, timeout=600) -> subprocess.CompletedProcess:
    command, environment = _command(*args, env=env, launch=launch)
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=environment)


def _side_by_side(jobs: dict[str, tuple[list, dict]], timeout=600) -> dict[str, tuple]:
    """Runs the jobs at once; for each, its CompletedProcess and its seconds."""
    start = time.perf_counter()
    running = {name: subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for name, (command, env) in jobs.items()}  # fmt: skip
    done = {}
    for name, process in running.items():
        stdout, stderr = process.communicate(timeout=timeout)
        done[name] = (subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr),
                      time.perf_counter() - start)  # fmt: skip
    return done


def _check(run: subprocess.CompletedProcess) -> str:
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    return run.stdout + run.stderr


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """The stand-in base model (bf16) and the staged datasets."""
    path = tmp_path_factory.mktemp("gpu")
    start = time.perf_counter()
    parameters = standins.build(SHAPE, path / "models" / SHAPE, device="cuda" if CUDA else "cpu")
    REPORT.update(parameters=parameters, build_seconds=round(time.perf_counter() - start, 1))
    for name, settings in DATASETS.items():
        settings = config.dataset_settings(name, settings)  # the schema's defaults filled, as the workflow's are
        _check(_klstudy("prepare-data", "--name", name, "--settings", json.dumps(settings),
                        "--out", str(path / "data" / f"{name}.jsonl")))  # fmt: skip
    return path


def _train(workdir, name: str, spec: dict, env=None, extra=()) -> tuple[list[str], dict]:
    cell = validated_cell(spec["train"], study=name, kl=spec["kl"], beta=0.1,
                          snapshot_steps=spec.get("snapshot_steps", ()))  # fmt: skip
    args = ["train", "--settings", json.dumps(cell), "--model", str(workdir / "models" / SHAPE),
            "--train-data", str(workdir / "data/math_train.jsonl"),
            "--heldout-data", str(workdir / "data/math_test.jsonl"),
            "--out", str(workdir / "runs" / name), "--checkpoints", str(workdir / "checkpoints" / name),
            "--tracking-dir", str(workdir / "tracking"), *extra]  # fmt: skip
    return _command(*args, env=env, launch=True)


def _throughput(name: str, spec: dict, rows: list[dict], seconds: float, sharing: int) -> dict:
    """Generated tokens/s (generation and scoring of each batch), trained completion tokens/s (the optimiser steps'
    forward and backward passes: TRL's step_time less generation_time), peak GPU memory of any step: from the cell's
    metrics.jsonl."""
    train = spec["train"]
    generated = [(train["batch_prompts"] * train["rollouts"] * r["response_length"], r["generation_time"])
                 for r in rows if "generation_time" in r]  # fmt: skip
    per_update = generated[0][0] * train["minibatch_prompts"] / train["batch_prompts"]  # the first batch's tokens
    numbers = {
        "job_seconds": round(seconds, 1),
        "generated_tokens_per_s": round(sum(t for t, _ in generated) / sum(s for _, s in generated), 1),
        "trained_tokens_per_s": round(
            per_update * len(rows) / (sum(r["step_time"] for r in rows) - sum(s for _, s in generated)), 1
        ),  # fmt: skip
        "peak_gpu_memory_gib": max((r.get("peak_memory_gib", 0.0) for r in rows), default=0.0),
        "jobs_sharing_the_gpu": sharing,
        # the first-step agreement of policy and reference (reference.py), in the launcher's bf16: its bound is 0.1
        "reference_logp_gap": next((r["reference_logp_gap"] for r in rows if "reference_logp_gap" in r), None),
    }
    REPORT["cells"][name] = numbers
    print(f"\n{SHAPE} {name}: {json.dumps(numbers)}", flush=True)
    return numbers


def _assert_loads_in_bf16(model_dir: Path, parameters: int) -> None:
    from transformers import AutoModelForCausalLM

    assert models.check_saved_model(model_dir, "bfloat16", parameters=parameters) == parameters
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
    assert model.dtype == torch.bfloat16 and sum(p.numel() for p in model.parameters()) == parameters


@pytest.fixture(scope="module")
def rounds(workdir):
    """Every training job, in two rounds of jobs side by side: the three cells (the sliced one's first slice) and the
    killed cell (SIGKILL after step 3: nothing flushed, as SLURM's time limit or the OOM killer end a job); then the
    next slice and the rerun that resumes the killed cell. Each: its CompletedProcess, seconds and metrics."""
    first = {name: _train(workdir, name, spec) for name, spec in CELLS.items() if name != SLICED}
    first[SLICED] = _train(workdir, SLICED, CELLS[SLICED], env=SLICE_END)
    first["killed"] = _train(workdir, "killed", KILLED, env={"KLSTUDY_KILL_AT_STEP": str(KILL_AT)})
    ran = {"first": _side_by_side(first)}
    ran["before"] = staging.read_jsonl(workdir / "runs" / "killed" / "metrics.jsonl")  # as the kill left them
    mark = workdir / "checkpoints" / SLICED / slices.SLICE_ENDED
    ran["mark"] = json.loads(mark.read_text()) if mark.exists() else None
    ran["slice_checkpoint"] = sorted(str(p.relative_to(mark.parent)) for p in mark.parent.glob("checkpoint-*/*"))
    ran["second"] = _side_by_side({SLICED: _train(workdir, SLICED, CELLS[SLICED]),
                                   "killed": _train(workdir, "killed", KILLED)})  # fmt: skip
    for name, spec in CELLS.items():
        run, seconds = ran["second" if name == SLICED else "first"][name]
        if run.returncode == 0:
            rows = staging.read_jsonl(workdir / "runs" / name / "metrics.jsonl")
            _throughput(name, spec, rows, seconds, sharing=len(ran["first"]))
    return ran


@pytest.fixture(scope="module")
def trained(workdir, rounds):
    """The three cells, each ended with exit 0 (the sliced one in its second slice)."""
    for name in CELLS:
        _check(rounds["second" if name == SLICED else "first"][name][0])
    return workdir


@pytest.mark.parametrize("name", CELLS)
def test_cells_train_under_fsdp_with_one_metrics_line_per_step(trained, name):
    cell = trained / "runs" / name
    summary = json.loads((cell / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["processes"] == 1
    steps = CELLS[name]["train"]["steps"]
    rows = staging.read_jsonl(cell / "metrics.jsonl")
    updates = CELLS[name]["train"]["batch_prompts"] // CELLS[name]["train"]["minibatch_prompts"]
    assert [row["optimizer_step"] for row in rows] == list(range(1, steps * updates + 1))
    assert sorted({row["step"] for row in rows}) == list(range(1, steps + 1))
    assert all(row["response_length"] > 0 for row in rows if "response_length" in row)
    assert all(math.isfinite(row["grad_norm"]) and math.isfinite(row["loss"]) for row in rows)
    assert "reference_logp_gap" in rows[0] and all("reference_logp_gap" not in row for row in rows[1:])
    if CELLS[name]["kl"] in ("k1-loss", "k1-both"):
        assert all(row["grad_norm"] > 0 for row in rows)
    if CUDA:
        assert all(row["peak_memory_gib"] > 0 for row in rows)
        checkpoint = trained / "checkpoints" / name / f"checkpoint-{2 * updates}"
        assert (checkpoint / "pytorch_model_fsdp_0").is_dir(), "the launch config's FSDP did not shard the model"
    assert [row["step"] for row in staging.read_jsonl(cell / "heldout.jsonl")] == list(range(0, steps + 1, 2))
    _assert_loads_in_bf16(cell / "final", REPORT["parameters"])


@pytest.fixture(scope="module")
def killed_and_resumed(workdir, rounds):
    """The killed cell, its metrics as the kill left them, and the log of the rerun that resumed it."""
    killed = rounds["first"]["killed"][0]
    assert killed.returncode != 0, "the job killed at step 3 should have failed"
    log = _check(rounds["second"]["killed"][0])
    rows = staging.read_jsonl(workdir / "runs" / "killed" / "metrics.jsonl")
    _throughput("killed_resumed", KILLED, rows[2:], rounds["second"]["killed"][1], sharing=2)  # the resumed steps
    return workdir, rounds["before"], log


def test_a_cell_stopped_before_its_jobs_end_saves_under_fsdp_and_goes_on_in_its_next_slice(trained, rounds):
    first, _ = rounds["first"][SLICED]
    log = _check(first)
    assert "unfinished after 1 steps" in log, log[-3000:]
    assert rounds["mark"] is not None and rounds["mark"]["step"] == 1
    checkpoints = trained / "checkpoints" / SLICED
    updates = CELLS[SLICED]["train"]["batch_prompts"] // CELLS[SLICED]["train"]["minibatch_prompts"]
    saved = rounds["slice_checkpoint"]  # what the first slice left (the next one's later checkpoints rotate it out)
    assert f"checkpoint-{updates}/{CHECKPOINT_COMPLETE}" in saved, saved
    if CUDA:
        assert f"checkpoint-{updates}/pytorch_model_fsdp_0" in saved, saved
    assert not (checkpoints / slices.SLICE_ENDED).exists()  # the next slice cleared the mark
    summary = json.loads((trained / "runs" / SLICED / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["resumed_from"].endswith(f"checkpoint-{updates}")
    REPORT["slice"] = {"step": rounds["mark"]["step"]}


def test_a_killed_fsdp_run_resumes_from_its_checkpoint(killed_and_resumed):
    workdir, before, log = killed_and_resumed
    cell = workdir / "runs" / "killed"
    assert [row["step"] for row in before] == [1, 2, 3]  # killed after writing step 3's line
    summary = json.loads((cell / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["resumed_from"].endswith("checkpoint-2")
    rows = staging.read_jsonl(cell / "metrics.jsonl")
    assert [row["step"] for row in rows] == [1, 2, 3, 4]  # step 3 once: the killed attempt's line was dropped
    assert rows[:2] == before[:2]  # restored from the checkpoint, not recomputed
    assert "step 3/4" in log and "step 1/4" not in log  # the second attempt trained steps 3 and 4 only
    for saved in (cell / "final", cell / "snapshots" / "step~2", cell / "snapshots" / "step~4"):
        _assert_loads_in_bf16(saved, REPORT["parameters"])


def test_lm_eval_hf_backend_runs_on_the_gpu(trained):
    settings = {"tasks": ["math500", "mmlu_college_biology"], "studies": {}, "k": 2, "min_p": 0.0, "max_tokens": 32,
                "backend": "hf", "batch_size": 16, "limit": 8, "jobs": "per_model", "base_without_chat_template": False,
                "hf": {"device": "auto", "dtype": "auto"}, "vllm": {}, "in_domain": ["math500"]}  # fmt: skip
    outs = [trained / "evals" / f"{task}.json" for task in settings["tasks"]]
    start = time.perf_counter()
    _check(_klstudy("evaluate", "--model", str(trained / "runs/onpolicy/final"), "--task", *settings["tasks"],
                    "--data-dir", str(trained / "data"), "--settings", json.dumps(settings), "--out", *map(str, outs),
                    "--samples", *(str(out.with_suffix(".samples.jsonl")) for out in outs)))  # fmt: skip
    REPORT["evaluate_seconds"] = round(time.perf_counter() - start, 1)
    for out in outs:
        result = json.loads(out.read_text())
        assert 0 <= result["mean_at_k"] <= 1 and len(staging.read_jsonl(out.with_suffix(".samples.jsonl"))) == 8
        expected = "device=cuda,dtype=auto" if CUDA else "device=cpu,dtype=float32"
        assert expected in result["model_args"]
    print(f"\nlm-eval hf backend, 2 tasks × 8 questions × k = 2: {REPORT['evaluate_seconds']} s", flush=True)


def test_fig12_runs_on_the_gpu_within_its_memory_budget(killed_and_resumed):
    workdir = killed_and_resumed[0]
    settings = {"steps": [0, 2, 4], "prompts": 8, "samples": 2, "max_tokens": 32, "batch_prompts": 4,
                "logits_memory_mb": 256}  # fmt: skip
    out = workdir / "divergence.csv"
    start = time.perf_counter()
    log = _check(_klstudy("divergence", "--reference", str(workdir / "models" / SHAPE), "--snapshots",
                          str(workdir / "runs/killed/snapshots"), "--data", str(workdir / "data/math_test.jsonl"),
                          "--settings", json.dumps(settings), "--seed", "0", "--out", str(out)))  # fmt: skip
    REPORT["divergence_seconds"] = round(time.perf_counter() - start, 1)
    import pandas as pd

    table = pd.read_csv(out)
    assert list(table.step) == [0, 2, 4] and table.forward_kl[0] == 0 and (table.forward_kl[1:] > 0).all()
    assert (table.entropy > 0).all()
    print(f"\nFig. 12, 3 policies × 8 prompts × 2 samples × 32 tokens: {REPORT['divergence_seconds']} s\n{log[-600:]}")


def test_report(workdir):
    """The suite's numbers, last: printed, and written to KLSTUDY_GPU_SUITE_REPORT when it is set."""
    print("\nGPU suite report: " + json.dumps(REPORT, indent=1), flush=True)
    if os.environ.get("KLSTUDY_GPU_SUITE_REPORT"):
        Path(os.environ["KLSTUDY_GPU_SUITE_REPORT"]).write_text(json.dumps(REPORT, indent=1) + "\n")
