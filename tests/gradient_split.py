"""One optimiser step's gradient for the same completions, however the minibatch is split (test_gradient_split.py).

    python tests/gradient_split.py MODEL OUT MICRO_BATCHES...         (one process)
    accelerate launch --config_file config/accelerate/cpu-2proc.yaml tests/gradient_split.py MODEL OUT ...

For each normalisation, KL configuration and number of micro-batches per process, KLTrainer trains one step
(``trainer.train()``, TRL's own splitting, accumulation and DDP) on a generation batch of GLOBAL completions whose
tokens are a fixed function of (prompt, rollout), and the main process writes the gradient the optimiser is about to
apply (after DDP's all-reduce and every micro-batch) to OUT/<loss type>_<kl>_<processes>x<micro>.pt.
"""

from __future__ import annotations

import os
import sys
import zlib
from pathlib import Path

import torch
from accelerate import PartialState
from datasets import Dataset
from transformers import AutoTokenizer, TrainerCallback

from klstudy import kl
from klstudy.train.trainer import KLTrainer, KLTrainerConfig

GROUP, PROMPTS_PER_BATCH, MAX_LENGTH = 4, 4, 12
GLOBAL = GROUP * PROMPTS_PER_BATCH  # completions per optimiser step, however they are split
LOSS_TYPES = ("dapo", "dr_grpo")
KL_CONFIGS = ("none", "k1-reward", "k3-loss", "k3-both", "k3-loss-ratio")
PROMPTS = Dataset.from_list([{"prompt": [{"role": "user", "content": f"What is {i} + {i}?"}]} for i in range(8)])


def fixed_rollouts(prompts, trainer) -> dict:
    """TRL's rollout_func: completion j of a prompt is drawn from a generator seeded by (prompt, j) alone, so every
    split of the batch trains on the same tokens (lengths 2..MAX_LENGTH, some ending in EOS)."""
    tokenizer = trainer.processing_class
    seen: dict[str, int] = {}
    prompt_ids, completion_ids = [], []
    for prompt in prompts:
        text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
        rollout = seen[text] = seen.get(text, -1) + 1
        generator = torch.Generator().manual_seed(zlib.crc32(text.encode()) * 16 + rollout)
        length = int(torch.randint(2, MAX_LENGTH + 1, (1,), generator=generator))
        tokens = torch.randint(0, 94, (length,), generator=generator).tolist()  # printable ASCII bytes
        if rollout % 2:
            tokens[-1] = tokenizer.eos_token_id
        prompt_ids.append(tokenizer(text, add_special_tokens=False)["input_ids"])
        completion_ids.append(tokens)
    return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}


def length_reward(completions, **kwargs):
    return [(len(c[-1]["content"]) % 5) / 4 for c in completions]


class KeepGradient(TrainerCallback):
    """The gradient the optimiser is about to apply: after accumulation and DDP's all-reduce."""

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.gradient = torch.cat([p.grad.detach().flatten().clone() for p in model.parameters()])


def drift(model, scale=0.05):
    """The same seeded move away from the reference on every process, so that every KL term is non-zero."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(scale * torch.randn(parameter.shape, generator=generator))


def one_step_gradient(model_dir: Path, out: Path, loss_type: str, kl_config: str, micro: int) -> torch.Tensor:
    spec = kl.KLSpec.from_name(kl_config, beta=0.5)
    processes = int(os.environ.get("WORLD_SIZE", "1"))  # set by accelerate launch (the process group starts later)
    args = KLTrainerConfig(
        output_dir=str(out / "trainer"), per_device_train_batch_size=GLOBAL // (processes * micro),
        gradient_accumulation_steps=micro, num_generations=GROUP, max_completion_length=MAX_LENGTH, max_steps=1,
        kl_estimator=spec.estimator, kl_placement=spec.placement, kl_loss_gradient=spec.loss_gradient, beta=spec.beta,
        loss_type=loss_type, advantage="rloo", optim="sgd", learning_rate=1e-3, max_grad_norm=0.0, use_cpu=True,
        report_to="none", seed=0, save_strategy="no", disable_tqdm=True, lr_scheduler_type="constant",
        bf16=False,  # as cell.py on a CPU: TRL's default bf16 autocast rounds each micro-batch's matmuls its own way
    )  # fmt: skip
    keep = KeepGradient()
    trainer = KLTrainer(
        model=str(model_dir), reward_funcs=length_reward, args=args, train_dataset=PROMPTS,
        processing_class=AutoTokenizer.from_pretrained(model_dir), rollout_func=fixed_rollouts, callbacks=[keep],
    )  # fmt: skip
    drift(trainer.model)
    trainer._reference_checked = True  # the first-step check would stop a policy moved on purpose
    trainer.train()
    return keep.gradient


def main(model_dir: str, out: str, *micro_batches: str) -> None:
    out = Path(out)
    for loss_type in LOSS_TYPES:
        for kl_config in KL_CONFIGS:
            for micro in map(int, micro_batches):
                gradient = one_step_gradient(Path(model_dir), out, loss_type, kl_config, micro)
                state = PartialState()
                if state.is_main_process:
                    torch.save(gradient, out / f"{loss_type}_{kl_config}_{state.num_processes}x{micro}.pt")


if __name__ == "__main__":
    main(*sys.argv[1:])
