"""Run by tests/test_multiprocess.py under `torchrun --nproc_per_node 2`: the reference model built as KLTrainer builds
it (klstudy/train/reference.py), and as TRL 1.16 does for β > 0 (trl.models.utils.prepare_fsdp), under FSDP2 with
config/accelerate/fsdp.yaml's settings, over two CPU processes (gloo).

Each way runs twice: with the checkpoint loaded on every rank (transformers 5.23), and with rank 1's weights garbage,
as a transformers that honours fsdp_cpu_ram_efficient_loading leaves them (transformers#43785). Writes, per rank,
rank{R}.json: for each way and loading, whether every decoder layer is its own FSDP unit, the largest difference of
the gathered parameters from the checkpoint, and of the logits from the checkpoint model's. accelerate turns FSDP on
only for GPU back ends, so the Accelerator is told it runs FSDP2 after it starts (as tests/fsdp_cpu_save.py).
Arguments: base model dir, output dir.
"""

import json
import sys
from pathlib import Path

import torch
import yaml
from accelerate import Accelerator
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
from torch.distributed.fsdp import FSDPModule
from transformers import AutoModelForCausalLM
from trl.models.utils import prepare_fsdp
from trl.trainer.utils import add_fused_lm_head

from klstudy.train import reference

ROOT = Path(__file__).resolve().parents[1]
base, out = Path(sys.argv[1]), Path(sys.argv[2])
launcher = yaml.safe_load((ROOT / "config/accelerate/fsdp.yaml").read_text())["fsdp_config"]
accelerator = Accelerator(cpu=True)
accelerator.state.distributed_type = DistributedType.FSDP
accelerator.state.fsdp_plugin = FullyShardedDataParallelPlugin(
    fsdp_version=launcher["fsdp_version"],
    auto_wrap_policy=launcher["fsdp_auto_wrap_policy"].lower(),
    cpu_ram_efficient_loading=launcher["fsdp_cpu_ram_efficient_loading"],
    reshard_after_forward=launcher["fsdp_reshard_after_forward"],
)
assert accelerator.is_fsdp2 and accelerator.num_processes == 2
rank = accelerator.process_index
checkpoint = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
inputs = torch.arange(3, 19).reshape(2, 8)
with torch.no_grad():
    expected_logits = checkpoint(inputs).logits


load_every_rank = reference.load  # transformers 5.23: every rank reads the whole checkpoint


def load_garbage_on_rank_1(model_id, dtype, attn_implementation):
    model = load_every_rank(model_id, dtype, attn_implementation)
    if rank == 1:  # what a rank that skipped loading holds: weights that are not the checkpoint's
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.normal_()
    return model


def trl_reference(model_id, loader):
    """TRL 1.16's GRPOTrainer.__init__ for β > 0 under FSDP, from create_model_from_path to prepare_fsdp."""
    model = loader(model_id, torch.float32, None)
    add_fused_lm_head(model)
    return prepare_fsdp(model, accelerator)


def klstudy_reference(model_id, loader):
    original, reference.load = reference.load, loader
    try:
        return reference.build(model_id, accelerator, torch.float32, attn_implementation=None, temperature=1.0,
                               cast_lm_head_to_fp32=False)  # fmt: skip
    finally:
        reference.load = original


def describe(model) -> dict:
    layers = model.model.layers
    gathered = {name: p.full_tensor() if hasattr(p, "full_tensor") else p for name, p in model.named_parameters()}
    wanted = dict(checkpoint.named_parameters())
    with torch.no_grad():
        logits = model(inputs).logits
    return {
        "layers_sharded": [isinstance(layer, FSDPModule) for layer in layers],
        "parameter_error": max((gathered[name] - wanted[name]).abs().max().item() for name in wanted),
        "logit_error": (logits.float() - expected_logits).abs().max().item(),
    }


results = {}
for way, build in (("klstudy", klstudy_reference), ("trl", trl_reference)):
    for loading, loader in (("every rank", load_every_rank), ("rank 0 only", load_garbage_on_rank_1)):
        results[f"{way}, {loading}"] = describe(build(str(base), loader))
        accelerator.wait_for_everyone()
(out / f"rank{rank}.json").write_text(json.dumps(results, indent=1))
