"""Peak memory of one micro-batch's forward and backward pass in KLTrainer's loss, against the micro-batch size.

    .venv/bin/python benchmarks/step_memory.py --shape qwen2.5-0.5b --device cuda --micro-batches 8 16 32 40
    .venv/bin/python benchmarks/step_memory.py --shape qwen2.5-1.5b --device cpu --micro-batches 1 2 3

A stand-in model of the shape (standins.py: the real layers, widths and vocabulary, random weights) trains as a cell
does: float32 weights, bf16 autocast, gradient checkpointing on (TRL's default; FSDP's activation checkpointing in
config/accelerate/fsdp.yaml does the same work), TRL's fused LM head, on sequences of --prompt-tokens +
--completion-tokens. For each micro-batch size m it measures the peak of one forward and backward pass of
KLTrainer._compute_loss above what was allocated before it (weights and gradients), and fits peak = a + b·m: b is the
memory one more sequence in the micro-batch costs. What a step needs in all is that peak plus the weights, gradients
and Adam's moments (16 bytes per parameter, divided over the GPUs by FSDP) and whatever else shares the GPU (the
colocated vLLM engine, the reference model): README, "Running at paper scale".

On a GPU the peak is torch.cuda.max_memory_allocated; on a CPU, the process's peak resident memory (VmHWM, reset
through /proc/self/clear_refs). The two are not interchangeable: at 0.5B this CPU measured 1.7 GiB per sequence where
an H100 measured 0.16 (autocast, attention kernels and TRL's LM head take other paths on a CPU), so size GPU runs from
GPU measurements only.
"""

import argparse
import gc
import statistics
import tempfile
from pathlib import Path

import torch
from datasets import Dataset

from klstudy.train import standins
from klstudy.train.trainer import KLTrainer, KLTrainerConfig

GIB = 2**30


def _resident(field: str) -> int:
    """Bytes of one of /proc/self/status's memory fields: VmRSS (resident now) or VmHWM (its peak)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


class Meter:
    """Bytes allocated now, and the peak since the last reset, on the device."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")

    def reset(self) -> int:
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            return torch.cuda.memory_allocated()
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        return _resident("VmRSS")

    def peak(self) -> int:
        if self.cuda:
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated()
        return _resident("VmHWM")


def build_trainer(model_dir: Path, device: str, completion_tokens: int, checkpointing: bool) -> KLTrainer:
    args = KLTrainerConfig(
        output_dir=tempfile.mkdtemp(prefix="klstudy-memory-"),
        kl_estimator=None, kl_placement="none", beta=0.0, measure_reference_kl=False,  # no reference model to hold
        per_device_train_batch_size=2, num_generations=2, max_completion_length=completion_tokens,
        gradient_checkpointing=checkpointing, bf16=True, use_cpu=device == "cpu", report_to="none", loss_type="dapo",
    )  # fmt: skip
    prompts = Dataset.from_list([{"prompt": [{"role": "user", "content": "1 + 1?"}]}] * 4)
    trainer = KLTrainer(model=str(model_dir), reward_funcs=lambda completions, **_: [0.0] * len(completions),
                        args=args, train_dataset=prompts)  # fmt: skip
    trainer.model.to(device).train()
    if checkpointing:  # as Trainer does when training starts
        trainer.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs)
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def micro_batch(size: int, prompt_tokens: int, completion_tokens: int, vocab: int, device: str) -> dict:
    """A micro-batch as KLTrainer's loss receives it (on-policy, no KL): random tokens, every position valid."""
    ones = dict(dtype=torch.long, device=device)
    return {
        "prompt_ids": torch.randint(0, vocab, (size, prompt_tokens), device=device),
        "prompt_mask": torch.ones(size, prompt_tokens, **ones),
        "completion_ids": torch.randint(0, vocab, (size, completion_tokens), device=device),
        "completion_mask": torch.ones(size, completion_tokens, **ones),
        "advantages": torch.randn(size, device=device),
        "num_items_in_batch": torch.tensor(float(size * completion_tokens), device=device),
    }


def activation_peak(trainer: KLTrainer, meter: Meter, inputs: dict) -> int:
    """Peak bytes above the allocation before one forward and backward pass of the loss."""
    before = meter.reset()
    with trainer.accelerator.autocast():
        loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    peak = meter.peak() - before
    del loss
    return peak


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="qwen2.5-0.5b", choices=sorted(standins.SHAPES))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--completion-tokens", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=2, help="passes per size (the median is kept)")
    parser.add_argument("--no-gradient-checkpointing", action="store_true")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model_dir = Path(tempfile.mkdtemp(prefix="klstudy-standin-")) / args.shape
    parameters = standins.build(args.shape, model_dir, device=args.device)
    trainer = build_trainer(model_dir, args.device, args.completion_tokens, not args.no_gradient_checkpointing)
    meter, vocab = Meter(args.device), trainer.model.config.vocab_size
    shape = (args.prompt_tokens, args.completion_tokens, vocab, args.device)
    activation_peak(trainer, meter, micro_batch(1, *shape))  # allocates the gradients, warms the kernels up
    print(f"{args.shape} ({parameters / 1e9:.3f} B parameters) on {args.device}: weights and gradients "
          f"{meter.reset() / GIB:.2f} GiB; sequences of {args.prompt_tokens} + {args.completion_tokens} tokens; "
          f"gradient checkpointing {'off' if args.no_gradient_checkpointing else 'on'}", flush=True)  # fmt: skip
    peaks = {}
    for size in args.micro_batches:
        samples = [activation_peak(trainer, meter, micro_batch(size, *shape)) for _ in range(args.repeats)]
        peaks[size] = statistics.median(samples)
        print(f"micro-batch {size:4d}: peak {peaks[size] / GIB:7.3f} GiB above weights and gradients "
              f"(passes: {', '.join(f'{s / GIB:.3f}' for s in samples)})", flush=True)  # fmt: skip
    if len(peaks) >= 2:
        sizes, values = list(peaks), [peaks[s] / GIB for s in peaks]
        slope, intercept = statistics.linear_regression(sizes, values)
        print(f"fit: peak = {intercept:.3f} GiB + {slope:.4f} GiB per sequence in the micro-batch "
              f"({slope * GIB / (args.prompt_tokens + args.completion_tokens) / 2**20:.3f} MiB per token)")  # fmt: skip


if __name__ == "__main__":
    main()
