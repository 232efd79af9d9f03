"""Forward KL(π_ref ‖ π_θ) and policy entropy of a trained checkpoint (the paper's Fig. 12).

    forward KL = E_{y ~ π_ref(·|x)} [ Σ_t log π_ref(y_t | x, y_<t) − log π_θ(y_t | x, y_<t) ]
               = E_{y ~ π_ref(·|x)} [ Σ_t KL(π_ref(· | x, y_<t) ‖ π_θ(· | x, y_<t)) ]      (chain rule)

estimated by sampling responses from the *reference* model (temperature 1, the distributions themselves).
The second form is the one computed: each sampled prefix contributes the exact KL of the next-token
distributions, a sum over the vocabulary. It has the same expectation as the first (the sampled token's
log-ratio), but it is never negative and has lower variance: the first form's estimate of a small KL is
often below zero after a few training steps. Entropy is the mean per-token entropy of π_θ on its own
samples. Both are averaged over prompts with a standard error over prompts.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch

from klstudy.models import load
from klstudy.progress import Progress
from klstudy.prompts import chat_prompt


@torch.no_grad()
def next_token_log_probs(model, tokenizer, prompts: list[str], responses: torch.Tensor, response_mask: torch.Tensor):
    """log π(· | x, y_<t) over the vocabulary at each response position; shape (B, T, V)."""
    tokenizer.padding_side = "left"
    texts = [chat_prompt(tokenizer, p) for p in prompts]
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    input_ids = torch.cat([batch["input_ids"], responses], dim=1)
    attention = torch.cat([batch["attention_mask"], response_mask], dim=1)
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)  # as generation numbers left-padded prompts
    logits = model(input_ids=input_ids, attention_mask=attention, position_ids=position_ids).logits.float()
    return torch.log_softmax(logits[:, batch["input_ids"].shape[1] - 1 : -1], dim=-1)


def token_logps_and_entropy(model, tokenizer, prompts: list[str], responses: torch.Tensor, response_mask: torch.Tensor):
    """Per-token log π(y_t | x, y_<t) and entropy of π at each response position; shapes (B, T)."""
    log_probs = next_token_log_probs(model, tokenizer, prompts, responses, response_mask)
    token_logps = log_probs.gather(-1, responses.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return token_logps, entropy


@torch.no_grad()
def sample_responses(model, tokenizer, prompts: list[str], max_tokens: int, seed: int):
    """Responses sampled at temperature 1: token ids (B, T) right-padded, and their mask (EOS included)."""
    tokenizer.padding_side = "left"
    torch.manual_seed(seed)
    texts = [chat_prompt(tokenizer, p) for p in prompts]
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


def _chunks(prompts: list[str], batch_prompts: int):
    """(index of the chunk, its prompts): generation in batches, with a fixed seed per chunk."""
    for index, first in enumerate(range(0, len(prompts), batch_prompts)):
        yield index, prompts[first : first + batch_prompts]


@dataclass
class ReferenceSamples:
    """Responses sampled from π_ref, ``samples`` per prompt (consecutive rows)."""

    prompts: list[str]  # one per row
    responses: torch.Tensor
    mask: torch.Tensor


def reference_samples(reference, tokenizer, prompts, samples, max_tokens, seed=0, batch_prompts=16) -> list:
    """π_ref's samples, drawn once and reused for every snapshot: each checkpoint is scored on the same ones."""
    batches = []
    for index, chunk in _chunks(prompts, batch_prompts):
        repeated = [prompt for prompt in chunk for _ in range(samples)]
        batches.append(
            ReferenceSamples(repeated, *sample_responses(reference, tokenizer, repeated, max_tokens, seed + index))
        )
    return batches


def sequence_forward_kl(policy, reference, tokenizer, samples: ReferenceSamples) -> torch.Tensor:
    """Σ_t KL(π_ref(· | x, y_<t) ‖ π_θ(· | x, y_<t)) along each of π_ref's sampled responses; shape (B,).

    π_ref's distributions are recomputed here rather than kept from sampling: at paper scale a (B, T, V)
    tensor per chunk and snapshot would not fit in memory, one forward pass costs little beside generation.
    """
    args = (tokenizer, samples.prompts, samples.responses, samples.mask)
    ref, pol = next_token_log_probs(reference, *args), next_token_log_probs(policy, *args)
    token_kl = (ref.exp() * (ref - pol)).sum(-1).clamp(min=0)  # ≥ 0 exactly; clamp removes float rounding
    return (token_kl * samples.mask).sum(-1)


def _per_prompt(values: torch.Tensor, samples: int) -> list[float]:
    """Mean over each prompt's ``samples`` consecutive rows."""
    return values.view(-1, samples).mean(-1).tolist()


def forward_kl_and_entropy(
    policy, reference, tokenizer, prompts: list[str], samples: int = 8, max_tokens: int = 64, seed: int = 0,
    batch_prompts: int = 16, from_reference: list[ReferenceSamples] | None = None, progress: Progress | None = None,
) -> dict:  # fmt: skip
    """Sequence-level forward KL(π_ref ‖ π_θ) on samples from π_ref, and π_θ's mean token entropy.

    Both are per-prompt means (the entropy: over the tokens of that prompt's own samples), then averaged over
    prompts with a standard error over prompts. ``from_reference`` (``reference_samples``) avoids redrawing
    π_ref's samples for every checkpoint.
    """
    if from_reference is None:
        from_reference = reference_samples(reference, tokenizer, prompts, samples, max_tokens, seed, batch_prompts)
    kls, entropies = [], []
    for (index, chunk), ref in zip(_chunks(prompts, batch_prompts), from_reference, strict=True):
        kls += _per_prompt(sequence_forward_kl(policy, reference, tokenizer, ref), samples)
        own, own_mask = sample_responses(policy, tokenizer, ref.prompts, max_tokens, seed + index)
        _, entropy = token_logps_and_entropy(policy, tokenizer, ref.prompts, own, own_mask)
        token_entropy = (entropy * own_mask).view(len(chunk), -1).sum(-1)
        entropies += (token_entropy / own_mask.view(len(chunk), -1).sum(-1)).tolist()
        if progress:
            progress.advance()
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
    batch_prompts: int = 16,
) -> list[dict]:
    """One row per step: forward KL and entropy of the policy saved after that step (step 0: the reference).

    Steps whose snapshot does not exist (a run that stopped early) are skipped. π_ref's samples are drawn
    once, so every checkpoint is scored on the same samples; each policy's own samples use the same seeds.
    """
    reference, tokenizer = load(reference_dir)
    shared = reference_samples(reference, tokenizer, prompts, samples, max_tokens, seed, batch_prompts)
    paths = {step: reference_dir if step == 0 else Path(snapshots_dir) / f"step~{step}" for step in sorted(steps)}
    paths = {step: path for step, path in paths.items() if path.is_dir()}
    progress = Progress(f"Fig. 12 {snapshots_dir}", len(paths) * len(shared), unit="batch", every=30.0)
    rows = []
    for step, path in paths.items():
        policy = reference if step == 0 else load(path)[0]
        scores = forward_kl_and_entropy(
            policy, reference, tokenizer, prompts, samples, max_tokens, seed, batch_prompts, shared, progress
        )
        rows.append({"step": step, **scores})
        values = ", ".join(f"{key} {value:.4g}" for key, value in scores.items())
        print(f"Fig. 12 {snapshots_dir}: step {step}: {values}", flush=True)
    return rows
