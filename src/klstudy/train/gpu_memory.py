"""GPU memory of a training cell (its colocated vLLM engine beside training), and an evaluation engine's length.

vLLM sizes itself from two numbers: ``max_model_len`` (the longest sequence it must hold) and the share of the
GPU it may take (``gpu_memory_utilization``). Left to TRL, a colocated engine gets the model's own context length
(131,072 tokens for Llama-3.1-8B, 262,144 for Qwen3-4B-Instruct-2507) in 30 % of the GPU, and the KV cache of one
such sequence does not fit beside the weights: vLLM refuses to start. Here both come from the cell:

- ``max_model_len`` = the longest prompt of the data the engine generates for (in the model's chat template) + the
  longest response + a few tokens of slack;
- the engine's share = its weights (bf16, a whole copy per process) + the KV cache of every sequence a process
  generates at once, at that length + ``VLLM_RESERVE`` (its activations, CUDA graphs, allocator), cut down to what
  training leaves free; the plan fails where not even one sequence fits.

Training's part, per process: 16 bytes per parameter (float32 weights, gradients, Adam's two moments) + 2 for the
reference, all divided by the processes FSDP shards them over; FSDP's gathered layers; activations at
``ACTIVATION_BYTES`` × layers × width per token of a micro-batch; and ``TRAINING_RESERVE``. The reference (every β:
it measures the KL at β = 0 too) is built by train/reference.py: under the paper's launcher (FSDP2, bf16 mixed
precision) in bf16, 2 bytes a parameter, and sharded per layer as the policy is: its forward gathers one bf16 layer
at a time, in the scoring pass, while the policy's layers are
resharded, so it adds nothing to the two float32 layers counted for the policy. A plan leaves ``HEADROOM`` of the GPU
unused: training and the engine's share together never exceed the rest. The per-parameter bytes
reproduce the update peaks measured on an H200 (docs/record/gpu/step-phases-*-h200.json, tested); the activation
bytes are that step's remainder at 4B, and the reserves are allowances, not measurements.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

GIB = 2**30
KV_BYTES = 2  # bf16 K and V (vLLM's "auto" cache dtype for a bf16 model)
WEIGHT_BYTES = 2  # the engine's bf16 copy of the weights
STATE_BYTES = 16  # float32 weights, gradients and Adam's two moments, per parameter
REFERENCE_BYTES = 2  # the reference, bf16 under FSDP2 mixed precision and sharded per layer (reference.py), a parameter
# per token, layer and unit of width: the 4B step's 7.8 GiB for 10 × ~1,130 tokens, rounded up. The loss pass alone
# measured 4.9 (Qwen2.5-7B, 1088 tokens) and 4.6 (Qwen3-4B, 4160) on an H200 (docs/record/gpu.md): 8 keeps the
# whole step's other temporaries.
ACTIVATION_BYTES = 8
VLLM_RESERVE = 3 * GIB  # vLLM's profiled activations, CUDA graphs and non-torch memory: an allowance
TRAINING_RESERVE = 2 * GIB  # the CUDA context, NCCL buffers: an allowance
# Of the GPU, what no plan takes: the allocator's fragmentation and the error of the allowances (activations, reserves).
HEADROOM = 0.10
SLACK = 8  # tokens beyond the longest prompt and answer: special tokens a library adds (lm-eval's BOS, say)


@dataclass(frozen=True)
class Shape:
    """What memory needs of a model's config.json."""

    layers: int
    hidden: int
    kv_heads: int
    head_dim: int
    vocab: int
    context: int  # max_position_embeddings: what vLLM takes for max_model_len when given none
    parameters: int

    @classmethod
    def of(cls, config: dict) -> Shape:
        heads = config["num_attention_heads"]
        hidden, layers = config["hidden_size"], config["num_hidden_layers"]
        head_dim = config.get("head_dim") or hidden // heads
        kv_heads = config.get("num_key_value_heads") or heads
        vocab, inner = config["vocab_size"], config["intermediate_size"]
        per_layer = hidden * head_dim * (2 * heads + 2 * kv_heads) + 3 * hidden * inner  # q, o, k, v; the MLP
        embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings") else 2)
        return cls(layers, hidden, kv_heads, head_dim, vocab, config["max_position_embeddings"],
                   layers * per_layer + embeddings)  # fmt: skip

    @classmethod
    def read(cls, model_dir: Path) -> Shape:
        return cls.of(json.loads((Path(model_dir) / "config.json").read_text()))

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * KV_BYTES  # K and V, every layer

    @property
    def largest_gather(self) -> int:
        """Parameters FSDP gathers at once: one decoder layer, or the embedding matrix."""
        return max((self.parameters - self.vocab * self.hidden) // self.layers, self.vocab * self.hidden)


@dataclass(frozen=True)
class Plan:
    """One process's GPU memory, in bytes, and the vLLM settings that follow."""

    model: str
    gpu: int  # the GPU's memory
    max_model_len: int
    sequences: int  # sequences the engine generates at a time (its share of the batch)
    weights: int
    kv_per_sequence: int
    training: int  # what training holds beside the engine

    @property
    def free_for_engine(self) -> int:
        return int(self.gpu * (1 - HEADROOM)) - self.training

    @property
    def kv(self) -> int:
        """The KV cache the engine gets: every sequence at once where it fits, else what is free."""
        return max(0, min(self.sequences * self.kv_per_sequence, self.free_for_engine - self.weights - VLLM_RESERVE))

    @property
    def concurrent(self) -> int:
        return self.kv // self.kv_per_sequence

    @property
    def share(self) -> float:
        """vLLM's gpu_memory_utilization: its weights, KV cache and reserve, of the whole GPU, rounded up to 0.01 but
        never past what training leaves free."""
        wanted = math.ceil(100 * (self.weights + self.kv + VLLM_RESERVE) / self.gpu)
        return min(wanted, math.floor(100 * self.free_for_engine / self.gpu)) / 100

    def problem(self) -> str | None:
        """Why the engine cannot start beside training, with the numbers; None where at least one sequence fits."""
        if self.concurrent >= 1:
            return None
        return (
            f"{self.model}: one {self.max_model_len}-token sequence needs {gib(self.kv_per_sequence)} GiB of KV cache, "
            f"but a {gib(self.gpu)} GiB GPU leaves the vLLM engine {gib(self.free_for_engine)} GiB beside training's "
            f"{gib(self.training)} GiB, of which its weights take {gib(self.weights)} and its reserve "
            f"{gib(VLLM_RESERVE)}"
        )

    @property
    def total(self) -> int:
        """What the process takes of the GPU: training and the engine's share."""
        return int(self.share * self.gpu) + self.training

    def describe(self) -> str:
        return (
            f"{self.model}: max_model_len {self.max_model_len}, vLLM share {self.share:.2f} of {gib(self.gpu)} GiB "
            f"(weights {gib(self.weights)}, KV {gib(self.kv)} GiB for {min(self.concurrent, self.sequences)} of "
            f"{self.sequences} sequences at once), training {gib(self.training)} GiB"
        )


def gib(size: int | float) -> str:
    return f"{size / GIB:.1f}"


def engine_length(prompt_tokens: int, answer_tokens: int) -> int:
    """vLLM's max_model_len: the longest prompt, the longest answer and SLACK."""
    return prompt_tokens + answer_tokens + SLACK


def evaluation_length(model_dir: Path, data_dir: Path, tasks: list[str], chat_template: bool, max_tokens: int) -> int:
    """vLLM's max_model_len for an evaluation job: its tasks' longest prompt as the model receives it + the answer."""
    from transformers import AutoTokenizer

    from klstudy.data import staging

    prompts = [record["prompt"] for task in tasks for record in staging.read_jsonl(data_dir / f"{task}.jsonl")]
    longest = longest_prompt(AutoTokenizer.from_pretrained(model_dir), prompts, chat_template)
    length = engine_length(longest, max_tokens)
    print(f"vLLM engine: max_model_len {length} (longest prompt {longest}, answers {max_tokens})", flush=True)
    return length


def training_bytes(shape: Shape, processes: int, micro_batch: int, tokens: int, reference: bool = True) -> int:
    """What one process holds to train: sharded states (and reference), gathered layers, a micro-batch's
    activations at ``tokens`` per sequence, the reserve (module docstring)."""
    per_parameter = STATE_BYTES + (REFERENCE_BYTES if reference else 0)
    states = per_parameter * shape.parameters / processes
    gathered = 2 * 4 * shape.largest_gather if processes > 1 else 0  # float32, the next one prefetched
    activations = ACTIVATION_BYTES * shape.layers * shape.hidden * micro_batch * tokens
    return int(states + gathered + activations + TRAINING_RESERVE)


def training_plan(model: str, shape: Shape, train: dict, processes: int, prompt_tokens: int, gpu: int) -> Plan:
    """The colocated engine of a training cell: each process generates its share of the generation batch."""
    length = engine_length(prompt_tokens, train["max_response_tokens"])
    sequences = math.ceil(train["batch_prompts"] * train["rollouts"] / processes)
    micro = train.get("micro_batch") or train["minibatch_prompts"] * train["rollouts"] // processes
    return Plan(model, gpu, length, sequences, WEIGHT_BYTES * shape.parameters, shape.kv_bytes_per_token * length,
                training_bytes(shape, processes, micro, length))  # fmt: skip


def longest_prompt(tokenizer, prompts, chat_template: bool = True) -> int:
    """Tokens of the longest prompt, as the engine receives it (in the model's chat template, or not)."""
    from klstudy.data.prompts import chat_prompt

    texts = [chat_prompt(tokenizer, prompt) if chat_template else prompt for prompt in prompts]
    return max(len(ids) for ids in tokenizer(texts, add_special_tokens=not chat_template)["input_ids"])


def engine_settings(cell: dict, model_dir: Path, prompts: list[str]) -> dict:
    """TRL's settings for the colocated vLLM engine of a cell (generation: vllm): max_model_len from the longest of
    ``prompts`` (training and held-out) and the longest response, and on a GPU the engine's share of its memory
    (training_plan). Raises, with the numbers, where not one sequence fits beside training."""
    import os

    import torch
    from transformers import AutoTokenizer

    train = cell["train"]
    shape = Shape.read(model_dir)
    prompt_tokens = longest_prompt(AutoTokenizer.from_pretrained(model_dir), prompts)
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    gpu = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None
    plan = training_plan(cell["model"], shape, train, processes, prompt_tokens, gpu or 0)
    settings = {"vllm_max_model_length": plan.max_model_len}
    if gpu:  # a CPU engine sizes its KV cache by VLLM_CPU_KVCACHE_SPACE (vllm_cpu.py), not by a share
        if plan.problem():
            raise RuntimeError(f"the colocated vLLM engine does not fit: {plan.problem()}")
        settings["vllm_gpu_memory_utilization"] = plan.share
    print(f"vLLM engine: {plan.describe() if gpu else f'max_model_len {plan.max_model_len} (CPU)'}", flush=True)
    return settings
