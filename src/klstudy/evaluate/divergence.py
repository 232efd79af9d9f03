"""Forward KL(π_ref ‖ π_θ) and policy entropy of a trained checkpoint (the paper's Fig. 12).

    forward KL = E_{y ~ π_ref(·|x)} [ Σ_t log π_ref(y_t | x, y_<t) − log π_θ(y_t | x, y_<t) ]
               = E_{y ~ π_ref(·|x)} [ Σ_t KL(π_ref(· | x, y_<t) ‖ π_θ(· | x, y_<t)) ]      (chain rule)

estimated by sampling responses from the *reference* model (temperature 1, the distributions themselves).
The second form is the one computed: each sampled prefix contributes the exact KL of the next-token
distributions, a sum over the vocabulary. It has the same expectation as the first (the sampled token's
log-ratio), but it is never negative and has lower variance: the first form's estimate of a small KL is
often below zero after a few training steps. Entropy is the mean per-token entropy of π_θ on its own
samples. Both are averaged over prompts with a standard error over prompts.

Memory: a batch's next-token distributions are never held whole. At the paper's settings (64 responses of 1024
tokens, a vocabulary of 152k) a (B, T, V) float32 tensor is 40 GB per model. The backbone's last hidden states
(B, T, D) are computed once per model, and the LM head turns only ``chunk_positions`` response positions at a time into
float32 log-probabilities (``positions_per_chunk``: from the config's ``logits_memory_mb``). Both models run on the
GPU when there is one, in the dtype they were saved in (``models.load``).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch

from klstudy.data.prompts import chat_prompt
from klstudy.progress import Progress
from klstudy.train.models import available_device, config_dtype, load

# Float32 copies of one position's vocabulary distribution alive at once while a chunk is scored (the KL's peak:
# both models' log-probabilities, exp(ref), ref - pol and their product); the chunk size divides the budget by it.
COPIES_PER_POSITION = 5


def chosen_prompts(records: list[dict], count: int, seed: int | None) -> list[str]:
    """The ``count`` questions of a task that Fig. 12 is computed on, the same for every cell: the first ``count``
    (``seed`` None), or ``count`` drawn with ``seed`` and kept in the task's order, which spreads them over a task
    staged subject by subject (MATH test: algebra first)."""
    import random

    if seed is None:
        indices = range(min(count, len(records)))
    else:
        indices = sorted(random.Random(seed).sample(range(len(records)), min(count, len(records))))
    return [records[index]["prompt"] for index in indices]


def positions_per_chunk(logits_memory_mb: float, vocab_size: int) -> int:
    """Response positions whose vocabulary distributions are scored at once within ``logits_memory_mb``."""
    return max(1, int(logits_memory_mb * 2**20) // (COPIES_PER_POSITION * 4 * vocab_size))


def _encode_prompts(tokenizer, prompts: list[str], device) -> dict:
    """Chat-formatted prompts, left-padded (as generation pads them), on ``device``."""
    tokenizer.padding_side = "left"
    texts = [chat_prompt(tokenizer, p) for p in prompts]
    return tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)


@torch.no_grad()
def response_hidden_states(model, tokenizer, prompts: list[str], responses, response_mask) -> torch.Tensor:
    """The backbone's last hidden state at every position that predicts a response token under ``response_mask``,
    in row-major order: shape (response_mask.sum(), hidden size). The LM head is left to ``_log_probs``, chunk by
    chunk: the model's own forward would return (B, T, V) logits."""
    if getattr(model.config, "final_logit_softcapping", None) or getattr(model.config, "logit_scale", None):
        raise NotImplementedError(f"{model.config.model_type}: logits with softcapping or scaling are not supported")
    batch = _encode_prompts(tokenizer, prompts, model.device)
    responses, response_mask = responses.to(model.device), response_mask.to(model.device)
    input_ids = torch.cat([batch["input_ids"], responses], dim=1)
    attention = torch.cat([batch["attention_mask"], response_mask], dim=1)
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)  # as generation numbers left-padded prompts
    hidden = model.base_model(input_ids=input_ids, attention_mask=attention, position_ids=position_ids)
    predicting = hidden.last_hidden_state[:, batch["input_ids"].shape[1] - 1 : -1]  # position t predicts token t
    return predicting[response_mask.bool()]


def _log_probs(model, hidden: torch.Tensor) -> torch.Tensor:
    """log π(· | prefix) in float32 for a chunk of hidden states; shape (positions, V)."""
    return torch.log_softmax(model.get_output_embeddings()(hidden).float(), dim=-1)


def _chunks_of(count: int, size: int):
    for start in range(0, count, size):
        yield slice(start, min(start + size, count))


def _unflatten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-position values of the masked positions back into (B, T), zero elsewhere, on the CPU."""
    return torch.zeros(mask.shape, dtype=values.dtype).masked_scatter(mask.bool(), values.cpu())


@torch.no_grad()
def token_logps_and_entropy(
    model, tokenizer, prompts: list[str], responses, response_mask, chunk_positions: int = 1024
):  # fmt: skip
    """Per-token log π(y_t | x, y_<t) and entropy of π at each response position; shapes (B, T), 0 where masked."""
    hidden = response_hidden_states(model, tokenizer, prompts, responses, response_mask)
    tokens = responses.to(hidden.device)[response_mask.to(hidden.device).bool()]
    token_logps = torch.empty(len(tokens), device=hidden.device)
    entropy = torch.empty(len(tokens), device=hidden.device)
    for part in _chunks_of(len(tokens), chunk_positions):
        log_probs = _log_probs(model, hidden[part])
        token_logps[part] = log_probs.gather(-1, tokens[part, None])[:, 0]
        entropy[part] = -(log_probs.exp() * log_probs).sum(-1)
    return _unflatten(token_logps, response_mask), _unflatten(entropy, response_mask)


def end_of_turn_ids(model, tokenizer) -> list[int]:
    """The token ids that end a response: the generation config's (several for Llama-3.1-Instruct: <|eot_id|>,
    <|eom_id|>, <|end_of_text|>), else the tokenizer's eos."""
    ids = model.generation_config.eos_token_id
    ids = tokenizer.eos_token_id if ids is None else ids
    return [ids] if isinstance(ids, int) else list(ids)


@torch.no_grad()
def sample_responses(model, tokenizer, prompts: list[str], max_tokens: int, seed: int):
    """Responses sampled at temperature 1: token ids (B, T) right-padded, and their mask (EOS included); on the CPU."""
    torch.manual_seed(seed)  # the CPU's and every GPU's generator
    batch = _encode_prompts(tokenizer, prompts, model.device)
    out = model.generate(
        **batch, max_new_tokens=max_tokens, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
        pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    responses = out[:, batch["input_ids"].shape[1] :].cpu()
    eos = torch.isin(responses, torch.tensor(end_of_turn_ids(model, tokenizer)))
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


@torch.no_grad()
def sequence_forward_kl(
    policy, reference, tokenizer, samples: ReferenceSamples, chunk_positions: int = 1024
) -> torch.Tensor:  # fmt: skip
    """Σ_t KL(π_ref(· | x, y_<t) ‖ π_θ(· | x, y_<t)) along each of π_ref's sampled responses; shape (B,).

    π_ref's distributions are recomputed here rather than kept from sampling, and both models' are formed
    ``chunk_positions`` positions at a time from their hidden states: never a (B, T, V) tensor.
    """
    args = (tokenizer, samples.prompts, samples.responses, samples.mask)
    ref_hidden, pol_hidden = response_hidden_states(reference, *args), response_hidden_states(policy, *args)
    token_kl = torch.empty(len(ref_hidden), device=ref_hidden.device)
    for part in _chunks_of(len(ref_hidden), chunk_positions):
        ref = _log_probs(reference, ref_hidden[part])
        pol = _log_probs(policy, pol_hidden[part])
        token_kl[part] = (ref.exp() * (ref - pol)).sum(-1).clamp(min=0)  # ≥ 0 exactly; clamp removes float rounding
    return _unflatten(token_kl, samples.mask).sum(-1)


def _per_prompt(values: torch.Tensor, samples: int) -> list[float]:
    """Mean over each prompt's ``samples`` consecutive rows."""
    return values.view(-1, samples).mean(-1).tolist()


def forward_kl_and_entropy(
    policy, reference, tokenizer, prompts: list[str], samples: int = 8, max_tokens: int = 64, seed: int = 0,
    batch_prompts: int = 16, from_reference: list[ReferenceSamples] | None = None, progress: Progress | None = None,
    chunk_positions: int = 1024,
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
        if policy is reference:  # step 0: KL 0, and π_θ's own samples are π_ref's (same model, same seeds)
            kls += [0.0] * len(chunk)
            own, own_mask = ref.responses, ref.mask
        else:
            kls += _per_prompt(sequence_forward_kl(policy, reference, tokenizer, ref, chunk_positions), samples)
            own, own_mask = sample_responses(policy, tokenizer, ref.prompts, max_tokens, seed + index)
        _, entropy = token_logps_and_entropy(policy, tokenizer, ref.prompts, own, own_mask, chunk_positions)
        token_entropy = (entropy * own_mask).view(len(chunk), -1).sum(-1)
        entropies += (token_entropy / own_mask.view(len(chunk), -1).sum(-1)).tolist()
        if progress:
            progress.advance()
    kl, kl_stderr = _mean_and_stderr(kls)
    entropy, entropy_stderr = _mean_and_stderr(entropies)
    return {"forward_kl": kl, "forward_kl_stderr": kl_stderr, "entropy": entropy, "entropy_stderr": entropy_stderr}


def across_snapshots(
    reference_dir: Path, snapshots_dir: Path, prompts: list[str], settings: dict, seed: int = 0, device: str = ""
) -> list[dict]:  # fmt: skip
    """One row per step: forward KL and entropy of the policy saved after that step (step 0: the reference).

    ``settings``: the config's divergence section (steps, samples, max_tokens, batch_prompts, logits_memory_mb).
    Steps whose snapshot does not exist (a run that stopped early) are skipped. π_ref's samples are drawn
    once, so every checkpoint is scored on the same samples; each policy's own samples use the same seeds.
    Both models sit on ``device`` (default: the GPU when there is one) in their saved dtype; where the snapshots are
    float32 (divergence.snapshot_dtype) and the reference is not, the reference is upcast to float32 (exactly), so
    that policy and reference are computed alike.
    """
    device = device or available_device()
    steps = sorted(settings["steps"])
    paths = {step: reference_dir if step == 0 else Path(snapshots_dir) / f"step~{step}" for step in steps}
    paths = {step: path for step, path in paths.items() if path.is_dir()}
    saved = {config_dtype(path) for step, path in paths.items() if step > 0}
    reference, tokenizer = load(reference_dir, device, "float32" if "float32" in saved else "auto")
    chunk = positions_per_chunk(settings["logits_memory_mb"], reference.config.vocab_size)
    sampling = (settings["samples"], settings["max_tokens"], seed, settings["batch_prompts"])
    shared = reference_samples(reference, tokenizer, prompts, *sampling)
    progress = Progress(f"Fig. 12 {snapshots_dir}", len(paths) * len(shared), unit="batch", every=30.0)
    rows = []
    for step, path in paths.items():
        policy = reference if step == 0 else load(path, device)[0]
        scores = forward_kl_and_entropy(
            policy, reference, tokenizer, prompts, *sampling, from_reference=shared, progress=progress,
            chunk_positions=chunk,
        )  # fmt: skip
        del policy  # before the next snapshot loads: two policies beside the reference would not fit at 7B
        rows.append({"step": step, **scores})
        values = ", ".join(f"{key} {value:.4g}" for key, value in scores.items())
        print(f"Fig. 12 {snapshots_dir}: step {step}: {values}", flush=True)
    return rows
