"""Time per training step of KLTrainer and of stock TRL GRPOTrainer, same model, batch and settings.

    .venv/bin/python benchmarks/trainer_step.py [--model DIR] [--steps 30] [--repeats 6] [--threads 2]

Both trainers run K3-in-loss with group-mean advantages and TRL's dapo normaliser (the configuration in
which they compute the same loss; tests/test_trainer.py checks that), on the same tiny model (built here
untrained unless --model names one), the same prompts, batch, completion length and seed. After one
discarded warm-up run, runs alternate in pairs whose order flips each repeat, so that machine load and
warm-up affect both alike; the script prints the median seconds
per step of each, and the median of the paired ratios. Target: ours / stock <= 1.05. The two trainers
log the same loss at every step (same completions, same gradients), which the output lets one check.
"""

import argparse
import statistics
import tempfile
from pathlib import Path

import torch
from datasets import Dataset
from transformers import PrinterCallback
from trl import GRPOConfig, GRPOTrainer

from klstudy import models, tiny
from klstudy.trainer import KLTrainer, KLTrainerConfig


def length_reward(completions, **kwargs):
    return [(len(c[-1]["content"]) % 5) / 4 for c in completions]


def seconds_per_step(trainer_class, config_class, model_dir, settings, extra, steps) -> float:
    prompts = Dataset.from_list([{"prompt": [{"role": "user", "content": f"What is {i} + {i}?"}]} for i in range(64)])
    trainer = trainer_class(
        model=str(model_dir),
        reward_funcs=length_reward,
        args=config_class(**settings, **extra, max_steps=steps),
        train_dataset=prompts,
        processing_class=models.load(model_dir)[1],
    )
    trainer.remove_callback(PrinterCallback)
    result = trainer.train()
    return result.metrics["train_runtime"] / steps


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a model directory (default: a tiny untrained model built here)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    workdir = Path(tempfile.mkdtemp(prefix="klstudy-bench-"))
    model_dir = Path(args.model) if args.model else workdir / "model"
    if not args.model:
        tokenizer = tiny.build_tokenizer()
        spec = tiny.TinyModelSpec(sft_steps=0)
        tiny.save(tiny.build_model(spec, tokenizer), tokenizer, model_dir, spec, {})
    settings = dict(
        output_dir=str(workdir / "out"),
        per_device_train_batch_size=40,  # 8 prompts x 5 rollouts, the embedded study's batch
        num_generations=5,
        max_completion_length=48,
        learning_rate=1e-4,
        beta=0.1,
        loss_type="dapo",
        use_cpu=True,
        report_to="none",
        seed=0,
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
    )
    ours_extra = dict(kl_estimator="k3", kl_placement="loss", advantage="grpo", measure_reference_kl=True)
    stock_extra = dict(scale_rewards="none", use_bias_correction_kl=False)
    times = {"ours": [], "stock": []}
    for repeat in range(args.repeats):
        times["ours"].append(seconds_per_step(KLTrainer, KLTrainerConfig, model_dir, settings, ours_extra, args.steps))
        times["stock"].append(seconds_per_step(GRPOTrainer, GRPOConfig, model_dir, settings, stock_extra, args.steps))
        print(
            f"repeat {repeat}: ours {times['ours'][-1]:.4f} s/step, stock {times['stock'][-1]:.4f} s/step", flush=True
        )
    ours, stock = statistics.median(times["ours"]), statistics.median(times["stock"])
    ratios = sorted(o / s for o, s in zip(times["ours"], times["stock"], strict=True))
    print(f"median seconds per step: KLTrainer {ours:.4f}, stock GRPOTrainer {stock:.4f}")
    print(
        f"ratio KLTrainer / GRPOTrainer: median of paired runs {statistics.median(ratios):.3f} "
        f"(range {ratios[0]:.3f}-{ratios[-1]:.3f}); ratio of medians {ours / stock:.3f}  (target <= 1.05)"
    )


if __name__ == "__main__":
    main()
