"""The embedded base model: a byte-level tokenizer, a small Qwen2 causal LM, and a supervised warm start.

Why these choices:
- transformers 5.x builds ``Qwen2Tokenizer`` for model_type qwen2 whatever ``tokenizer_class`` says, so
  the character-level tokenizer *is* a Qwen2 byte-level BPE, with no merges: every byte is a token, and
  spaces and newlines survive a round trip (checked in tests).
- head_dim = hidden / heads = 32, the smallest head size vLLM's CPU attention kernels serve.
- The warm start teaches the chat format, the \\boxed{} answer format and some skill on every task
  family, so that RL starts with a reward signal but far from the ceiling (held-out pass@1 of about
  0.15-0.6 at temperature 1), as a pretrained model starts the paper's RL.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM
from transformers.convert_slow_tokenizer import bytes_to_unicode
from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

from klstudy.data.prompts import chat_prompt

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@dataclass
class TinyModelSpec:
    """Architecture and warm start of the embedded base model.

    Attributes:
        hidden_size: model width; hidden_size / num_heads is the head size (keep it >= 32 for vLLM).
        num_layers: transformer blocks.
        num_heads: attention heads (and key-value heads).
        intermediate_size: MLP width.
        max_positions: longest prompt + response, in bytes.
        rope_theta: base of the rotary position embedding; small values resolve short distances sharply,
            which copying an operand from a prompt a hundred bytes back needs.
        sft_steps: optimiser steps of the warm start.
        sft_batch: sequences per warm-start step.
        learning_rate: peak AdamW learning rate (linear warm-up, cosine decay).
        seed: seeds initialisation, data order and everything random in the build.
    """

    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 512
    max_positions: int = 512
    rope_theta: float = 10000.0
    sft_steps: int = 500
    sft_batch: int = 32
    learning_rate: float = 3e-3
    seed: int = 0


def build_tokenizer(vocab_size: int | None = None) -> Qwen2Tokenizer:
    """Qwen2 byte-level BPE with one token per byte and no merges, plus the chat special tokens.

    ``vocab_size``: pad the vocabulary with filler tokens (ASCII strings such as ``zq123x``, which encoding never
    produces and decoding maps back to their bytes) to this many tokens, special tokens included, so that a stand-in
    of a real model (standins.py) has its embedding and LM head at full size.
    """
    vocab = {char: i for i, char in enumerate(bytes_to_unicode().values())}
    fillers = (vocab_size or 0) - len(vocab) - len(SPECIAL_TOKENS)
    vocab.update({f"zq{i}x": len(vocab) + i for i in range(max(0, fillers))})
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=[],
        unk_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=list(SPECIAL_TOKENS),
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.model_max_length = 512
    return tokenizer


def build_model(spec: TinyModelSpec, tokenizer) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_heads,
        intermediate_size=spec.intermediate_size,
        max_position_embeddings=spec.max_positions,
        rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta},
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    torch.manual_seed(spec.seed)
    return Qwen2ForCausalLM(config)


def _encode_example(tokenizer, record) -> tuple[list[int], list[int]]:
    """(input ids, labels): the loss is on the response and its end-of-turn token only."""
    prompt_ids = tokenizer(chat_prompt(tokenizer, record["prompt"]), add_special_tokens=False)["input_ids"]
    response_ids = tokenizer(record["solution"] + "<|im_end|>", add_special_tokens=False)["input_ids"]
    return prompt_ids + response_ids, [-100] * len(prompt_ids) + response_ids


def _batches(examples, batch_size, rng, pad_id):
    """Random batches of examples of similar length (little padding), in random order, forever."""
    while True:
        order = list(range(len(examples)))
        rng.shuffle(order)
        pools = [order[i : i + 50 * batch_size] for i in range(0, len(order), 50 * batch_size)]
        batches = []
        for pool in pools:
            pool.sort(key=lambda i: len(examples[i][0]))
            batches += [pool[i : i + batch_size] for i in range(0, len(pool) - batch_size + 1, batch_size)]
        rng.shuffle(batches)
        for indices in batches:
            chosen = [examples[i] for i in indices]
            width = max(len(ids) for ids, _ in chosen)
            ids = torch.full((batch_size, width), pad_id)
            labels = torch.full((batch_size, width), -100)
            attention = torch.zeros((batch_size, width), dtype=torch.long)
            for row, (x, y) in enumerate(chosen):
                ids[row, : len(x)], labels[row, : len(y)], attention[row, : len(x)] = (
                    torch.tensor(x),
                    torch.tensor(y),
                    1,
                )
            yield ids, labels, attention


def warm_start(model, tokenizer, records, spec: TinyModelSpec, log=print) -> list[float]:
    """Supervised fine-tuning on the records' worked solutions; returns the loss per step."""
    rng = random.Random(spec.seed)
    torch.manual_seed(spec.seed)
    examples = [_encode_example(tokenizer, r) for r in records]
    too_long = [r["id"] for r, (ids, _) in zip(records, examples, strict=True) if len(ids) > spec.max_positions]
    if too_long:
        raise ValueError(f"{len(too_long)} warm-start examples exceed {spec.max_positions} tokens, e.g. {too_long[0]}")
    optimiser = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = max(1, spec.sft_steps // 20)

    def schedule(step):
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, spec.sft_steps - warmup)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimiser, schedule)
    model.train()
    losses, start = [], time.perf_counter()
    for step, (ids, labels, attention) in zip(
        range(spec.sft_steps), _batches(examples, spec.sft_batch, rng, tokenizer.pad_token_id), strict=False
    ):
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimiser.step()
        scheduler.step()
        losses.append(loss.item())
        if step % 50 == 0 or step == spec.sft_steps - 1:
            log(f"warm start step {step:4d}  loss {loss.item():.4f}  {time.perf_counter() - start:6.1f}s")
    model.eval()
    return losses


@torch.no_grad()
def sample(
    model,
    tokenizer,
    prompts_: list[str],
    max_new_tokens: int,
    temperature: float = 1.0,
    seed: int = 0,
    batch_size: int = 64,
) -> list[str]:
    """Completions for user prompts under the chat template (sampling at ``temperature``; 0 = greedy)."""
    torch.manual_seed(seed)
    tokenizer.padding_side = "left"
    completions = []
    for start in range(0, len(prompts_), batch_size):
        texts = [chat_prompt(tokenizer, p) for p in prompts_[start : start + batch_size]]
        batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        out = model.generate(
            **batch,
            max_new_tokens=max_new_tokens,
            do_sample=temperature > 0,
            temperature=temperature if temperature > 0 else None,
            top_p=1.0,
            top_k=0,
            pad_token_id=tokenizer.pad_token_id,
        )
        completions += tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    return completions


def save(model, tokenizer, out_dir: Path, spec: TinyModelSpec, metadata: dict) -> None:
    save_built(model, tokenizer, out_dir, {"spec": asdict(spec), **metadata})


def save_built(model, tokenizer, out_dir: Path, build: dict) -> None:
    """A model built here (the tiny model, or a stand-in of standins.py), sampling at temperature 1 by default, with its
    tokenizer and ``build`` (how it was made) in klstudy_build.json."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        eos_token_id=model.config.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=True, temperature=1.0
    )
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    (out_dir / "klstudy_build.json").write_text(json.dumps(build, indent=2) + "\n")
