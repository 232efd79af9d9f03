"""Run by tests/test_multiprocess.py under `torchrun --nproc_per_node 2`: cell.save_policy on a model that FSDP2
really shards over two CPU processes (gloo), through accelerate's own FSDP2 branch of get_state_dict.

accelerate turns FSDP on only for GPU back ends (on a CPU, `fsdp.yaml` runs DDP), so the Accelerator here is told it
runs FSDP2 after it starts; torch's fully_shard itself works on a CPU mesh. Arguments: base model dir, output dir.
"""

import sys
import types
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from transformers import AutoModelForCausalLM, AutoTokenizer

from klstudy.train import cell, models

base, out = Path(sys.argv[1]), Path(sys.argv[2])
accelerator = Accelerator(cpu=True)
accelerator.state.distributed_type = DistributedType.FSDP
accelerator.state.fsdp_plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
assert accelerator.is_fsdp2 and accelerator.num_processes == 2

model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)  # as TRL loads the policy: float32 weights
mesh = init_device_mesh("cpu", (accelerator.num_processes,))
for layer in model.model.layers:
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
local = next(model.parameters()).to_local().shape[0]
assert local < model.config.vocab_size, "the embedding must really be split over the processes"

tokenizer = AutoTokenizer.from_pretrained(base)
trainer = types.SimpleNamespace(accelerator=accelerator, model=model, processing_class=tokenizer)
dtype = models.config_dtype(base)
cell.save_policy(trainer, out, dtype)  # every process: the gather is a collective
if accelerator.is_main_process:
    parameters = models.check_saved_model(out, dtype, parameters=models.check_saved_model(base, dtype))
    print(f"saved {parameters} parameters in {dtype} from shards of {local} embedding rows per process")
accelerator.wait_for_everyone()
