"""Run under `accelerate launch --config_file config/accelerate/cpu-2proc.yaml`: each process scores its own group
with the KL placed in the advantage and a whitening normalisation, and checks its per-token advantages against a
hand computation on the whole gathered batch (the widths of the two processes' completions may differ: padded).

Usage: two_process_advantages.py MODEL_DIR OUT_DIR. Writes OUT_DIR/rank<r>.json: {"max_error", "width", "widths"}.
"""

import json
import sys
from pathlib import Path

import torch
from datasets import Dataset

from klstudy import kl
from klstudy.train import models
from klstudy.train.trainer import KLTrainer, KLTrainerConfig

GROUP, BETA = 4, 0.1
PROMPTS = Dataset.from_list([{"prompt": [{"role": "user", "content": f"What is {i} + {i}?"}]} for i in range(8)])


def length_reward(completions, **kwargs):
    return [(len(c[-1]["content"]) % 5) / 4 for c in completions]


def main(model_dir: str, out_dir: str) -> None:
    args = KLTrainerConfig(
        output_dir=str(Path(out_dir) / "trainer"), per_device_train_batch_size=GROUP, num_generations=GROUP,
        max_completion_length=12, beta=BETA, report_to="none", seed=0, save_strategy="no", disable_tqdm=True,
        loss_type="dapo", kl_estimator="k1", kl_placement="advantage", advantage="group_whiten", use_cpu=True,
    )  # fmt: skip
    trainer = KLTrainer(model=model_dir, reward_funcs=length_reward, args=args, train_dataset=PROMPTS,
                        processing_class=models.load(model_dir)[1])  # fmt: skip
    accelerator, rank = trainer.accelerator, trainer.accelerator.process_index
    with torch.no_grad():  # move the policy off the reference (the same on every process), so that K1 is not zero
        generator = torch.Generator().manual_seed(1)
        for parameter in trainer.model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    trainer._reference_checked = True  # the first-step check would stop a policy moved on purpose
    trainer.model.train()
    torch.manual_seed(rank)  # the two processes sample differently
    batch = trainer._generate_and_score_completions([PROMPTS[rank]] * GROUP)
    mask = batch["completion_mask"].float()

    def everyone(tensor):
        return accelerator.gather(accelerator.pad_across_processes(tensor, dim=1))

    old, ref = everyone(batch["old_per_token_logps"]), everyone(batch["ref_per_token_logps"])
    every_mask = everyone(mask)
    rewards = accelerator.gather(trainer._task_rewards[rank * GROUP : (rank + 1) * GROUP, 0].contiguous())
    k1 = (old - ref) * every_mask
    to_go = torch.stack([k1[:, t:].sum(1) for t in range(k1.size(1))], 1)
    groups = rewards.view(-1, GROUP)
    raw = (groups - groups.mean(1, keepdim=True)).reshape(-1, 1) - BETA * to_go
    mean = (raw * every_mask).sum() / every_mask.sum()
    variance = ((raw - mean).square() * every_mask).sum() / every_mask.sum()
    expected = ((raw - mean) / variance.clamp(min=kl.WHITEN_EPSILON).sqrt())[rank * GROUP : (rank + 1) * GROUP]
    error = (batch["advantages"] - expected[:, : mask.size(1)]).abs().max().item()
    widths = accelerator.gather(torch.tensor([mask.size(1)])).tolist()
    result = {"max_error": error, "width": mask.size(1), "widths": widths}
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:])
