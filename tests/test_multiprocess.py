"""Several processes (what `accelerate launch` starts on a node of GPUs), here two CPU processes over gloo (DDP).

A cell goes through the train_rl rule with config/accelerate/cpu-2proc.yaml: one process writes, held-out pass@1 is
evaluated once per evaluation step, the final model loads, and a run killed mid-way resumes to exactly the metrics
of an uninterrupted two-process run.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from workflow_helpers import ROOT, SNAKEMAKE, claims_it_can_test, reduced_config, snakemake

from klstudy.data import staging
from klstudy.train import models
from klstudy.train.cell import MEASURED_COLUMNS

pytestmark = pytest.mark.multiprocess  # the several-processes tier: `make test-multiprocess` (docs/testing.md)

STEPS, KILL_AT = 4, 3
TWO_PROCESSES = "config/accelerate/cpu-2proc.yaml"


def _config(async_level: int) -> dict:
    """One K1-in-loss cell (it moves from the first step), twice: as `whole` and as `killed`."""
    config = reduced_config()
    study = config["studies"]["offpolicy_k1_loss"]
    study["train"].update(steps=STEPS, batch_prompts=2, minibatch_prompts=2, rollouts=4, eval_every=2,
                          checkpoint_every=2, accelerate_config=TWO_PROCESSES, async_level=async_level)  # fmt: skip
    config["studies"] = {"whole": study, "killed": json.loads(json.dumps(study))}
    config["resources"]["train"]["cpus"] = 2  # shared by the two processes: one thread each
    config["evaluation"]["studies"] = {}
    config["divergence"].update(study="killed", steps=[0, 2, 4])  # the killed cell saves snapshots across the kill
    config["figures"] = {}
    config["claims"] = claims_it_can_test(config)
    return config


def _cell(study: str) -> str:
    return f"results/runs/{study}/tiny/k1-loss/beta~0.1/seed~0"


@pytest.fixture(scope="module")
def two_process_runs(tmp_path_factory):
    """Asynchronous (async_level = 2), which holds the on-policy path and more: each process keeps its own share of
    the batches generated ahead, in the checkpoint, across the kill."""
    workdir = tmp_path_factory.mktemp("two_processes")
    (workdir / "config.yaml").write_text(yaml.safe_dump(_config(async_level=2)))
    args = ["--cores", "2", "--configfile", str(workdir / "config.yaml")]
    snakemake(f"{_cell('whole')}/summary.json", *args, cwd=workdir)  # targets first: --configfile takes several
    killed = subprocess.run(
        [SNAKEMAKE, f"{_cell('killed')}/summary.json", "--snakefile", str(ROOT / "Snakefile"),
         "--directory", str(workdir), *args],
        capture_output=True, text=True, timeout=600, env={**os.environ, "KLSTUDY_KILL_AT_STEP": str(KILL_AT)},
    )  # fmt: skip
    assert killed.returncode != 0, "the job killed at step 3 should have failed"
    log = (workdir / "logs" / "train" / "killed/tiny/k1-loss/beta~0.1/seed~0.log").read_text()
    snakemake(f"{_cell('killed')}/summary.json", *args, cwd=workdir)
    return workdir, log


def _metrics(cell_dir):
    return [{k: v for k, v in row.items() if k not in MEASURED_COLUMNS}
            for row in staging.read_jsonl(cell_dir / "metrics.jsonl")]  # fmt: skip


def test_one_process_writes_one_line_per_step_and_per_evaluation(two_process_runs):
    workdir, _ = two_process_runs
    cell = workdir / _cell("whole")
    assert [row["step"] for row in staging.read_jsonl(cell / "metrics.jsonl")] == list(range(1, STEPS + 1))
    heldout = staging.read_jsonl(cell / "heldout.jsonl")
    assert [row["step"] for row in heldout] == [0, 2, 4]
    assert {row["prompts"] for row in heldout} == {len(staging.read_jsonl(workdir / "results/data/math_test.jsonl"))}
    log = (workdir / "logs" / "train" / "whole/tiny/k1-loss/beta~0.1/seed~0.log").read_text()
    assert log.count(f"cell {_cell('whole')}: ok") == 1  # the summary line comes from the main process only
    assert log.count("CPU threads per process: 1 (2 CPUs over 2 processes on this node)") == 1
    summary = json.loads((cell / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["processes"] == 2


def test_the_final_model_loads_whole(two_process_runs):
    from transformers import AutoModelForCausalLM

    workdir, _ = two_process_runs
    final = workdir / _cell("whole") / "final"
    base = models.check_saved_model(workdir / "results/models/tiny", "float32")
    assert models.check_saved_model(final, "float32", parameters=base) == base
    model = AutoModelForCausalLM.from_pretrained(final, dtype="auto")
    assert sum(p.numel() for p in model.parameters()) == base


def test_a_killed_two_process_run_resumes_to_the_metrics_of_an_uninterrupted_one(two_process_runs):
    workdir, killed_log = two_process_runs
    assert "SIGKILL" in killed_log  # the first attempt really was killed (both processes: torchrun ends the other)
    # The history keeps the killed attempt's traceback under its header, and the next attempt's below it.
    log = (workdir / "logs" / "attempts" / "train" / "killed/tiny/k1-loss/beta~0.1/seed~0.log").read_text()
    headers = [line for line in log.splitlines() if line.startswith("=== attempt ")]
    assert [h.split(":")[0] for h in headers] == ["=== attempt 1", "=== attempt 2"], headers
    assert "job local on " in headers[0] and log.index("SIGKILL") < log.index("=== attempt 2")
    whole, resumed = workdir / _cell("whole"), workdir / _cell("killed")
    summary = json.loads((resumed / "summary.json").read_text())
    assert summary["resumed_from"].endswith("checkpoint-2")
    assert _metrics(resumed) == _metrics(whole)
    assert staging.read_jsonl(resumed / "heldout.jsonl") == staging.read_jsonl(whole / "heldout.jsonl")
    assert sorted(p.name for p in (resumed / "snapshots").glob("step~*")) == ["step~2", "step~4"]
    for snapshot in (resumed / "snapshots").glob("step~*"):
        models.check_saved_model(snapshot, "float32")


def test_fsdp2_shards_are_gathered_into_a_whole_model_in_the_base_dtype(tmp_path):
    """save_policy on a model that FSDP2 shards over two CPU processes, through accelerate's FSDP2 state-dict branch
    (what config/accelerate/fsdp.yaml runs on GPUs, where Trainer.save_model wrote no weights): a whole bf16 model."""
    import torch
    from transformers import AutoModelForCausalLM

    from klstudy.train import tiny

    spec = tiny.TinyModelSpec(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128, sft_steps=0)
    tokenizer = tiny.build_tokenizer()
    model = tiny.build_model(spec, tokenizer).to(torch.bfloat16)
    model.config.dtype = "bfloat16"
    tiny.save(model, tokenizer, tmp_path / "base", spec, {})
    run = subprocess.run(
        [str(Path(sys.executable).parent / "torchrun"), "--nproc_per_node", "2", str(ROOT / "tests/fsdp_cpu_save.py"),
         str(tmp_path / "base"), str(tmp_path / "final")],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert "saved" in run.stdout and "in bfloat16 from shards" in run.stdout
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "final", dtype="auto")
    assert saved.dtype == torch.bfloat16
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(saved.state_dict()[name], tensor, rtol=0, atol=0)  # bf16 -> fp32 -> bf16 exact


def test_the_reference_model_is_the_checkpoint_on_every_rank_sharded_per_layer(tmp_path):
    """Under FSDP2 with config/accelerate/fsdp.yaml's settings, over two CPU processes: the reference KLTrainer builds
    for every β (reference.build) has each decoder layer as its own FSDP unit, and every rank's gathered parameters
    and logits are the checkpoint's, also when rank 1 loaded garbage (as a transformers that honours
    fsdp_cpu_ram_efficient_loading leaves it). TRL 1.16's own reference (β > 0: prepare_fsdp) is shown failing both,
    which is why the project builds its own."""
    import torch

    from klstudy.train import tiny

    spec = tiny.TinyModelSpec(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128, sft_steps=0)
    tokenizer = tiny.build_tokenizer()
    tiny.save(tiny.build_model(spec, tokenizer).to(torch.float32), tokenizer, tmp_path / "base", spec, {})
    run = subprocess.run(
        [str(Path(sys.executable).parent / "torchrun"), "--nproc_per_node", "2",
         str(ROOT / "tests/fsdp_cpu_reference.py"), str(tmp_path / "base"), str(tmp_path)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for result in ranks:
        for loading in ("every rank", "rank 0 only"):
            ours = result[f"klstudy, {loading}"]
            assert all(ours["layers_sharded"]) and ours["parameter_error"] == 0, (loading, ours)
            assert ours["logit_error"] < 1e-5, (loading, ours)
        assert not any(result["trl, every rank"]["layers_sharded"])  # one unit: the whole model gathered at once
        assert result["trl, rank 0 only"]["parameter_error"] > 0.1  # rank 1's garbage is half of every gathered row


def test_whitened_per_token_advantages_span_both_processes(model_dir, tmp_path):
    """The KL placed in the advantage with OpenRLHF's whitening over every token of the batch: each process's per-token
    advantages equal a hand computation on the whole batch, gathered from both (padded to one width)."""
    script = Path(__file__).parent / "two_process_advantages.py"
    launch = [str(Path(sys.executable).parent / "accelerate"), "launch", "--config_file", str(ROOT / TWO_PROCESSES)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parent)}
    subprocess.run([*launch, str(script), str(model_dir), str(tmp_path)], check=True, timeout=600, env=env)
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert all(rank["max_error"] < 1e-5 for rank in ranks), ranks
