"""Time per training step of KLTrainer and of stock TRL GRPOTrainer, same model, batch and settings.

    .venv/bin/python benchmarks/trainer_step.py [--device cpu|cuda] [--shape tiny|qwen2.5-0.5b|...] [--model DIR]
                                                [--steps 30] [--repeats 6] [--threads 2]

Both trainers run K3-in-loss with group-mean advantages and TRL's dapo normaliser (the configuration in
which they compute the same loss; tests/test_trainer.py checks that), on the same model (a stand-in of --shape built
here, random weights, unless --model names one), the same prompts, batch, completion length and seed. After one
discarded warm-up pair, runs alternate in pairs whose order flips each repeat, so that machine load and warm-up affect
both alike. A step is generation (and scoring) plus the update; generation dominates and varies from run to run, so
the update (the step less the time in TRL's generate-and-score call, timed alike for both) is timed on its own too,
which lets the ratio resolve a few per cent. The script prints the median seconds per step of each, and the medians
of the paired ratios of whole steps and of updates. Target: ours / stock <= 1.05. The two trainers log the same loss
at every step of the first epoch (same completions, same gradients) on a CPU: each pair's largest difference is
printed. (Later epochs differ: KLTrainer orders each epoch's prompts by (seed, epoch), so that a resumed run repeats
them.)
"""

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from datasets import Dataset
from transformers import PrinterCallback
from trl import GRPOConfig, GRPOTrainer

from klstudy.train import models, standins
from klstudy.train.trainer import KLTrainer, KLTrainerConfig

PROMPTS = 64  # the training set: an epoch is PROMPTS / --prompts steps


def length_reward(completions, **kwargs):
    return [(len(c[-1]["content"]) % 5) / 4 for c in completions]


def seconds_per_step(trainer_class, config_class, model_dir, settings, extra, steps) -> tuple[float, float, list]:
    """(seconds per whole step, seconds per update, the loss of every step) of one run."""
    questions = [f"What is {i} + {i}?" for i in range(PROMPTS)]
    prompts = Dataset.from_list([{"prompt": [{"role": "user", "content": question}]} for question in questions])
    trainer = trainer_class(
        model=str(model_dir),
        reward_funcs=length_reward,
        args=config_class(**settings, **extra, max_steps=steps),
        train_dataset=prompts,
        processing_class=models.load(model_dir)[1],
    )
    trainer.remove_callback(PrinterCallback)
    generating = []  # seconds in each call of TRL's generate-and-score, timed alike for both trainers
    generate_and_score = trainer._generate_and_score_completions

    def timed_generation(inputs):
        start = time.perf_counter()
        batch = generate_and_score(inputs)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        generating.append(time.perf_counter() - start)
        return batch

    trainer._generate_and_score_completions = timed_generation
    result = trainer.train()
    losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    total = result.metrics["train_runtime"]
    return total / steps, (total - sum(generating)) / steps, losses


def _paired(times: dict, which: int) -> str:
    ratios = sorted(o[which] / s[which] for o, s in zip(times["ours"], times["stock"], strict=True))
    return f"median {statistics.median(ratios):.3f} (range {ratios[0]:.3f}-{ratios[-1]:.3f})"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--shape", default="tiny", choices=sorted(standins.SHAPES), help="stand-in model to build")
    parser.add_argument("--model", help="a model directory instead of a stand-in")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=6, help="pairs of runs timed (after a warm-up pair)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step (5 rollouts each)")
    parser.add_argument("--completion-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    workdir = Path(tempfile.mkdtemp(prefix="klstudy-bench-"))
    model_dir = Path(args.model) if args.model else workdir / "model"
    if not args.model:
        standins.build(args.shape, model_dir, dtype="bfloat16" if args.device == "cuda" else "float32")
    settings = dict(
        output_dir=str(workdir / "out"),
        per_device_train_batch_size=args.prompts * 5,  # the embedded study's batch by default: 8 prompts x 5 rollouts
        num_generations=5,
        max_completion_length=args.completion_tokens,
        learning_rate=1e-4,
        beta=0.1,
        loss_type="dapo",
        use_cpu=args.device == "cpu",
        bf16=args.device == "cuda",  # as cell.trainer_config: bf16 autocast on GPUs
        report_to="none",
        seed=0,
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
    )
    ours_extra = dict(kl_estimator="k3", kl_placement="loss", advantage="mean", measure_reference_kl=True)
    stock_extra = dict(scale_rewards="none", use_bias_correction_kl=False)
    runs = {
        "ours": lambda: seconds_per_step(KLTrainer, KLTrainerConfig, model_dir, settings, ours_extra, args.steps),
        "stock": lambda: seconds_per_step(GRPOTrainer, GRPOConfig, model_dir, settings, stock_extra, args.steps),
    }
    for name in runs:  # warm-up pair, discarded: first-run costs (kernels, caches) fall on neither side
        runs[name]()
    times = {"ours": [], "stock": []}
    for repeat in range(args.repeats):
        for name in ("ours", "stock") if repeat % 2 == 0 else ("stock", "ours"):  # the order flips each repeat
            times[name].append(runs[name]())
        ours, stock = times["ours"][-1], times["stock"][-1]
        # From the second epoch on, KLTrainer's EpochSeededSampler orders the prompts its own way: compare the first.
        epoch = PROMPTS // args.prompts
        loss_gap = max(abs(a - b) for a, b in zip(ours[2][:epoch], stock[2][:epoch], strict=True))
        print(
            f"repeat {repeat}: ours {ours[0]:.4f} s/step ({ours[1]:.4f} update), stock {stock[0]:.4f} s/step "
            f"({stock[1]:.4f} update); largest loss difference in the first epoch ({epoch} steps) {loss_gap:.2g}",
            flush=True,
        )
    for which, label in ((0, "whole step"), (1, "update")):
        ours = statistics.median(t[which] for t in times["ours"])
        stock = statistics.median(t[which] for t in times["stock"])
        print(
            f"{label}: median seconds KLTrainer {ours:.4f}, stock GRPOTrainer {stock:.4f}; ratio KLTrainer / "
            f"GRPOTrainer of paired runs {_paired(times, which)}, of medians {ours / stock:.3f} (target <= 1.05)"
        )
    print(
        f"device {args.device}, model {args.model or args.shape}, {args.prompts} prompts x 5 x "
        f"{args.completion_tokens} tokens, {args.steps} steps per run, {args.repeats} pairs"
    )


if __name__ == "__main__":
    main()
