"""One cell of a study grid, end to end: `klstudy train` → KLTrainer → the cell's output directory.

Outputs (the Snakemake rule declares them):
    metrics.jsonl   one line per optimiser step: task reward, KL (K1 and K3), entropy, loss, grad norm, ...
    heldout.jsonl   pass@1 on the held-out set every ``eval_every`` steps (and before the first step)
    summary.json    status: ok | collapsed | diverged, the reason, steps done, final numbers
    final/          the policy in Hugging Face format (vLLM and lm-eval load it)
    snapshots/      step~N/: the policy after step N, for the steps in the cell's ``snapshot_steps`` (Fig. 12)

Failures are data: a non-finite loss or an exploding KL ends the run as ``diverged``, a reward collapse
as ``collapsed``, with every output written, so the rest of the grid and the figures go on.
Checkpoints go to a directory outside the declared outputs (Snakemake deletes the outputs of a failed
job); a rerun after a kill resumes from the last one and, on CPU with a fixed seed, ends with the same
metrics as an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import random
import shutil
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import PartialState
from accelerate.utils import broadcast_object_list, gather_object
from transformers import PrinterCallback, TrainerCallback

from klstudy import kl
from klstudy.config import CHECKPOINT_COMPLETE, SAVE_TOTAL_LIMIT, batch_layout, checkpoints, training_settings
from klstudy.data import rewards, staging
from klstudy.progress import Progress
from klstudy.train import faults, gpu_memory, models, slices
from klstudy.train.tracking import Tracking, step_values
from klstudy.train.trainer import LOSS_TYPES, KLTrainer, KLTrainerConfig

# Columns of metrics.jsonl: our name -> the key TRL / Trainer logs it under.
METRIC_KEYS = {
    "task_reward": "task_reward",
    "reward_kl_penalty": "reward_kl_penalty",
    "kl_k1": "kl_k1",
    "kl_k3": "kl_k3",
    "entropy": "entropy",
    "loss": "loss",
    "grad_norm": "grad_norm",
    "response_length": "completions/mean_length",
    "clip_ratio": "clip_ratio/region_mean",
    "staleness": "staleness",
    "learning_rate": "learning_rate",
    "step_time": "step_time",  # TRL's: the whole optimiser step, generating its batch included where it does
    "generation_time": "generation_time",  # generating and scoring a batch (logged by the step that trains on it)
    "reference_logp_gap": "reference_logp_gap",  # step 1 only: the reference checked against the policy (reference.py)
    # |vLLM's log-prob − the trainer's| of the sampled tokens, mean over tokens: TRL logs it only with
    # vllm_importance_sampling on (config/pilot-7b.yaml's asynchronous math cell)
    "sampling_logp_difference": "sampling/sampling_logp_difference/mean",
}
# Columns that differ between two runs of the same cell (wall-clock time, memory): every other column of metrics.jsonl
# is a function of the cell's settings and seed (on a CPU; GPU kernels add their own noise).
MEASURED_COLUMNS = ("time", "step_time", "generation_time", "peak_memory_gib")


@dataclass
class HealthRules:
    """When a run stops early, and with which status (config: a study's ``health``, its defaults in the schema).

    Attributes:
        max_kl: ``diverged`` when the per-sequence K3 estimate of KL(π‖π_ref) exceeds this (nats).
        collapse_window: steps in the running mean of the task reward (0: no collapse rule).
        collapse_fraction: ``collapsed`` when that running mean falls below this fraction of its best value
            (once there are two windows of rewards, and only if the best was above ``collapse_min_best``).
        collapse_min_best: a best running reward below this is too small to call a fall from it a collapse.
    """

    max_kl: float
    collapse_window: int
    collapse_fraction: float
    collapse_min_best: float

    def verdict(self, history: list[dict]) -> tuple[str, str] | None:
        """(status, reason) if the run must stop after the last logged step, else None."""
        last = history[-1]
        if not all(math.isfinite(last.get(key, 0.0)) for key in ("loss", "grad_norm", "kl_k1", "kl_k3")):
            return "diverged", f"non-finite loss, gradient or KL at step {last['step']}"
        if last.get("kl_k3", 0.0) > self.max_kl:
            return "diverged", f"KL {last['kl_k3']:.3g} > max_kl {self.max_kl} at step {last['step']}"
        window = self.collapse_window
        # With several updates per generation batch, only the update that generated logs the batch's reward.
        rewards = [h["task_reward"] for h in history if "task_reward" in h]
        if window and len(rewards) >= 2 * window:
            means = [sum(rewards[i - window : i]) / window for i in range(window, len(rewards) + 1)]
            best = max(means)
            if best > self.collapse_min_best and means[-1] < self.collapse_fraction * best:
                return "collapsed", (
                    f"task reward (mean of {window} steps) fell to {means[-1]:.3f}, below "
                    f"{self.collapse_fraction} x its best {best:.3f}, at step {last['step']}"
                )
        return None


def reward_function(completions, **columns) -> list[float]:
    """TRL reward function: the verifiable reward of each completion (rewards.score), never raising."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    records = [{key: columns[key][i] for key in rewards.SCORING_FIELDS} for i in range(len(texts))]
    return [rewards.score(record, text) for record, text in zip(records, texts, strict=True)]


def to_dataset(records: list[dict]):
    """Conversational prompts (TRL applies the model's chat template) with every scoring field kept."""
    import datasets

    rows = [
        {
            "prompt": [{"role": "user", "content": r["prompt"]}],
            "answer": r["answer"],
            "reward": r["reward"],
            "numbers": r.get("numbers", []),
            "target": r.get("target", 0),
            "choices": r.get("choices", []),
        }
        for r in records
    ]
    return datasets.Dataset.from_list(rows)


def trainer_config(cell: dict, checkpoint_dir: Path, engine: dict | None = None) -> KLTrainerConfig:
    """KLTrainerConfig of a grid cell (the study's ``train`` settings plus the cell's KL, β and seed)."""
    train = cell["train"]
    rollouts = train["rollouts"]
    micro, accumulation = batch_layout(train, int(os.environ.get("WORLD_SIZE", "1")))
    updates = train["batch_prompts"] // train["minibatch_prompts"]
    spec = kl.KLSpec.from_name(cell["kl"], cell["beta"])
    return KLTrainerConfig(
        output_dir=str(checkpoint_dir),
        seed=cell["seed"],
        data_seed=cell["seed"],
        max_steps=train["steps"] * updates,
        learning_rate=train["learning_rate"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=train["weight_decay"],
        max_grad_norm=train["max_grad_norm"],
        gradient_checkpointing=train["gradient_checkpointing"],
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=accumulation,
        updates_per_batch=updates,
        num_generations=rollouts,
        max_completion_length=train["max_response_tokens"],
        temperature=train["temperature"],
        top_p=1.0,
        kl_estimator=spec.estimator,
        kl_placement=spec.placement,
        beta=spec.beta,
        advantage=train["advantage"],
        loss_type=LOSS_TYPES[train["loss_type"]],
        async_level=train["async_level"],
        policy_loss=train["policy_loss"],
        kl_loss_gradient=spec.loss_gradient,
        kl_clamp=train["k3_clamp"] if spec.estimator == "k3" else None,  # verl clamps its K3 (low_var_kl) only
        use_vllm=train["generation"] == "vllm",
        vllm_mode="colocate",
        vllm_importance_sampling_correction=train["vllm_importance_sampling"],
        **(engine or {}),  # gpu_memory.engine_settings: the colocated vLLM engine's length and memory share
        logging_steps=1,
        save_strategy="steps",
        save_steps=train["checkpoint_every"] * updates,
        # Two: Trainer deletes the older checkpoint before RunRecorder.on_save marks the newer one complete, so with
        # one, a job killed in between would restart from step 0 (docs/cost.md's disk table counts them).
        save_total_limit=SAVE_TOTAL_LIMIT,  # 2; a third exists while the next is written (run/estimate.py)
        report_to="none",
        use_cpu=not torch.cuda.is_available(),
        bf16=torch.cuda.is_available(),
        disable_tqdm=True,
        log_completions=False,
    )


class RunRecorder(TrainerCallback):
    """Writes metrics.jsonl, evaluates held-out pass@1, and stops the run when a health rule fires."""

    def __init__(
        self,
        out_dir: Path,
        heldout: list[dict],
        eval_every: int,
        samples: int,
        updates_per_batch: int,
        rules,
        seed: int,
        snapshot_steps: list[int] = (),
        snapshot_dir: Path | None = None,
        dtype: str = "float32",
        greedy: bool = False,
        snapshot_dtype: str | None = None,
    ):
        self.metrics_path = Path(out_dir) / "metrics.jsonl"
        self.greedy = greedy  # held-out pass@1 from greedy responses (train.heldout_decoding)
        self.heldout_path = Path(out_dir) / "heldout.jsonl"
        self.heldout, self.eval_every, self.samples, self.updates = heldout, eval_every, samples, updates_per_batch
        self.rules, self.seed = rules, seed
        self.snapshot_steps, self.snapshot_dir = set(snapshot_steps), snapshot_dir
        self.dtype = dtype  # of the models it saves: the base model's
        # Fig. 12's snapshots: in the base model's dtype too, unless divergence.snapshot_dtype says float32.
        self.snapshot_dtype = dtype if snapshot_dtype in (None, "base") else snapshot_dtype
        self.trainer = None
        self.tracking = None  # tracking.Tracking on the main process when train.report_to names trackers
        self.progress = None  # progress.Progress: a line per step in the job's log (main process)
        self.heldout_to_track: dict | None = None  # this step's held-out pass@1, sent to the trackers with its metrics
        self.history: list[dict] = []
        self.verdict: tuple[str, str] | None = None
        self.start = time.perf_counter()

    def resume_from(self, checkpoint: Path, step: int, write: bool = True) -> None:
        """Restore metrics.jsonl and heldout.jsonl from the checkpoint's copies (the cell's own may be gone:
        Snakemake deletes the outputs of a failed job), keeping the lines of steps <= ``step``; ``write``: the main
        process writes them, the others only read the history (every process's health verdict starts from it)."""
        for path in (self.metrics_path, self.heldout_path):
            source = next((p for p in (Path(checkpoint) / path.name, path) if p.exists()), None)
            lines = [line for line in (staging.read_jsonl(source) if source else []) if line["step"] <= step]
            if path == self.metrics_path:
                self.history = lines
            if write:
                staging.write_jsonl(lines, path)

    def on_save(self, args, state, control, **kwargs):
        """Copy the logs into the checkpoint just written, so that a resumed run finds them whatever happened
        to the cell's directory; then mark the checkpoint complete (last_complete_checkpoint)."""
        self.trainer.accelerator.wait_for_everyone()  # every process has written its part (shards, RNG state)
        checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if not state.is_world_process_zero or not checkpoint.is_dir():
            return
        for path in (self.metrics_path, self.heldout_path):
            if path.exists():
                shutil.copy2(path, checkpoint / path.name)
        (checkpoint / CHECKPOINT_COMPLETE).touch()
        if self.tracking:
            self.tracking.checkpoint(state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "loss" not in logs:
            return
        # step = the generation batch this update trained on (the paper's training step), 1-based.
        row = {"step": -(-state.global_step // self.updates), "optimizer_step": state.global_step}
        # TRL logs None for a metric with no value this step (reference_logp_gap after the first): no column
        row.update({name: float(logs[key]) for name, key in METRIC_KEYS.items() if logs.get(key) is not None})
        row["time"] = round(time.perf_counter() - self.start, 3)
        if torch.cuda.is_available():  # this process's peak since the last step: generation and update
            row["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
            torch.cuda.reset_peak_memory_stats()
        self.history.append(row)
        if state.is_world_process_zero:
            _append_jsonl(self.metrics_path, row)
            self._report(row)
        # The logged values are gathered over processes, so every process would reach the same verdict; taking the
        # main process's makes sure of it: a process that stopped alone would leave the others in a collective.
        self.verdict = broadcast_object_list([self.rules.verdict(self.history)])[0]
        if self.verdict:
            control.should_training_stop = True

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step == 0:  # a fresh run (run() removed any stale heldout.jsonl); a resumed one has it
            self._evaluate(0)

    def on_step_end(self, args, state, control, **kwargs):
        step = state.global_step // self.updates
        if state.global_step % self.updates == 0 and step % self.eval_every == 0:
            self._evaluate(step)
        if state.global_step % self.updates == 0 and step in self.snapshot_steps:
            save_policy(self.trainer, self.snapshot_dir / f"step~{step}", self.snapshot_dtype, keep_training=True)

    def _evaluate(self, step: int) -> None:
        if self.heldout:  # every process generates for its share of the prompts; the main process writes
            result = heldout_pass_at_1(self.trainer, self.heldout, self.seed + step, self.samples, greedy=self.greedy)
            if self.trainer.accelerator.is_main_process:
                _append_jsonl(self.heldout_path, {"step": step, **result})
                self.heldout_to_track = result
                if step == 0 and self.tracking:  # before any metrics row; later ones go with their step's row
                    self.tracking.log(step_values(None, result), step=0)
                    self.heldout_to_track = None

    def _report(self, row: dict) -> None:
        """The step's row to the trackers (with the held-out score evaluated at its end) and a line to the log."""
        if self.tracking:
            self.tracking.log(step_values(row, self.heldout_to_track), step=row["optimizer_step"])
        self.heldout_to_track = None
        if self.progress:
            shown = {key: row[key] for key in ("task_reward", "kl_k3") if key in row}
            self.progress.update(row["step"], **shown)


def heldout_subset(records: list[dict], prompts: int | None) -> list[dict]:
    """The held-out prompts scored during training: all of them, or ``prompts`` of them drawn with seed 0, in order
    (train.heldout_prompts)."""
    if prompts is None or prompts >= len(records):
        return records
    return [records[i] for i in sorted(random.Random(0).sample(range(len(records)), prompts))]


def heldout_pass_at_1(
    trainer: KLTrainer, records: list[dict], seed: int, samples: int = 1, chunk: int = 64, greedy: bool = False
) -> dict:
    """Pass@1 from ``samples`` samples per held-out prompt (TRL's generation path: HF or vLLM), or from its greedy
    response (``greedy``).

    With several processes each generates for its own share of the requests (process_share) and the scores are
    gathered, so the held-out set is evaluated once per evaluation step, not once per process.
    """
    accelerator = trainer.accelerator
    requests = records * samples
    mine, padded = process_share(len(requests), accelerator.process_index, accelerator.num_processes)
    was_training = trainer.model.training
    trainer.model.eval()
    scores = []
    # The training run's random streams are left untouched: the CPU's and, where it samples, this process's GPU's (only
    # that one: touching the others would open a CUDA context on every GPU of the node from every process).
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    decoding = trainer.greedy_generation() if greedy else contextlib.nullcontext()
    with torch.random.fork_rng(devices=devices), decoding:
        torch.manual_seed(seed)
        for start in range(0, len(padded), chunk):
            part = [requests[i] for i in padded[start : start + chunk]]
            prompts = [[{"role": "user", "content": r["prompt"]}] for r in part]
            # TRL 1.16's _generate, unpacked whole by name: a change of what it returns fails here, not silently.
            _prompt_ids, _completion_ids, _tool_mask, completions, _logprobs, _extra, _images, _tool_images = (
                trainer._generate(prompts)
            )
            texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
            scores += [rewards.score(r, t) for r, t in zip(part, texts, strict=True)]
    trainer.model.train(was_training)
    gathered = dict(gather_object(list(zip(mine, scores[: len(mine)], strict=True))))
    scores = [gathered[i] for i in range(len(requests))]
    mean = sum(scores) / len(scores)
    per_prompt = [sum(scores[i :: len(records)]) / samples for i in range(len(records))]
    stderr = statistics.stdev(per_prompt) / math.sqrt(len(per_prompt)) if len(per_prompt) > 1 else math.nan  # unknown
    # per_prompt: each question's score, in the held-out set's order, so that two runs (or a run and its own step 0,
    # the base model) can be compared question by question (claims.py pairs them).
    return {
        "pass_at_1": mean,
        "stderr": stderr,
        "prompts": len(per_prompt),
        "samples": samples,
        "per_prompt": per_prompt,
    }


def process_share(requests: int, index: int, processes: int) -> tuple[list[int], list[int]]:
    """(the request indices that process ``index`` of ``processes`` owns: a contiguous block, the same indices padded
    with repeats to the length of every process's block). TRL's ``_generate`` gathers across processes, so every
    process must make the same number of generation calls of the same size; the repeats' scores are dropped."""
    share = math.ceil(requests / processes)
    mine = list(range(index * share, min((index + 1) * share, requests)))
    return mine, mine + [mine[-1] if mine else 0] * (share - len(mine))


def _append_jsonl(path: Path, row: dict) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(row) + "\n")


def last_complete_checkpoint(checkpoint_dir: Path, remove_partial: bool = True) -> str | None:
    """The newest checkpoint whose saving finished (RunRecorder.on_save marks it, after everything else).

    A job killed while saving (SLURM's time limit can fall there) leaves a partial checkpoint, which Trainer's
    own get_last_checkpoint would pick; partial ones are removed (``remove_partial``: by the main process alone), so
    that the resumed run can save there again.
    """
    for _, path in reversed(checkpoints(checkpoint_dir)):
        if (path / CHECKPOINT_COMPLETE).exists():
            return str(path)
        if remove_partial:
            shutil.rmtree(path)
    return None


def build_trainer(cell: dict, args: KLTrainerConfig, model_dir: Path, train_records: list[dict], callbacks=()):
    """The KLTrainer of a cell: the base model (policy and reference) and its own tokenizer and chat template."""
    from transformers import AutoTokenizer

    return KLTrainer(
        model=str(model_dir),
        reward_funcs=reward_function,
        args=args,
        train_dataset=to_dataset(train_records),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        callbacks=list(callbacks),
        peft_config=lora_config(cell["train"].get("lora")),
    )


TRAINED_WITH = "training-settings.json"  # in a cell's checkpoint directory: what its checkpoints were trained with


def changed_keys(before: dict, now: dict, prefix: str = "") -> list[str]:
    """The keys whose values differ between two nested settings, as dotted names."""
    changed = []
    for key in sorted(set(before) | set(now)):
        old, new = before.get(key), now.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            changed += changed_keys(old, new, f"{prefix}{key}.")
        elif old != new:
            changed.append(f"{prefix}{key}")
    return changed


def check_trained_with(cell: dict, checkpoint_dir: Path, resuming: bool, write: bool) -> None:
    """A cell resumes only with the training settings its checkpoints were trained with (config.training_settings; not
    the operational ones): a config edited or a repository pulled while a grid runs would otherwise change a cell
    halfway, as each job and each requeued slice reads them again. A fresh run records them (``write``: the main
    process); so does the first resume of checkpoints saved before they were recorded."""
    path, now = Path(checkpoint_dir) / TRAINED_WITH, json.loads(json.dumps(training_settings(cell)))
    if resuming and path.exists() and (changed := changed_keys(json.loads(path.read_text()), now)):
        raise SystemExit(
            f"klstudy train: config key {', '.join(changed)} changed since {checkpoint_dir}'s checkpoints were "
            f"trained: restore it, or delete {checkpoint_dir} to train the cell from the start"
        )
    if write and not (resuming and path.exists()):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(now, sort_keys=True))


def run(
    cell: dict, model_dir: Path, train_path: Path, heldout_path: Path, out_dir: Path, checkpoint_dir: Path,
    tracking_dir: Path,
) -> dict:  # fmt: skip
    """Train one cell (resuming from ``checkpoint_dir`` if it holds a checkpoint); returns summary.json.
    ``tracking_dir``: where TensorBoard's (tensorboard/<cell>) and W&B's (wandb/) files go (tracking.py).
    A job SLURM warns of its time limit (slices.py) stops at the end of that step, saves, writes no outputs and
    returns status ``unfinished``.

    Under ``accelerate launch`` every process runs this; the main process alone writes files, the others take part in
    the collectives (training, held-out generation, gathering a sharded model to save it).
    """
    out_dir, checkpoint_dir = Path(out_dir), Path(checkpoint_dir)
    train_records, heldout_records = staging.read_jsonl(train_path), staging.read_jsonl(heldout_path)
    engine = None
    if cell["train"]["generation"] == "vllm":
        engine = gpu_memory.engine_settings(cell, model_dir, [r["prompt"] for r in train_records + heldout_records])
    args = trainer_config(cell, checkpoint_dir, engine)
    processes = args.distributed_state or PartialState()  # set up with the args' device; the one of a plain run
    main = processes.is_main_process
    if main:
        out_dir.mkdir(parents=True, exist_ok=True)
    recorder = RunRecorder(
        out_dir,
        heldout_subset(heldout_records, cell["train"]["heldout_prompts"]),
        cell["train"]["eval_every"],
        cell["train"]["heldout_samples"],
        args.updates_per_batch,
        HealthRules(**cell["health"]),
        cell["seed"],
        # Snapshots wait beside the checkpoints (which survive a killed job) until the run ends.
        cell["snapshot_steps"],
        checkpoint_dir / "snapshots",
        dtype=models.config_dtype(model_dir),
        greedy=cell["train"]["heldout_decoding"] == "greedy",
        snapshot_dtype=cell.get("snapshot_dtype"),
    )
    if main:
        last_complete_checkpoint(checkpoint_dir)  # removes partial checkpoints, before any process picks one
        slices.clear_slice_end(checkpoint_dir)  # the mark of the slice before this one
    processes.wait_for_everyone()
    last = last_complete_checkpoint(checkpoint_dir, remove_partial=False)
    check_trained_with(cell, checkpoint_dir, resuming=bool(last), write=main)
    done = json.loads((Path(last) / "trainer_state.json").read_text())["global_step"] if last else 0  # optimiser steps
    if last:
        recorder.resume_from(Path(last), done // args.updates_per_batch, write=main)
    elif main:
        for stale in (recorder.metrics_path, recorder.heldout_path):
            stale.unlink(missing_ok=True)
    processes.wait_for_everyone()
    trainer = build_trainer(cell, args, model_dir, train_records, callbacks=[recorder])
    recorder.trainer = trainer
    for fault in faults.FaultAtStep.from_environment(args.updates_per_batch, resumed=bool(last)):
        trainer.add_callback(fault)
    clock = slices.StopOnSignal(args.updates_per_batch, cell["train"]["steps"])
    trainer.add_callback(clock)
    if main:  # trackers start before training, so that one that cannot (no login, no network) fails the job now
        tracking = Tracking(cell["train"]["report_to"], cell["run"], cell, tracking_dir, checkpoint_dir, done)
        heldout = staging.read_jsonl(recorder.heldout_path) if recorder.heldout_path.exists() else []
        tracking.replay(recorder.history, heldout, args.updates_per_batch, upto=done)
        recorder.tracking = tracking
        recorder.progress = Progress(cell["run"], cell["train"]["steps"], start=done // args.updates_per_batch)
        trainer.remove_callback(PrinterCallback)  # Trainer's dict per step; the progress line replaces it
    start = time.perf_counter()
    try:
        trainer.train(resume_from_checkpoint=last)
    finally:
        if recorder.tracking:
            recorder.tracking.finish(trainer.state.global_step)
    if clock.stopped_at is not None and not recorder.verdict:  # continues in the job's next slice
        if main:
            slices.mark_slice_end(checkpoint_dir, clock.stopped_at)
        return {"status": "unfinished", "steps_done": clock.stopped_at, "reason": "(stopped before the time limit)"}
    status, reason = recorder.verdict or ("ok", "")
    save_policy(trainer, out_dir / "final", recorder.dtype)
    summary = _summary(cell, status, reason, recorder, time.perf_counter() - start, resumed_from=last)
    summary.update(generator=_generator(trainer), processes=processes.num_processes)
    if not main:
        return summary
    # Never a silent `ok`: every model this job hands on must load whole, in the dtype it was to be saved in.
    snapshots = sorted(recorder.snapshot_dir.glob("step~*")) if recorder.snapshot_dir.is_dir() else []
    base = models.check_saved_model(model_dir, recorder.dtype)
    summary.update(base_model_sha256=models.base_model_digest(model_dir))  # which base model, to the bit
    models.check_saved_model(out_dir / "final", recorder.dtype, parameters=base)
    for saved in snapshots:
        models.check_saved_model(saved, recorder.snapshot_dtype, parameters=base)
    shutil.rmtree(out_dir / "snapshots", ignore_errors=True)
    if snapshots:
        shutil.copytree(recorder.snapshot_dir, out_dir / "snapshots")
    else:
        (out_dir / "snapshots").mkdir()
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if status == "ok" and cell["train"]["delete_checkpoints"]:
        shutil.rmtree(checkpoint_dir, ignore_errors=True)
    elif status != "ok":  # collapsed or diverged: the last checkpoint is kept to inspect or continue it, no more
        for _, older in checkpoints(checkpoint_dir)[:-1]:
            shutil.rmtree(older, ignore_errors=True)
    return summary


def lora_config(settings: dict | None):
    """A LoRA adapter on every linear layer (small budgets); None trains all weights, as the paper does."""
    if not settings:
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=settings["r"], lora_alpha=settings["alpha"], lora_dropout=settings["dropout"],
        target_modules="all-linear", task_type="CAUSAL_LM",
    )  # fmt: skip


def save_policy(trainer: KLTrainer, path: Path, dtype: str, keep_training: bool = False) -> None:
    """The policy as a plain Hugging Face model in ``dtype`` (the base model's) (LoRA adapters merged), loadable by vLLM
    and lm-eval. Every process calls it: under FSDP the full weights are gathered from the shards (a collective;
    ``Trainer.save_model`` writes no weights with FSDP's SHARDED_STATE_DICT), then the main process writes them.

    ``keep_training``: merge a copy of a LoRA model, so that training can go on with its adapters.
    """
    accelerator = trainer.accelerator
    model = accelerator.unwrap_model(trainer.model)
    if hasattr(model, "merge_and_unload"):  # LoRA: the model is whole on every process (no FSDP: config.py)
        if accelerator.is_main_process:
            model = (copy.deepcopy(model) if keep_training else model).merge_and_unload()
            state_dict = model.state_dict()
    else:
        state_dict = accelerator.get_state_dict(trainer.model)
    if accelerator.is_main_process:
        # The policy trains in float32 weights (TRL's default; bf16 only in autocast); what is handed on has the
        # base model's dtype, in the weights and in config.json (which from_pretrained(dtype="auto") reads).
        state_dict = _cast(state_dict, getattr(torch, dtype))
        model.save_pretrained(str(path), state_dict=state_dict)
        config = copy.deepcopy(model.config)  # save_pretrained writes the dtype of the model's own (float32) weights
        config.dtype = dtype
        config.save_pretrained(str(path))
        trainer.processing_class.save_pretrained(str(path))
    accelerator.wait_for_everyone()


def _cast(state_dict: dict, dtype: torch.dtype) -> dict:
    """Floating-point tensors in ``dtype``; tensors that share memory (tied weights) still share it afterwards."""
    cast = {}
    for name, tensor in state_dict.items():
        key = (tensor.data_ptr(), tensor.shape)
        if key not in cast:
            cast[key] = tensor.to(dtype) if tensor.is_floating_point() else tensor
        state_dict[name] = cast[key]
    return state_dict


def _generator(trainer: KLTrainer) -> str:
    """What generated the rollouts: the colocated vLLM engine (with its version) or transformers' generate."""
    engine = getattr(getattr(trainer, "vllm_generation", None), "llm", None)
    if engine is None:
        return "transformers"
    from importlib.metadata import version

    return f"vllm {version('vllm')} ({type(engine).__module__}.{type(engine).__name__})"


def _summary(cell, status, reason, recorder: RunRecorder, seconds, resumed_from) -> dict:
    heldout = staging.read_jsonl(recorder.heldout_path) if recorder.heldout_path.exists() else []
    last = recorder.history[-1] if recorder.history else {}
    return {
        "status": status,
        "reason": reason,
        "steps_done": last.get("step", 0),
        "steps_planned": cell["train"]["steps"],
        "final_task_reward": last.get("task_reward"),
        "final_kl_k3": last.get("kl_k3"),
        "final_heldout_pass_at_1": heldout[-1]["pass_at_1"] if heldout else None,
        "seconds_this_attempt": round(seconds, 1),
        "resumed_from": resumed_from,
        "launch": _launch(),
        "cell": cell,
    }


def _launch() -> dict:
    """Where this attempt ran: its devices (CUDA_VISIBLE_DEVICES, from devices.py or SLURM), its processes and their
    rendezvous port (accelerate's): what shows afterwards that cells sharing a machine's GPUs ran on devices and
    ports of their own."""
    port = os.environ.get("MASTER_PORT")
    return {
        "devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "processes": int(os.environ.get("WORLD_SIZE", 1)),
        "rendezvous_port": int(port) if port else None,
    }
