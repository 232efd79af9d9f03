"""What a run costs, computed from its config: the peak disk under results/ and the GPU-hours, each model sized by
``models.<name>.parameters_b`` (a model without it is left out and named). The sums are docs/running.md's (**Disk**,
**GPU-hours**) and docs/cost.md's; `klstudy preflight` and the dry run of `snakemake --profile slurm -n` print them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from klstudy.config import (
    RUN_DIR,
    SAVE_TOTAL_LIMIT,
    all_cells,
    base_templates,
    divergence_cells,
    evaluated_base_models,
    evaluated_cells,
    evaluation_settings,
    training_processes,
)

BF16, FLOAT32, CHECKPOINT = 2, 4, 12  # bytes per parameter
# Trainer writes a new checkpoint whole before it deletes the oldest (_save_checkpoint, then rotate_checkpoints), so a
# cell briefly holds one more than it keeps.
CHECKPOINTS_AT_PEAK = SAVE_TOTAL_LIMIT + 1
STOPS_EARLY = ("k3-reward",)  # KL configurations the paper reports collapsing (Fig. 3: K3 in the reward)
PROMPT_TOKENS = 256  # assumed prompt length (a MATH question in the chat template is 100-300 tokens)
# FLOPs per token per parameter of each phase of a training step (module docstring).
TRAIN_FLOPS = {"generation": 2, "scoring": 2 * 2, "update": 6}
INFER_FLOPS = 2  # one forward pass
PHASES = tuple(TRAIN_FLOPS)
GB = 1e9
# Bytes a second a training job writes its checkpoint at (an assumption: a parallel file system's share for one job);
# every GPU of the job waits meanwhile.
WRITE_BANDWIDTH = 1 * GB


def gpu_gres(gpus: int, model: str | None) -> str:
    """SLURM's per-node GPU request: ``gpu:N``, or ``gpu:MODEL:N`` for a GPU kind."""
    return f"gpu:{model}:{gpus}" if model else f"gpu:{gpus}"


def gpu_resources(gpus: int, cluster: dict) -> dict:
    """The SLURM plugin's resources that ask ``gpus`` per node (``cluster.gpu_request``): its ``gres``
    (--gres=gpu[:MODEL]:N), or ``slurm_extra`` --gpus-per-node=[MODEL:]N, which the plugin passes on unchecked and
    so takes GPU names its gres check refuses (hyphens)."""
    model = cluster.get("gpu_model")
    if cluster.get("gpu_request", "gres") == "gpus-per-node":
        return {"slurm_extra": f"--gpus-per-node={model + ':' if model else ''}{gpus}"}
    return {"gres": gpu_gres(gpus, model)}


def parameters(config: dict, model: str) -> float | None:
    """A model's parameters (not billions), or None when the config does not give them."""
    size = config["models"][model].get("parameters_b")
    return None if size is None else size * 1e9


@dataclass
class Estimate:
    parts: dict[str, float] = field(default_factory=dict)  # what -> bytes or GPU-hours
    unknown: set[str] = field(default_factory=set)  # models without parameters_b

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    def note(self) -> str:
        return f" (left out, size unknown: {', '.join(sorted(self.unknown))})" if self.unknown else ""


def _sum(config: dict, items, per_parameter, estimate: Estimate) -> float:
    """Σ per_parameter(item) × the parameters of item's model, over ``items`` of (model, item)."""
    total = 0.0
    for model, item in items:
        size = parameters(config, model)
        if size is None:
            estimate.unknown.add(model)
        else:
            total += per_parameter(item) * size
    return total


CHECKPOINTS_TRAINING = "checkpoints of the cells training"  # the part the preflight lessens by what is on disk


def peak_disk(config: dict, finished: frozenset = frozenset(), staged: frozenset = frozenset()) -> Estimate:
    """Bytes under results/ at the run's peak (module docstring), without what the ``finished`` cells (their run
    directories, RUN_DIR) and the ``staged`` base models (their names) have written already."""
    estimate = Estimate()
    cells = [c for c in all_cells(config) if RUN_DIR.format(**c) not in finished]
    snapshots = len([s for s in config["divergence"]["steps"] if s > 0])
    snapshot_bytes = FLOAT32 if config["divergence"]["snapshot_dtype"] == "float32" else BF16
    estimate.parts["final models"] = _sum(config, [(c["model"], c) for c in cells], lambda _: BF16, estimate)
    divergence = [(c["model"], c) for c in divergence_cells(config) if RUN_DIR.format(**c) not in finished]
    estimate.parts["Fig. 12 snapshots"] = _sum(config, divergence, lambda _: snapshot_bytes * snapshots, estimate)
    models = [(m, m) for m in config["models"] if m not in staged]
    estimate.parts["base models"] = _sum(config, models, lambda _: BF16, estimate)
    sizes = sorted((parameters(config, c["model"]) or 0 for c in cells), reverse=True)
    slots = config["cluster"]["training_slots"]
    estimate.parts[f"{CHECKPOINTS_TRAINING} ({min(slots, len(cells))} at once)"] = (
        sum(sizes[:slots]) * CHECKPOINT * CHECKPOINTS_AT_PEAK
    )
    studies = config["studies"]
    kept = [(c["model"], c) for c in cells if not studies[c["study"]]["train"]["delete_checkpoints"]]
    if kept:
        what = f"checkpoints kept by {len(kept)} cells (delete_checkpoints: false)"
        estimate.parts[what] = _sum(config, kept, lambda _: CHECKPOINT * SAVE_TOTAL_LIMIT, estimate)
    collapses = {name for name, spec in studies.items()
                 if spec["health"]["collapse_window"] and spec["train"]["delete_checkpoints"]}  # fmt: skip
    early = [(c["model"], c) for c in cells if c["kl"] in STOPS_EARLY and c["study"] in collapses]
    if early:
        what = f"last checkpoints of {len(early)} cells expected to collapse"
        estimate.parts[what] = _sum(config, early, lambda _: CHECKPOINT, estimate)
    return estimate


def _train_tokens(train: dict) -> float:
    return train["steps"] * train["batch_prompts"] * train["rollouts"] * (PROMPT_TOKENS + train["max_response_tokens"])


def _heldout_tokens(config: dict, study: str) -> float:
    """Tokens one cell of ``study`` generates for held-out pass@1: before its first step and every eval_every steps."""
    spec = config["studies"][study]
    train = spec["train"]
    prompts = train.get("heldout_prompts") or config["data"][spec["heldout_data"]].get("size", 0)
    samples = 1 if train["heldout_decoding"] == "greedy" else train["heldout_samples"]
    passes = 1 + train["steps"] // train["eval_every"]
    return passes * prompts * samples * (PROMPT_TOKENS + train["max_response_tokens"])


def _write_seconds(config: dict, study: str) -> float:
    """GPU-seconds per parameter of one cell's checkpoint writes: every GPU of the cell idle while each is written."""
    train = config["studies"][study]["train"]
    writes = train["steps"] // train["checkpoint_every"]
    return writes * CHECKPOINT / WRITE_BANDWIDTH * training_processes(config, study)


def _eval_tokens(config: dict, study: str | None) -> float:
    """Tokens of one model's evaluation on every task: a cell of ``study``, or a base model (None)."""
    evaluation = evaluation_settings(config, study)
    questions = sum(config["data"][task].get("size", 0) for task in evaluation["tasks"])
    runs = len(evaluation.get("seeds") or [None])  # one run per evaluation seed
    return runs * questions * evaluation["k"] * (PROMPT_TOKENS + evaluation["max_tokens"])


def gpu_hours(config: dict) -> Estimate:
    """GPU-hours of training, evaluation and Fig. 12 (module docstring)."""
    estimate = Estimate()
    per_second = {phase: 1e12 * config["cluster"]["gpu_tflops"][phase] for phase in PHASES}

    def seconds_per_token(flops: dict[str, float]) -> float:  # per parameter, over the phases that do the work
        return sum(f / per_second[phase] for phase, f in flops.items())

    cells = [(c["model"], config["studies"][c["study"]]["train"]) for c in all_cells(config)]
    per_token = seconds_per_token(TRAIN_FLOPS)
    estimate.parts["training"] = _sum(config, cells, lambda t: per_token * _train_tokens(t), estimate) / 3600
    per_token = seconds_per_token({"generation": INFER_FLOPS})
    studies = [(c["model"], c["study"]) for c in all_cells(config)]
    estimate.parts["held-out evaluations in training"] = (
        _sum(config, studies, lambda study: per_token * _heldout_tokens(config, study), estimate) / 3600
    )
    what = f"checkpoint writes (at {WRITE_BANDWIDTH / GB:g} GB/s, the cell's GPUs idle)"
    estimate.parts[what] = _sum(config, studies, lambda study: _write_seconds(config, study), estimate) / 3600
    evaluated = [(c["model"], c["study"]) for c in evaluated_cells(config)]
    evaluated += [(m, None) for m in evaluated_base_models(config) for _ in base_templates(config)]
    per_token = seconds_per_token({"generation": INFER_FLOPS})
    tokens = {study: _eval_tokens(config, study) for study in {study for _, study in evaluated}}
    estimate.parts["evaluation"] = _sum(config, evaluated, lambda study: per_token * tokens[study], estimate) / 3600
    section = config["divergence"]
    # Each snapshot: sample `samples` responses per prompt, then score them under the policy and the reference.
    tokens = len(section["steps"]) * len(section["tasks"]) * section["prompts"] * section["samples"]
    tokens *= PROMPT_TOKENS + section["max_tokens"]
    per_token = seconds_per_token({"generation": INFER_FLOPS, "scoring": 2 * INFER_FLOPS})
    divergence = [(c["model"], c) for c in divergence_cells(config)]
    estimate.parts["Fig. 12"] = _sum(config, divergence, lambda _: per_token * tokens, estimate) / 3600
    return estimate


@dataclass(frozen=True)
class CellTimes:
    """Wall-clock seconds of one cell's parts at the estimate's throughputs, every response at its maximum length."""

    step: float  # one training step (generation, scoring, update)
    heldout: float  # one held-out pass@1 evaluation
    checkpoint: float  # one checkpoint write

    def until(self, step: int, train: dict) -> float:
        """From the start of training to the end of ``step``: the held-out passes (step 0's and every eval_every),
        the steps and the checkpoint writes (every checkpoint_every) on the way."""
        passes = 1 + step // train["eval_every"]
        return passes * self.heldout + step * self.step + (step // train["checkpoint_every"]) * self.checkpoint


def cell_times(config: dict, study: str, model: str) -> CellTimes:
    """A cell's CellTimes: its GPU-seconds (as gpu_hours counts them) over the GPUs that share them."""
    rate = {phase: 1e12 * config["cluster"]["gpu_tflops"][phase] for phase in PHASES}
    size, train, gpus = parameters(config, model), config["studies"][study]["train"], training_processes(config, study)
    per_step = _train_tokens(train) / train["steps"]
    step = sum(flops / rate[phase] for phase, flops in TRAIN_FLOPS.items()) * size * per_step / gpus
    passes = 1 + train["steps"] // train["eval_every"]
    heldout = INFER_FLOPS / rate["generation"] * size * _heldout_tokens(config, study) / passes / gpus
    return CellTimes(step, heldout, CHECKPOINT * size / WRITE_BANDWIDTH)


def _hours(hours: float) -> str:
    return f"{hours:,.0f}" if hours >= 10 else f"{hours:.1f}"


def summary(config: dict) -> list[str]:
    """The lines the preflight and the dry run print."""
    disk, hours = peak_disk(config), gpu_hours(config)
    return [
        f"peak disk under results/: {disk.total / GB:,.0f} GB ("
        + ", ".join(f"{what} {size / GB:,.0f} GB" for what, size in disk.parts.items())
        + f"){disk.note()}",
        "GPU-hours (estimate: every response at its maximum length; TFLOP/s sustained per GPU, cluster.gpu_tflops: "
        + ", ".join(f"{phase} {config['cluster']['gpu_tflops'][phase]:g}" for phase in PHASES)
        + f"): {_hours(hours.total)}{hours.note()}",
        *(f"  {what}: {_hours(h)} GPU-hours" for what, h in hours.parts.items()),
    ]
