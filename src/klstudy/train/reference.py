"""The reference model π_ref: the base model, frozen, on every process, sharded like the policy; and the check that
it is the policy's starting point.

Why not TRL's own (1.16): for β > 0 GRPOTrainer builds the reference in the policy's dtype (float32) and, under FSDP2,
shards it with one ``fully_shard`` on the root module (``trl.models.utils.prepare_fsdp``): a forward then gathers
every parameter at once (the whole 7B reference, about 30 GB in float32, on every GPU), and nothing broadcasts rank
0's weights, so the reference is right on the other ranks only while transformers still reads the whole checkpoint on
every rank (checked on two CPU processes: tests/test_multiprocess.py). For β = 0,
``accelerator.prepare_model(evaluation_mode=True)`` does not shard at all under FSDP2.

Here ``build`` makes it for every β: in the policy's dtype (so that, under autocast too, both forwards compute the
same numbers), except under FSDP2 mixed precision, whose policy casts every parameter to bf16 for the forward, where
it is stored in bf16 (the same numbers, half the memory); and under FSDP2 through accelerate's
``fsdp2_prepare_model``, the function that shards the policy: a unit per decoder layer and, with
``fsdp_cpu_ram_efficient_loading``, rank 0's weights broadcast to every rank. Tests: tests/test_multiprocess.py (two
processes of FSDP2 on the CPU), tests/test_trainer.py (the reference built once, the first-step check).
"""

from __future__ import annotations

import torch
from trl.models import prepare_deepspeed
from trl.trainer.utils import add_fused_lm_head, create_model_from_path

# The largest mean |log π_θ − log π_ref| per token, at the first step (before any update), for a reference that is
# the policy's own starting point, by the precision the forward passes run in. Float32 forwards of the same weights
# agree to about 1e-6; bf16 autocast rounds each matmul to 8 bits of mantissa, seen as 0.003 nats of *sequence* KL
# between an fp32 and a bf16 copy of one 0.5B model on an H100. A wrong reference (another model, empty or random
# weights) is off by nats per token.
AGREEMENT = {torch.float32: 1e-3, torch.bfloat16: 0.1, torch.float16: 0.05}


def build(model_id: str, accelerator, policy_dtype: torch.dtype, *, attn_implementation: str | None,
          temperature: float, cast_lm_head_to_fp32: bool) -> torch.nn.Module:  # fmt: skip
    """π_ref from ``model_id`` (the policy's base model), frozen, prepared for ``accelerator``'s back end."""
    reference = load(model_id, storage_dtype(accelerator, policy_dtype), attn_implementation)
    reference.eval().requires_grad_(False)
    add_fused_lm_head(reference, temperature=temperature, cast_lm_head_to_fp32=cast_lm_head_to_fp32)
    return prepare(reference, accelerator)


def storage_dtype(accelerator, policy_dtype: torch.dtype) -> torch.dtype:
    """The reference's dtype: FSDP2's mixed-precision parameter dtype where it has one, else the policy's."""
    plugin = getattr(accelerator.state, "fsdp_plugin", None)
    mixed = getattr(plugin, "mixed_precision_policy", None) if accelerator.is_fsdp2 else None
    return getattr(mixed, "param_dtype", None) or policy_dtype


def forward_dtype(accelerator, policy_dtype: torch.dtype) -> torch.dtype:
    """The dtype the forward passes compute in: the mixed precision's (autocast, FSDP2), else the policy's weights'."""
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(accelerator.mixed_precision, policy_dtype)


def load(model_id: str, dtype: torch.dtype, attn_implementation: str | None) -> torch.nn.Module:
    """The checkpoint in ``dtype``, on the CPU (``prepare`` places it): device_map None, or TRL would spread it over
    every visible GPU ("auto")."""
    return create_model_from_path(model_id, dtype=dtype, attn_implementation=attn_implementation, device_map=None)


def prepare(reference: torch.nn.Module, accelerator) -> torch.nn.Module:
    """Sharded per layer like the policy (FSDP2), partitioned (DeepSpeed ZeRO-3), or on this process's device."""
    if getattr(accelerator.state, "fsdp_plugin", None) is not None and accelerator.is_fsdp2:
        from accelerate.utils import fsdp2_prepare_model

        return fsdp2_prepare_model(accelerator, reference).eval()
    if getattr(accelerator.state, "deepspeed_plugin", None) is not None:
        return prepare_deepspeed(reference, accelerator)
    if getattr(accelerator.state, "fsdp_plugin", None) is not None:
        raise ValueError("FSDP version 1 is not supported for the reference model: set fsdp_version: 2")
    return accelerator.prepare_model(reference, evaluation_mode=True)


def logp_gap(policy_logps: torch.Tensor, reference_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean |log π_θ − log π_ref| over the sampled tokens (``mask``) of this process's batch: 0-dim tensor."""
    mask = mask.float()
    return ((policy_logps - reference_logps).abs() * mask).sum() / mask.sum().clamp(min=1.0)


def check_agreement(gaps: torch.Tensor, precision: torch.dtype) -> float:
    """The largest of every process's first-step gap (``gaps``, gathered: the same on every process, so every process
    stops together); raises when it exceeds what forwards in ``precision`` allow, naming the process."""
    worst = float(gaps.max())
    if worst > AGREEMENT[precision]:
        rank, dtype = int(gaps.argmax()), str(precision).removeprefix("torch.")
        raise RuntimeError(
            f"the reference model is not the policy's base model on process {rank}: before any update their log-probs "
            f"of the sampled tokens differ by {worst:.4g} nats a token on average (at most {AGREEMENT[precision]} in "
            f"{dtype}; every process: {[round(float(g), 6) for g in gaps]}). Check how the reference was loaded and "
            "sharded on that process (klstudy/train/reference.py)."
        )
    return worst
