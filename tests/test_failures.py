"""Failures classified (klstudy.run.failures): what ended a training attempt, read from its history, decides its retry.

The messages classified here are the ones Python and torch print (run in a subprocess, not typed); the whole path, a
cell whose first attempt fails deterministically and whose retries refuse at once on one CPU, runs through Snakemake.
"""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from workflow_helpers import ROOT, SNAKEMAKE, claims_it_can_test, reduced_config

from klstudy.run import failures


def printed_by(code: str) -> str:
    """What a Python process that runs ``code`` prints before it dies."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stderr


def history(*attempts: tuple[str, str]) -> str:
    """A history file's text: (host, output) per attempt, under common.smk's headers."""
    return "".join(f"=== attempt {n}: job 8{n} on {host}, GPUs 0,1, 2026-11-27T10:0{n}:00+00:00\n{output}\n"
                   for n, (host, output) in enumerate(attempts, 1))  # fmt: skip


@pytest.mark.parametrize(
    ("code", "kind", "what"),
    [
        ("import klstudy_no_such_module", "deterministic", "an import error"),
        ("import torch; raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')",
         "deterministic", "out of GPU memory"),
        ("import os; os.environ['CUDA_VISIBLE_DEVICES'] = '0'; from klstudy.run import devices; devices.require_cuda()",
         "node", "a GPU error"),
        ("raise RuntimeError('NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error')", "node",
         "a collective's error"),
        ("raise ValueError('a bug')", "other", "an error not classified"),
    ],
)  # fmt: skip
def test_a_failure_is_classified_from_what_the_process_printed(code, kind, what):
    output = printed_by(code)
    assert output, code
    assert failures.classify(output)[:2] == (kind, what), output[-500:]


def test_an_oom_beside_other_ranks_collective_errors_is_deterministic():
    """One rank runs out of memory; the others' NCCL watchdogs report after it: not a bad node."""
    oom = printed_by("import torch; raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')")
    output = oom + "\n[rank3]: Watchdog caught collective operation timeout: WorkNCCL(SeqNum=812) ran for 600000 ms\n"
    assert failures.classify(output)[:2] == ("deterministic", "out of GPU memory")
    assert failures.classify("UserWarning: Can't initialize NVML\nValueError: x")[0] == "other"  # a warning only


def test_the_last_attempt_decides_and_every_failed_node_is_excluded(tmp_path):
    path = tmp_path / "cell.log"
    assert failures.previous_failure(path) is None and failures.failed_nodes(path) == []
    path.write_text(history(("gpu07", "RuntimeError: CUDA error: uncorrectable ECC error encountered"),
                            ("gpu09", "NCCL error (warning only)\nnext-slice: stopped after step 40 with 900 s left"),
                            ("gpu11", "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4)"),
                            ("gpu12", printed_by("import klstudy_no_such_module"))))  # fmt: skip
    last = failures.previous_failure(path)
    assert (last.kind, last.attempt, last.host) == ("deterministic", 4, "gpu12")
    assert failures.failed_nodes(path) == ["gpu07", "gpu11"]  # gpu09's attempt ended a slice: no failure
    assert failures.report(path).startswith("attempt 4 on gpu12 ended with an import error: ModuleNotFoundError")
    assert "not retried" in failures.report(path)
    with open(path, "a") as history_file:  # a further attempt: the history is read again, not served from before
        history_file.write("=== attempt 5: job 85 on gpu13, GPUs 0,1, 2026-11-27T10:05:00+00:00\nValueError: x\n")
    assert (failures.previous_failure(path).attempt, failures.previous_failure(path).kind) == (5, "other")


@pytest.mark.slow  # a whole Snakemake run with retries, 60-120 s: `make test-all`; the classification: tests above
def test_a_deterministic_failure_is_not_retried_on_gpus(tmp_path):
    """K1 in the reward generating with vLLM from an interpreter without vLLM: TRL's ImportError, the same on any
    node. Two retries are allowed: each runs alone on one CPU for a minute (Snakemake's job line shows it), says why,
    and fails; the cell's history keeps the one attempt that trained."""
    config = reduced_config()
    study = config["studies"]["onpolicy"]
    study.update(kl=["k1-reward"], betas=[0.1], seeds=[0])
    study["train"].update(steps=2, generation="vllm")
    config.update(studies={"onpolicy": study}, vllm_python=".venv/bin/python", figures={})
    config["evaluation"]["studies"] = {}
    config["divergence"].update(study="onpolicy", kl=["k1-reward"], steps=[0])
    config["claims"] = claims_it_can_test(config)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    cell = "onpolicy/tiny/k1-reward/beta~0.1/seed~0"
    run = subprocess.run(
        [SNAKEMAKE, "--snakefile", str(ROOT / "Snakefile"), "--directory", str(tmp_path), "--configfile",
         str(tmp_path / "config.yaml"), "--cores", "2", "--retries", "2", "--printshellcmds",
         f"results/runs/{cell}/summary.json"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    out = run.stdout + run.stderr
    assert run.returncode != 0, out[-3000:]
    log = Path(tmp_path / "logs" / "attempts" / "train" / f"{cell}.log").read_text()
    assert log.count("=== attempt ") == 1 and "ImportError" in log, log[-2000:]
    refusals = [line for line in out.splitlines() if line.startswith("attempt 1 on ")]
    assert len(refusals) == 2 and all("ended with an import error" in line for line in refusals), out[-4000:]
    assert all("(deterministic: not retried" in line for line in refusals), refusals
    jobs = [line for line in out.splitlines() if line.strip().startswith("resources:") and "training_slots" in line]
    assert len(jobs) == 3 and "runtime=1," in jobs[1] and "cpus_per_task=1," in jobs[2], jobs
