"""Time of a Fig. 12 job (`klstudy divergence`) at the paper's settings, from one batch measured on this machine.

    .venv/bin/python benchmarks/divergence_time.py --shape qwen2.5-7b --device cuda   # the paper's 7B, on a GPU
    .venv/bin/python benchmarks/divergence_time.py --shape tiny --device cpu          # a rehearsal

Two stand-ins of --shape (standins.py: real layers, widths and vocabulary, random bf16 weights) play π_ref and π_θ.
One batch of the job (divergence.batch_prompts prompts × samples responses of max_tokens, from config/paper.yaml
unless overridden) is timed in its three parts: sampling it (transformers' generate), the forward KL of π_ref's
samples (both models' forward passes and the chunked next-token KL) and π_θ's entropy on its own samples; and a
snapshot's load. A job draws π_ref's samples once, then for each of the config's steps loads the snapshot, samples
from it and scores both: the script adds that up for one (cell, task). Random weights never emit EOS, so every
response runs to max_tokens: an upper bound for trained models, whose answers end sooner.
"""

import argparse
import math
import statistics
import tempfile
import time
from pathlib import Path

import torch
import yaml

from klstudy.config import validate_config
from klstudy.evaluate import divergence
from klstudy.train import models, standins

ROOT = Path(__file__).resolve().parents[1]


def _timed(device: str, function, *args):
    """(function(*args), seconds it took), the GPU's queued work included."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = function(*args)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return result, time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="qwen2.5-0.5b", choices=sorted(standins.SHAPES))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--config", default=str(ROOT / "config/paper.yaml"), help="whose divergence section")
    parser.add_argument("--batch-prompts", type=int, help="override divergence.batch_prompts")
    parser.add_argument("--max-tokens", type=int, help="override divergence.max_tokens")
    parser.add_argument("--repeats", type=int, default=2, help="batches timed (the median is kept)")
    args = parser.parse_args()
    section = validate_config(yaml.safe_load(Path(args.config).read_text()))["divergence"]
    batch_prompts = args.batch_prompts or section["batch_prompts"]
    max_tokens = args.max_tokens or section["max_tokens"]
    workdir = Path(tempfile.mkdtemp(prefix="klstudy-divergence-"))
    for name, seed in (("reference", 0), ("policy", 1)):
        standins.build(args.shape, workdir / name, device=args.device, seed=seed)
    (reference, tokenizer), load_seconds = _timed(args.device, models.load, workdir / "reference", args.device)
    policy, _ = models.load(workdir / "policy", args.device)
    chunk = divergence.positions_per_chunk(section["logits_memory_mb"], reference.config.vocab_size)
    prompts = [f"What is {i} + {2 * i}?" for i in range(batch_prompts)]
    repeated = [p for p in prompts for _ in range(section["samples"])]
    parts = {"sample": [], "forward_kl": [], "entropy": []}
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    for repeat in range(args.repeats):
        sampled, seconds = _timed(args.device, divergence.sample_responses, reference, tokenizer, repeated,
                                  max_tokens, repeat)  # fmt: skip
        parts["sample"].append(seconds)
        samples = divergence.ReferenceSamples(repeated, *sampled)
        kl = (divergence.sequence_forward_kl, policy, reference, tokenizer, samples, chunk)
        parts["forward_kl"].append(_timed(args.device, *kl)[1])
        entropy = (divergence.token_logps_and_entropy, policy, tokenizer, repeated, *sampled, chunk)
        parts["entropy"].append(_timed(args.device, *entropy)[1])
    per_batch = {part: statistics.median(values) for part, values in parts.items()}
    tokens = len(repeated) * max_tokens
    peak = torch.cuda.max_memory_allocated() / 2**30 if args.device.startswith("cuda") else float("nan")
    print(f"{args.shape} on {args.device}: one batch of {batch_prompts} prompts x {section['samples']} samples x "
          f"{max_tokens} tokens ({tokens} tokens): sample {per_batch['sample']:.1f} s "
          f"({tokens / per_batch['sample']:.0f} tokens/s), forward KL {per_batch['forward_kl']:.1f} s, "
          f"entropy {per_batch['entropy']:.1f} s; a model loads in {load_seconds:.1f} s; chunks of {chunk} positions; "
          f"peak GPU memory {peak:.1f} GiB")  # fmt: skip
    batches = math.ceil(section["prompts"] / batch_prompts)
    snapshots = len(section["steps"])
    job = batches * per_batch["sample"] + snapshots * (load_seconds + batches * sum(per_batch.values()))
    print(f"one (cell, task) of {args.config}: {section['prompts']} prompts = {batches} batches, {snapshots} policies "
          f"(steps {section['steps']}): {job / 60:.1f} minutes "
          f"(π_ref's samples {batches * per_batch['sample'] / 60:.1f}, each policy "
          f"{(load_seconds + batches * sum(per_batch.values())) / 60:.1f})")  # fmt: skip


if __name__ == "__main__":
    main()
