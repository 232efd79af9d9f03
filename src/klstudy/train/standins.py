"""Stand-ins for the paper's models: random weights in a real model's shape, built locally (no hub).

The GPU suite (tests/test_gpu.py) and the GPU benchmarks (benchmarks/) run them, so that memory and time are those
of the real architecture: the byte-level tokenizer of tiny.py is padded to the real vocabulary (the LM head and the
(B, T, V) tensors cost what they really cost), and the layers, widths and attention heads are the real ones. Random
weights never emit EOS: every rollout runs to its length limit, the worst case for time and memory.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from klstudy.train import gpu_memory, tiny

# The published configs of Qwen2.5 and of Qwen3-4B(-Instruct-2507) (hidden size, MLP width, layers, query and key-value
# heads, vocabulary, tied LM head; Qwen3's heads are 128 wide whatever the hidden size, with RMS norms on queries and
# keys); "tiny" is the embedded model's shape with the unpadded byte vocabulary, for rehearsing GPU code on a CPU.
SHAPES = {
    "tiny": dict(hidden_size=128, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=4, vocab_size=None, tie_word_embeddings=True),
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=151_936, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151_936, tie_word_embeddings=True),
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152_064, tie_word_embeddings=False),
    "qwen3-4b": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=151_936, tie_word_embeddings=True),
}  # fmt: skip
QWEN3_SHAPES = {"qwen3-4b"}


def classes_of(shape: str) -> tuple[type, type]:
    """(config class, model class) of a shape's architecture."""
    return (Qwen3Config, Qwen3ForCausalLM) if shape in QWEN3_SHAPES else (Qwen2Config, Qwen2ForCausalLM)


def config_of(shape: str, tokenizer) -> Qwen2Config | Qwen3Config:
    if shape not in SHAPES:
        raise ValueError(f"unknown model shape {shape!r}; known: {sorted(SHAPES)}")
    dims = {**SHAPES[shape], "vocab_size": len(tokenizer)}
    return classes_of(shape)[0](
        **dims,
        max_position_embeddings=32_768,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )


def build(shape: str, out: Path, dtype: str = "bfloat16", device: str = "cpu", seed: int = 0) -> int:
    """Save a random-weight model of ``shape`` in ``dtype`` (the paper's models are bf16) with its tokenizer in
    ``out``, Hugging Face format; returns its parameter count. ``device``: where the weights are initialised."""
    tokenizer = tiny.build_tokenizer(SHAPES.get(shape, {}).get("vocab_size"))
    tokenizer.model_max_length = 32_768
    config = config_of(shape, tokenizer)
    torch.manual_seed(seed)
    with torch.device(device):
        model = classes_of(shape)[1](config)
    model.to(getattr(torch, dtype)).config.dtype = dtype
    parameters = sum(p.numel() for p in model.parameters())
    tiny.save_built(model, tokenizer, out, {"standin": shape, "parameters": parameters})
    return parameters


TWIN_HEAD_DIM = 32  # the narrowest head vLLM's CPU kernels serve


def twin(config: dict, out: Path, seed: int = 0) -> dict:
    """Save a shape twin of a published ``config`` (its config.json as a dict) in ``out``: its architecture, context
    length, RoPE (theta and scaling) and grouped-query layout (query heads per key-value head), at the tiny width:
    one key-value head of TWIN_HEAD_DIM, 2 layers, the byte-level tokenizer of tiny.py, float32 random weights.
    Returns the twin's config.json. vLLM sizes its KV cache and context from these fields as for the real model."""
    real, heads = gpu_memory.Shape.of(config), config["num_attention_heads"]
    groups = heads // real.kv_heads  # query heads per key-value head
    widening = real.hidden / (heads * real.head_dim)  # the hidden size over the heads' width: 0.625 in Qwen3-4B
    width = round(groups * TWIN_HEAD_DIM * widening)
    tokenizer = tiny.build_tokenizer()
    tokenizer.model_max_length = config["max_position_embeddings"]
    kept = ("model_type", "max_position_embeddings", "rope_theta", "rope_scaling", "tie_word_embeddings",
            "sliding_window", "use_sliding_window")  # fmt: skip
    fields = {key: config[key] for key in kept if key in config}
    twin_config = AutoConfig.for_model(
        **fields, hidden_size=width, intermediate_size=2 * width, num_hidden_layers=2, num_attention_heads=groups,
        num_key_value_heads=1, head_dim=TWIN_HEAD_DIM, vocab_size=len(tokenizer), bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"), pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )  # fmt: skip
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(twin_config)
    tiny.save_built(model, tokenizer, out, {"twin_of": config.get("architectures"), "groups": groups})
    return json.loads((Path(out) / "config.json").read_text())
