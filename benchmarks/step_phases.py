"""Time and peak GPU memory of training steps at a paper study's settings, phase by phase.

    python benchmarks/step_phases.py --shape qwen2.5-0.5b --study onpolicy --prompts 8 --steps 2 --out FILE.json
    python benchmarks/step_phases.py --shape qwen3-4b --study onpolicy --prompts 8 --steps 1

The cell is one of config/paper.yaml's (the study's `train` settings, validated, as `klstudy train` gets them:
response length, micro-batch, learning rate, advantage, loss) with four changes, each said in the output: fewer
prompts per step (--prompts, one minibatch per batch), transformers' generation instead of vLLM (no vLLM on the
machine this is written for), one process without FSDP, and gradient checkpointing on (the paper's FSDP config
checkpoints activations itself, fsdp.yaml; without FSDP, transformers' checkpointing does the same work). The model is a
stand-in of --shape (standins.py: the real shape, random bf16 weights), trained as a cell trains it: float32 weights,
bf16 autocast, Adam.

Each step is split by timers (CUDA-synchronised) around KLTrainer's own methods into
- generation: TRL's ``_generate`` (the rollouts);
- scoring: the rest of ``_score_batch`` (old and reference log-probs, rewards, advantages);
- update: the rest of the optimiser step (forward and backward passes of the micro-batches, the optimiser).
Each phase's peak GPU memory is read at its end (the peak is reset at its start). Tokens per second: generated
tokens for generation, (prompt + completion) tokens per forward pass for scoring and the update. The FLOP/s they imply
count 2·N FLOPs per token per forward pass and 6·N per token trained (forward and backward; checkpointing's
recomputation, 2·N more, not counted: the usual "model FLOPs"), N the parameters. The last line is the sustained
throughput that the GPU-hour estimate's 10·N per (prompt + response) token implies, `cluster.gpu_tflops`
(run/estimate.py). The first step also loads kernels: with --steps > 1 it is reported but left out of the medians.
Random weights never emit EOS: every rollout runs to the maximum length, as the estimate assumes.
"""

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
import yaml
from transformers import TrainerCallback

from klstudy import config
from klstudy.data import procedural
from klstudy.train import cell, standins

GIB = 2**30
PHASES = ("generation", "scoring", "update")
ROOT = Path(__file__).resolve().parents[1]


def paper_cell(study: str, kl: str, beta: float, prompts: int, steps: int) -> dict:
    """A cell of config/paper.yaml's ``study`` (validated, defaults from the schema), reduced as the docstring says.
    Its model is the study's first (a label here: the stand-in is what trains)."""
    paper = yaml.safe_load((ROOT / "config/paper.yaml").read_text())
    entry = paper["studies"][study]
    entry["train"].update(batch_prompts=prompts, minibatch_prompts=prompts, steps=steps, generation="hf",
                          gradient_checkpointing=True)  # fmt: skip
    del entry["train"]["accelerate_config"]  # one process, no FSDP
    model = entry["models"][0]
    paper["studies"] = {
        study: {**entry, "models": [model], "kl": [kl], "betas": [beta], "seeds": [0], "health": {"collapse_window": 0}}
    }  # too few steps to judge a collapse
    paper["evaluation"].update(studies={}, study_max_tokens={})  # nothing of it is evaluated
    paper["figures"], paper["claims"] = {}, {}
    paper["divergence"].update(study=study, kl=[kl], betas=[beta], seeds=[0], steps=[0])
    return config.cell_settings(config.validate_config(paper), study, model, kl, beta, 0)


class PhaseTimer(TrainerCallback):
    """Seconds, tokens and peak GPU memory of each phase of each optimiser step."""

    def __init__(self, trainer, cuda: bool, after_step):
        self.cuda, self.steps, self.current, self.phase = cuda, [], None, "update"
        self.after_step = after_step  # called with the steps so far at the end of each
        generate, score_batch = trainer._generate, trainer._score_batch
        logps = trainer._get_per_token_logps_and_entropies

        def timed_generate(prompts):
            self.mark("scoring")  # what ran since _score_batch began (tokenising) counts as scoring
            result = generate(prompts)
            self.mark("generation")
            return result

        def timed_score_batch(inputs):
            self.mark("update")
            self.phase = "scoring"
            batch = score_batch(inputs)
            self.mark("scoring")
            self.phase = "update"
            self.current["prompt_tokens"] += int(batch["prompt_mask"].sum())
            self.current["completion_tokens"] += int(batch["completion_mask"].sum())
            self.current["sequences"] += len(batch["completion_mask"])
            return batch

        def counted_logps(model, input_ids, *args, **kwargs):
            self.current[f"{self.phase}_sequences"] += len(input_ids)  # sequences through a forward pass
            return logps(model, input_ids, *args, **kwargs)

        trainer._generate, trainer._score_batch = timed_generate, timed_score_batch
        trainer._get_per_token_logps_and_entropies = counted_logps

    def _sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def mark(self, phase: str) -> None:
        """Close the time since the last mark as ``phase``'s."""
        self._sync()
        now = time.perf_counter()
        self.current[f"{phase}_s"] += now - self.last
        if self.cuda:
            peak = torch.cuda.max_memory_allocated() / GIB
            self.current[f"{phase}_peak_gib"] = max(self.current[f"{phase}_peak_gib"], peak)
            torch.cuda.reset_peak_memory_stats()
        self.last = now

    def on_step_begin(self, args, state, control, **kwargs):
        self._sync()
        self.last = time.perf_counter()
        self.current = {f"{p}_{k}": 0.0 for p in PHASES for k in ("s", "peak_gib")}
        self.current.update(prompt_tokens=0, completion_tokens=0, sequences=0, scoring_sequences=0, update_sequences=0)
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()

    def on_step_end(self, args, state, control, **kwargs):
        self.mark("update")
        self.steps.append(self.current)
        self.after_step(self.steps)


def throughput(steps: list[dict], parameters: int) -> dict:
    """Medians over ``steps`` of seconds per phase, tokens/s and the TFLOP/s they imply (module docstring)."""
    median = {key: statistics.median(step[key] for step in steps) for key in steps[0]}
    tokens = median["prompt_tokens"] + median["completion_tokens"]
    scoring_passes = median["scoring_sequences"] / median["sequences"]  # forward passes over the whole batch
    step_s = median["generation_s"] + median["scoring_s"] + median["update_s"]
    return {
        "seconds": {p: round(median[f"{p}_s"], 2) for p in PHASES} | {"step": round(step_s, 2)},
        "peak_gib": {p: round(median[f"{p}_peak_gib"], 2) for p in PHASES},
        "tokens": {
            "prompt": median["prompt_tokens"],
            "completion": median["completion_tokens"],
            "sequences": median["sequences"],
            "scoring_passes": scoring_passes,
        },  # fmt: skip
        "tokens_per_s": {
            "generated": round(median["completion_tokens"] / median["generation_s"], 1),
            "scored": round(scoring_passes * tokens / median["scoring_s"], 1) if median["scoring_s"] else None,
            "trained": round(tokens / median["update_s"], 1),
        },
        "tflops": {
            "generation": round(2 * parameters * median["completion_tokens"] / median["generation_s"] / 1e12, 2),
            "scoring": round(2 * parameters * scoring_passes * tokens / median["scoring_s"] / 1e12, 2),
            "update": round(6 * parameters * tokens / median["update_s"] / 1e12, 2),
            "gpu_tflops_for_the_estimate": round(10 * parameters * tokens / step_s / 1e12, 2),
        },
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="qwen2.5-0.5b", choices=sorted(standins.SHAPES))
    parser.add_argument("--study", default="onpolicy", help="a study of config/paper.yaml")
    parser.add_argument("--kl", default="k1-reward")
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step (the paper's: 256)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--response-tokens", type=int, help="instead of the study's max_response_tokens")
    parser.add_argument("--out", type=Path, help="write the result here as JSON")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    workdir = Path(tempfile.mkdtemp(prefix="klstudy-phases-"))
    start = time.perf_counter()
    parameters = standins.build(args.shape, workdir / "model", device="cuda" if cuda else "cpu")
    settings = paper_cell(args.study, args.kl, args.beta, args.prompts, args.steps)
    if args.response_tokens:
        settings["train"]["max_response_tokens"] = args.response_tokens
    train = settings["train"]
    records = procedural.arithmetic("bench", 4 * args.prompts, seed=0, levels=["add1w", "sub1w"], split="train")
    trainer_args = cell.trainer_config(settings, workdir / "checkpoints")
    trainer_args.save_strategy = "no"
    trainer = cell.build_trainer(settings, trainer_args, workdir / "model", records)
    built_s = time.perf_counter() - start
    setup = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "shape": args.shape,
        "parameters": parameters,
        "study": args.study,
        "kl": args.kl,
        "settings": {
            "prompts": args.prompts,
            "rollouts": train["rollouts"],
            "micro_batch": trainer_args.per_device_train_batch_size,
            "accumulation": trainer_args.gradient_accumulation_steps,
            "response_tokens": train["max_response_tokens"],
            "gradient_checkpointing": True,
            "bf16": trainer_args.bf16,
            "generation": "transformers (hf)",
            "processes": 1,
        },  # fmt: skip
        "build_and_load_s": round(built_s, 1),
    }

    def report(steps: list[dict]) -> None:
        """The result so far, after each step: a run cut short still leaves its finished steps."""
        measured = steps[1:] if len(steps) > 1 else steps  # the first step also loads kernels
        result = {**setup, "steps": steps, "steps_in_medians": len(measured), **throughput(measured, parameters)}
        text = json.dumps(result, indent=1)
        print(text, flush=True)
        if args.out:
            args.out.write_text(text + "\n")

    trainer.add_callback(PhaseTimer(trainer, cuda, after_step=report))
    trainer.train()


if __name__ == "__main__":
    main()
