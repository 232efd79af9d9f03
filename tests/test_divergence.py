"""Forward KL(π_ref ‖ π_θ) and entropy (Fig. 12) against exact values on a pair of tiny models."""

import math

import pytest
import torch

from klstudy import divergence, kl, tiny
from klstudy.prompts import chat_prompt

PROMPT = "What is 2 + 2?"


def _model(seed: int, sharpness: float):
    spec = tiny.TinyModelSpec(hidden_size=64, num_layers=1, num_heads=2, intermediate_size=64, seed=seed)
    tokenizer = tiny.build_tokenizer()
    model = tiny.build_model(spec, tokenizer).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(sharpness)  # tied with the output layer: peakier distributions
    return model, tokenizer


@torch.no_grad()
def _exact_two_token_forward_kl(policy, reference, tokenizer):
    """KL over responses of at most 2 tokens (stopping at EOS), by enumerating the first token."""
    prefix = tokenizer(chat_prompt(tokenizer, PROMPT), return_tensors="pt", add_special_tokens=False)["input_ids"]
    vocab = policy.config.vocab_size
    first = torch.arange(vocab).unsqueeze(1)
    ids = torch.cat([prefix.expand(vocab, -1), first], dim=1)
    ref = torch.log_softmax(reference(ids).logits[:, -2:].double(), -1)  # [:, 0] first token, [:, 1] second | first
    pol = torch.log_softmax(policy(ids).logits[:, -2:].double(), -1)
    p_first = ref[0, 0].exp()
    first_term = (p_first * (ref[0, 0] - pol[0, 0])).sum()
    second = (ref[:, 1].exp() * (ref[:, 1] - pol[:, 1])).sum(-1)  # KL of the second token given each first
    second[policy.config.eos_token_id] = 0.0  # a response that ended has no second token
    return (first_term + (p_first * second).sum()).item()


def _within_4_stderr(per_sample: torch.Tensor, exact: float) -> bool:
    stderr = per_sample.std().item() / math.sqrt(len(per_sample))
    return abs(per_sample.mean().item() - exact) < 4 * stderr


def test_both_forms_of_the_forward_kl_match_enumeration_and_the_exact_one_varies_less():
    """Σ_t log-ratio of the sampled token and Σ_t exact next-token KL: same mean, the latter never negative."""
    reference, tokenizer = _model(seed=1, sharpness=8.0)
    policy, _ = _model(seed=2, sharpness=8.0)
    exact = _exact_two_token_forward_kl(policy, reference, tokenizer)
    prompts = [PROMPT] * 4000
    samples = divergence.ReferenceSamples(
        prompts, *divergence.sample_responses(reference, tokenizer, prompts, max_tokens=2, seed=0)
    )
    ref_logps, _ = divergence.token_logps_and_entropy(reference, tokenizer, prompts, samples.responses, samples.mask)
    pol_logps, _ = divergence.token_logps_and_entropy(policy, tokenizer, prompts, samples.responses, samples.mask)
    log_ratio = kl.sequence_kl(ref_logps, pol_logps, samples.mask, "k1")  # K1 of KL(π_ref ‖ π_θ), y ~ π_ref
    chain_rule = divergence.sequence_forward_kl(policy, reference, tokenizer, samples)
    assert exact > 0.1  # the two models differ: the test can tell a wrong estimator from a right one
    assert _within_4_stderr(log_ratio, exact) and _within_4_stderr(chain_rule, exact)
    assert (log_ratio < 0).any() and (chain_rule >= 0).all()
    assert chain_rule.var() < log_ratio.var()


def test_same_model_has_zero_forward_kl_and_positive_entropy():
    model, tokenizer = _model(seed=1, sharpness=4.0)
    result = divergence.forward_kl_and_entropy(model, model, tokenizer, [PROMPT, "Hi"], samples=4, max_tokens=4)
    assert result["forward_kl"] == pytest.approx(0.0, abs=1e-6)
    assert 0 < result["entropy"] <= math.log(model.config.vocab_size) + 1e-6


def test_batches_of_prompts_of_different_lengths_score_as_one_prompt_at_a_time():
    """Generation and scoring run on left-padded batches: padding must change neither the samples nor log π."""
    model, tokenizer = _model(seed=1, sharpness=4.0)
    prompts = [PROMPT, "Hi", "A much longer question that needs many more tokens than the others?"]
    tokenizer.padding_side = "left"
    batch = tokenizer([chat_prompt(tokenizer, p) for p in prompts], return_tensors="pt", padding=True)
    greedy = model.generate(**batch, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    responses, mask = divergence.sample_responses(model, tokenizer, prompts, max_tokens=6, seed=0)
    batched, _ = divergence.token_logps_and_entropy(model, tokenizer, prompts, responses, mask)
    for row, prompt in enumerate(prompts):
        alone = tokenizer([chat_prompt(tokenizer, prompt)], return_tensors="pt")
        own = model.generate(**alone, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        assert own[0, alone["input_ids"].shape[1] :].tolist() == greedy[row, batch["input_ids"].shape[1] :].tolist()
        one_row = (responses[row : row + 1], mask[row : row + 1])
        single, _ = divergence.token_logps_and_entropy(model, tokenizer, [prompt], *one_row)
        assert torch.allclose(batched[row] * mask[row], single[0] * mask[row], atol=1e-5)


def test_reference_samples_drawn_once_give_the_scores_of_a_fresh_draw():
    """Reusing π_ref's samples across checkpoints (chunks of batch_prompts) changes no score."""
    reference, tokenizer = _model(seed=1, sharpness=4.0)
    policy, _ = _model(seed=2, sharpness=4.0)
    prompts = [PROMPT, "Hi", "What is 3 + 4?"]
    shared = divergence.reference_samples(reference, tokenizer, prompts, samples=2, max_tokens=4, batch_prompts=2)
    assert [len(batch.prompts) for batch in shared] == [4, 2]  # 2 prompts × 2 samples, then 1 × 2
    reused = divergence.forward_kl_and_entropy(
        policy, reference, tokenizer, prompts, samples=2, max_tokens=4, batch_prompts=2, from_reference=shared
    )
    redrawn = divergence.forward_kl_and_entropy(policy, reference, tokenizer, prompts, 2, 4, batch_prompts=2)
    assert reused == pytest.approx(redrawn)  # the same seeds draw the same samples
    assert reused["forward_kl"] > 0
