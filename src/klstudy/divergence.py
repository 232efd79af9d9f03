"""Forward KL(π_ref ‖ π_θ) and policy entropy of a trained checkpoint (the paper's Fig. 12).

    forward KL = E_{y ~ π_ref(·|x)} [ Σ_t log π_ref(y_t | x, y_<t) − log π_θ(y_t | x, y_<t) ]

estimated by sampling responses from the *reference* model (temperature 1, the distributions themselves)
and scoring them under both models; entropy is the mean per-token entropy of π_θ on its own samples.
Both are averaged over prompts with a standard error over prompts.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import torch

from klstudy import tiny


@torch.no_grad()
def response_logps(model, tokenizer, prompts: list[str], responses: torch.Tensor, response_mask: torch.Tensor):
    """Per-token log π(y_t | x, y_<t) and entropy of π at each response position; shapes (B, T)."""
    tokenizer.padding_side = "left"
    texts = [tiny.chat_prompt(tokenizer, p) for p in prompts]
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    input_ids = torch.cat([batch["input_ids"], responses], dim=1)
    attention = torch.cat([batch["attention_mask"], response_mask], dim=1)
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)  # as generation numbers left-padded prompts
    logits = model(input_ids=input_ids, attention_mask=attention, position_ids=position_ids).logits.float()
    logits = logits[:, batch["input_ids"].shape[1] - 1 : -1]
    log_probs = torch.log_softmax(logits, dim=-1)
    token_logps = log_probs.gather(-1, responses.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return token_logps, entropy


@torch.no_grad()
def sample_responses(model, tokenizer, prompts: list[str], max_tokens: int, seed: int):
    """Responses sampled at temperature 1: token ids (B, T) right-padded, and their mask (EOS included)."""
    tokenizer.padding_side = "left"
    torch.manual_seed(seed)
    texts = [tiny.chat_prompt(tokenizer, p) for p in prompts]
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    out = model.generate(
        **batch, max_new_tokens=max_tokens, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
        pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    responses = out[:, batch["input_ids"].shape[1] :]
    eos = responses == model.config.eos_token_id
    after_eos = (eos.cumsum(-1) - eos.long()) > 0  # tokens after the first EOS are padding
    return responses.masked_fill(after_eos, tokenizer.pad_token_id), (~after_eos).long()


def _mean_and_stderr(values: list[float]) -> tuple[float, float]:
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0)


def forward_kl_and_entropy(
    policy, reference, tokenizer, prompts: list[str], samples: int = 8, max_tokens: int = 64, seed: int = 0
) -> dict:
    """Sequence-level forward KL(π_ref ‖ π_θ) on samples from π_ref, and π_θ's mean token entropy."""
    kls, entropies = [], []
    for i, prompt in enumerate(prompts):
        repeated = [prompt] * samples
        responses, mask = sample_responses(reference, tokenizer, repeated, max_tokens, seed + i)
        ref_logps, _ = response_logps(reference, tokenizer, repeated, responses, mask)
        pol_logps, _ = response_logps(policy, tokenizer, repeated, responses, mask)
        kls.append(((ref_logps - pol_logps) * mask).sum(-1).mean().item())
        own, own_mask = sample_responses(policy, tokenizer, repeated, max_tokens, seed + i)
        _, entropy = response_logps(policy, tokenizer, repeated, own, own_mask)
        entropies.append(((entropy * own_mask).sum() / own_mask.sum()).item())
    kl, kl_stderr = _mean_and_stderr(kls)
    entropy, entropy_stderr = _mean_and_stderr(entropies)
    return {"forward_kl": kl, "forward_kl_stderr": kl_stderr, "entropy": entropy, "entropy_stderr": entropy_stderr}


def across_snapshots(
    reference_dir: Path,
    snapshots_dir: Path,
    steps: list[int],
    prompts: list[str],
    samples: int,
    max_tokens: int,
    seed: int = 0,
) -> list[dict]:
    """One row per step: forward KL and entropy of the policy saved after that step (step 0: the reference).

    Steps whose snapshot does not exist (a run that stopped early) are skipped. The same seed is used at
    every step, so every checkpoint is scored on the same samples from π_ref.
    """
    reference, tokenizer = tiny.load(reference_dir)
    rows = []
    for step in sorted(steps):
        path = reference_dir if step == 0 else Path(snapshots_dir) / f"step~{step}"
        if not path.is_dir():
            continue
        policy = reference if step == 0 else tiny.load(path)[0]
        rows.append(
            {"step": step, **forward_kl_and_entropy(policy, reference, tokenizer, prompts, samples, max_tokens, seed)}
        )
    return rows
