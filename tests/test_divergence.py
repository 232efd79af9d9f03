"""Forward KL(π_ref ‖ π_θ) and entropy (Fig. 12) against exact values on a pair of tiny models."""

import math
from pathlib import Path

import pytest
import torch

from klstudy import kl
from klstudy.data.prompts import chat_prompt
from klstudy.evaluate import divergence
from klstudy.train import tiny

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


@pytest.mark.deep  # the deep tier: `make test-deep` (docs/testing.md)
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


# ---------------------------------------------------------------------------------------- memory-bounded scoring


@torch.no_grad()
def _whole_batch_log_probs(model, tokenizer, prompts, responses, mask):
    """The implementation before chunking (one (B, T, V) float32 tensor), kept as the reference for the chunked one."""
    tokenizer.padding_side = "left"
    batch = tokenizer([chat_prompt(tokenizer, p) for p in prompts], return_tensors="pt", padding=True,
                      add_special_tokens=False)  # fmt: skip
    input_ids = torch.cat([batch["input_ids"], responses], dim=1)
    attention = torch.cat([batch["attention_mask"], mask], dim=1)
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention, position_ids=position_ids).logits.float()
    return torch.log_softmax(logits[:, batch["input_ids"].shape[1] - 1 : -1], dim=-1)


class _LargestVocabularyTensor(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the largest tensor any operation allocates whose last dimension is the vocabulary (views of an input,
    such as the transposed LM head weight, allocate nothing)."""

    def __init__(self, vocab_size):
        super().__init__()
        self.vocab_size, self.largest = vocab_size, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {a.untyped_storage().data_ptr() for a in torch.utils._pytree.tree_leaves((args, kwargs))
                  if isinstance(a, torch.Tensor)}  # fmt: skip
        for tensor in out if isinstance(out, (tuple, list)) else [out]:
            if not isinstance(tensor, torch.Tensor) or tensor.untyped_storage().data_ptr() in inputs:
                continue
            if tensor.shape[-1:] == (self.vocab_size,):
                self.largest = max(self.largest, tensor.numel() // self.vocab_size)
        return out


@pytest.mark.parametrize("chunk", [1, 7, 10_000])
def test_chunked_scores_equal_the_whole_batch_computation(chunk):
    """KL, token log-probs and entropy computed `chunk` positions at a time equal the (B, T, V) computation."""
    reference, tokenizer = _model(seed=1, sharpness=4.0)
    policy, _ = _model(seed=2, sharpness=4.0)
    prompts = [PROMPT, PROMPT, "Hi", "A longer question, with more tokens?"]
    responses, mask = divergence.sample_responses(reference, tokenizer, prompts, 9, 0)
    mask[0, 5:], mask[2, 2:] = 0, 0  # two responses that ended early (an untrained model seldom samples EOS)
    samples = divergence.ReferenceSamples(prompts, responses.masked_fill(mask == 0, tokenizer.pad_token_id), mask)
    ref = _whole_batch_log_probs(reference, tokenizer, prompts, samples.responses, samples.mask)
    pol = _whole_batch_log_probs(policy, tokenizer, prompts, samples.responses, samples.mask)
    whole_kl = ((ref.exp() * (ref - pol)).sum(-1).clamp(min=0) * samples.mask).sum(-1)
    chunked_kl = divergence.sequence_forward_kl(policy, reference, tokenizer, samples, chunk_positions=chunk)
    assert torch.allclose(chunked_kl, whole_kl, rtol=1e-5, atol=1e-6) and whole_kl.min() > 0
    logps, entropy = divergence.token_logps_and_entropy(policy, tokenizer, prompts, samples.responses, samples.mask,
                                                        chunk_positions=chunk)  # fmt: skip
    whole_logps = pol.gather(-1, samples.responses.unsqueeze(-1)).squeeze(-1)
    whole_entropy = -(pol.exp() * pol).sum(-1)
    assert torch.allclose(logps, whole_logps * samples.mask, atol=1e-5)
    assert torch.allclose(entropy, whole_entropy * samples.mask, atol=1e-5)


def test_no_tensor_holds_more_vocabulary_rows_than_the_chunk():
    """The peak is set by the config's memory budget, not by the batch: at most `chunk` distributions per tensor."""
    reference, tokenizer = _model(seed=1, sharpness=4.0)
    policy, _ = _model(seed=2, sharpness=4.0)
    prompts = [PROMPT] * 6
    samples = divergence.ReferenceSamples(prompts, *divergence.sample_responses(reference, tokenizer, prompts, 8, 0))
    vocab = reference.config.vocab_size
    chunk = divergence.positions_per_chunk(logits_memory_mb=8 * 5 * 4 * vocab / 2**20, vocab_size=vocab)
    assert chunk == 8 and samples.mask.sum() > 4 * chunk
    with _LargestVocabularyTensor(vocab) as watched:
        divergence.sequence_forward_kl(policy, reference, tokenizer, samples, chunk_positions=chunk)
        divergence.token_logps_and_entropy(policy, tokenizer, prompts, samples.responses, samples.mask, chunk)
    assert 0 < watched.largest <= chunk
    with _LargestVocabularyTensor(vocab) as whole:  # the watcher sees the (B, T, V) tensor of the old computation
        _whole_batch_log_probs(policy, tokenizer, prompts, samples.responses, samples.mask)
    assert whole.largest >= samples.mask.numel()


def test_chunk_size_from_the_memory_budget():
    assert divergence.positions_per_chunk(1024, 151_936) == 1024 * 2**20 // (5 * 4 * 151_936) == 353
    assert divergence.positions_per_chunk(0.001, 151_936) == 1  # never zero positions


def test_snapshots_are_scored_on_the_requested_device_in_their_saved_dtype(tmp_path, monkeypatch):
    """across_snapshots loads π_ref and each snapshot with models.load on the device it is given, and a bf16 snapshot
    stays bf16 (Fig. 12 compares like with like: the paper's models and their snapshots are all bf16)."""
    reference, tokenizer = _model(seed=1, sharpness=4.0)
    policy, _ = _model(seed=2, sharpness=4.0)
    reference.to(torch.bfloat16).save_pretrained(tmp_path / "ref")
    tokenizer.save_pretrained(tmp_path / "ref")
    policy.to(torch.bfloat16).save_pretrained(tmp_path / "snapshots" / "step~2")
    tokenizer.save_pretrained(tmp_path / "snapshots" / "step~2")
    loaded = []
    original = divergence.load

    def recording_load(path, device, dtype="auto"):
        model, tok = original(path, device, dtype)
        loaded.append((Path(path).name, device, model.dtype, str(model.device)))
        return model, tok

    monkeypatch.setattr(divergence, "load", recording_load)
    settings = {"steps": [0, 2], "samples": 2, "max_tokens": 4, "batch_prompts": 2, "logits_memory_mb": 1}
    rows = divergence.across_snapshots(tmp_path / "ref", tmp_path / "snapshots", [PROMPT, "Hi"], settings, 0, "cpu")
    assert loaded == [("ref", "cpu", torch.bfloat16, "cpu"), ("step~2", "cpu", torch.bfloat16, "cpu")]
    assert [row["step"] for row in rows] == [0, 2] and rows[0]["forward_kl"] == 0 and rows[1]["forward_kl"] > 0


def test_float32_snapshots_are_scored_beside_the_reference_upcast_to_float32(tmp_path):
    """divergence.snapshot_dtype float32: a bf16 reference is loaded in float32 (exactly its bf16 values), so that
    policy and reference are computed alike, and a policy equal to the reference scores a KL of 0."""
    reference, tokenizer = _model(seed=1, sharpness=4.0)
    reference.to(torch.bfloat16).save_pretrained(tmp_path / "ref")
    tokenizer.save_pretrained(tmp_path / "ref")
    reference.to(torch.bfloat16).to(torch.float32).save_pretrained(tmp_path / "snapshots" / "step~2")  # π_θ = π_ref
    tokenizer.save_pretrained(tmp_path / "snapshots" / "step~2")
    settings = {"steps": [0, 2], "samples": 2, "max_tokens": 4, "batch_prompts": 2, "logits_memory_mb": 1}
    rows = divergence.across_snapshots(tmp_path / "ref", tmp_path / "snapshots", [PROMPT, "Hi"], settings, 0, "cpu")
    assert rows[1]["forward_kl"] == 0 and rows[1]["entropy"] == rows[0]["entropy"]


def test_step_zero_shortcut_scores_what_a_copy_of_the_reference_scores():
    """At step 0 (π_θ is π_ref) nothing is sampled or scored twice; a copy of π_ref, scored in full, gives the same."""
    import copy

    reference, tokenizer = _model(seed=1, sharpness=4.0)
    prompts = [PROMPT, "Hi", "What is 3 + 4?"]
    shortcut = divergence.forward_kl_and_entropy(reference, reference, tokenizer, prompts, 2, 6, batch_prompts=2)
    twin = copy.deepcopy(reference)
    full = divergence.forward_kl_and_entropy(twin, reference, tokenizer, prompts, 2, 6, batch_prompts=2)
    assert shortcut["forward_kl"] == 0 and full["forward_kl"] == pytest.approx(0, abs=1e-6)
    assert shortcut["entropy"] == pytest.approx(full["entropy"], rel=1e-6) and shortcut["entropy"] > 0


def test_fig12s_prompts_are_the_first_or_a_seeded_draw_across_the_task():
    """A task staged subject by subject (7 subjects of 100, as MATH test is): the first 70 are one subject; a seeded
    draw spans them all, in the task's order, the same for every call (every cell sees the same questions)."""
    from klstudy.evaluate.divergence import chosen_prompts

    records = [{"prompt": f"{subject}-{i}"} for subject in "abcdefg" for i in range(100)]
    assert {p[0] for p in chosen_prompts(records, 70, None)} == {"a"}
    drawn = chosen_prompts(records, 70, 0)
    assert len(set(drawn)) == 70 and {p[0] for p in drawn} == set("abcdefg")
    assert drawn == sorted(drawn, key=lambda p: records.index({"prompt": p}))
    assert drawn == chosen_prompts(records, 70, 0) and drawn != chosen_prompts(records, 70, 1)
    assert len(chosen_prompts(records[:5], 70, 0)) == 5  # a task smaller than the count: all of it
