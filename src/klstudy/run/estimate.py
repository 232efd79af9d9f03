"""What a run costs, computed from its config: the peak disk under results/ and the GPU-hours, each model sized by
``models.<name>.parameters_b`` (a model without it is left out and named). The sums are docs/running.md's (**Disk**,
**GPU-hours**) and docs/cost.md's (tests/test_preflight.py checks them there); `klstudy preflight` and the dry run of
`snakemake --profile slurm -n` print them.
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
GENERATE, SAMPLE_AND_SCORE = {"generation": INFER_FLOPS}, {"generation": INFER_FLOPS, "scoring": 2 * INFER_FLOPS}
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

    def add(self, what: str, config: dict, items, unit: float = 1.0) -> None:
        """Set part ``what`` to Σ per-parameter amount × the parameters of its model, over ``items`` of (model,
        amount), ÷ ``unit``; a model without its size is named in ``unknown``."""
        total = 0.0
        for model, amount in items:
            size = parameters(config, model)
            if size is None:
                self.unknown.add(model)
            else:
                total += amount * size
        self.parts[what] = total / unit


CHECKPOINTS_TRAINING = "checkpoints of the cells training"  # the part the preflight lessens by what is on disk


def peak_disk(config: dict, finished: frozenset = frozenset(), staged: frozenset = frozenset()) -> Estimate:
    """Bytes under results/ at the run's peak (module docstring), without what the ``finished`` cells (their run
    directories, RUN_DIR) and the ``staged`` base models (their names) have written already."""
    estimate, studies = Estimate(), config["studies"]
    cells = [c for c in all_cells(config) if RUN_DIR.format(**c) not in finished]
    snapshots = len([s for s in config["divergence"]["steps"] if s > 0])
    snapshot_bytes = FLOAT32 if config["divergence"]["snapshot_dtype"] == "float32" else BF16
    estimate.add("final models", config, [(c["model"], BF16) for c in cells])
    divergence = [c for c in divergence_cells(config) if RUN_DIR.format(**c) not in finished]
    estimate.add("Fig. 12 snapshots", config, [(c["model"], snapshot_bytes * snapshots) for c in divergence])
    estimate.add("base models", config, [(m, BF16) for m in config["models"] if m not in staged])
    sizes = sorted((parameters(config, c["model"]) or 0 for c in cells), reverse=True)
    slots = config["cluster"]["training_slots"]
    at_once = f"{CHECKPOINTS_TRAINING} ({min(slots, len(cells))} at once)"
    estimate.parts[at_once] = sum(sizes[:slots]) * CHECKPOINT * CHECKPOINTS_AT_PEAK
    if kept := [c["model"] for c in cells if not studies[c["study"]]["train"]["delete_checkpoints"]]:
        what = f"checkpoints kept by {len(kept)} cells (delete_checkpoints: false)"
        estimate.add(what, config, [(model, CHECKPOINT * SAVE_TOTAL_LIMIT) for model in kept])
    collapses = {name for name, spec in studies.items()
                 if spec["health"]["collapse_window"] and spec["train"]["delete_checkpoints"]}  # fmt: skip
    if early := [c["model"] for c in cells if c["kl"] in STOPS_EARLY and c["study"] in collapses]:
        estimate.add(f"last checkpoints of {len(early)} cells expected to collapse", config,
                     [(model, CHECKPOINT) for model in early])  # fmt: skip
    return estimate


def _response_tokens(train: dict) -> int:
    return PROMPT_TOKENS + train["max_response_tokens"]


def _train_tokens(train: dict) -> float:
    return train["steps"] * train["batch_prompts"] * train["rollouts"] * _response_tokens(train)


def _heldout_tokens(config: dict, study: str) -> float:
    """Tokens one cell of ``study`` generates for held-out pass@1: before its first step and every eval_every steps."""
    spec = config["studies"][study]
    train = spec["train"]
    prompts = train.get("heldout_prompts") or config["data"][spec["heldout_data"]].get("size", 0)
    samples = 1 if train["heldout_decoding"] == "greedy" else train["heldout_samples"]
    return (1 + train["steps"] // train["eval_every"]) * prompts * samples * _response_tokens(train)


def _eval_tokens(config: dict, study: str | None) -> float:
    """Tokens of one model's evaluation on every task: a cell of ``study``, or a base model (None)."""
    evaluation = evaluation_settings(config, study)
    questions = sum(config["data"][task].get("size", 0) for task in evaluation["tasks"])
    runs = len(evaluation.get("seeds") or [None])  # one run per evaluation seed
    return runs * questions * evaluation["k"] * (PROMPT_TOKENS + evaluation["max_tokens"])


def seconds_per_token(config: dict, flops: dict[str, float]) -> float:
    """GPU-seconds a token costs per parameter, over the phases (cluster.gpu_tflops) that do ``flops`` of work."""
    return sum(f / (1e12 * config["cluster"]["gpu_tflops"][phase]) for phase, f in flops.items())


def gpu_hours(config: dict) -> Estimate:
    """GPU-hours of training, evaluation and Fig. 12 (module docstring)."""
    estimate, hour = Estimate(), 3600
    train, generate = seconds_per_token(config, TRAIN_FLOPS), seconds_per_token(config, GENERATE)
    cells = [(c["model"], c["study"], config["studies"][c["study"]]["train"]) for c in all_cells(config)]
    estimate.add("training", config, [(m, train * _train_tokens(t)) for m, _, t in cells], hour)
    estimate.add("held-out evaluations in training", config,
                 [(m, generate * _heldout_tokens(config, s)) for m, s, _ in cells], hour)  # fmt: skip
    # Every GPU of the cell waits while each checkpoint is written.
    writes = [(m, t["steps"] // t["checkpoint_every"] * CHECKPOINT / WRITE_BANDWIDTH * training_processes(config, s))
              for m, s, t in cells]  # fmt: skip
    estimate.add(f"checkpoint writes (at {WRITE_BANDWIDTH / GB:g} GB/s, the cell's GPUs idle)", config, writes, hour)
    evaluated = [(c["model"], c["study"]) for c in evaluated_cells(config)]
    evaluated += [(m, None) for m in evaluated_base_models(config) for _ in base_templates(config)]
    tokens = {study: _eval_tokens(config, study) for study in {study for _, study in evaluated}}
    estimate.add("evaluation", config, [(m, generate * tokens[s]) for m, s in evaluated], hour)
    section = config["divergence"]
    # Each snapshot: sample `samples` responses per prompt, then score them under the policy and the reference.
    tokens = len(section["steps"]) * len(section["tasks"]) * section["prompts"] * section["samples"]
    per_snapshot = seconds_per_token(config, SAMPLE_AND_SCORE) * (tokens * (PROMPT_TOKENS + section["max_tokens"]))
    estimate.add("Fig. 12", config, [(c["model"], per_snapshot) for c in divergence_cells(config)], hour)
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
    size, train, gpus = parameters(config, model), config["studies"][study]["train"], training_processes(config, study)
    step = seconds_per_token(config, TRAIN_FLOPS) * size * (_train_tokens(train) / train["steps"]) / gpus
    passes = 1 + train["steps"] // train["eval_every"]
    heldout = seconds_per_token(config, GENERATE) * size * _heldout_tokens(config, study) / passes / gpus
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
