"""Failures classified (klstudy.run.failures): what ended a training attempt, read from its history, decides its retry.

The messages classified here are the ones Python and torch print (run in a subprocess, not typed); the whole path, a
cell whose first attempt fails deterministically and whose retries refuse before training, runs through Snakemake.
"""

import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from workflow_helpers import ROOT, SNAKEMAKE, claims_it_can_test, reduced_config, snakemake

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
         "deterministic", "CUDA that does not start"),
        ("raise RuntimeError('NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error')", "node",
         "a collective's error"),
        ("raise ValueError('a bug')", "other", "an error not classified"),
    ],
)  # fmt: skip
def test_a_failure_is_classified_from_what_the_process_printed(code, kind, what):
    output = printed_by(code)
    assert output, code
    assert failures.classify(output)[:2] == (kind, what), output[-500:]


# The messages as vLLM 0.30.0 (v1/core/kv_cache_utils.py _check_enough_kv_cache_memory, v1/worker/utils.py
# request_memory) and torch 2.13 (c10/cuda/CUDAFunctions.cpp, raised through torch.cuda's lazy init) print them,
# their format strings filled in. A CPU build of torch has none of them, so they are written out here.
VLLM_OUT_OF_MEMORY = [
    "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing "
    "the engine (this flag also controls CPU memory reservation on the CPU backend, despite its name). See "
    "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.",
    "ValueError: To serve at least one request with the model's max seq len (131072), (16.0 GiB KV cache is needed, "
    "which is larger than the available KV cache memory (9.75 GiB). Based on the available memory, the estimated "
    "maximum model length is 79872. Try increasing `gpu_memory_utilization` (which also controls CPU memory on the "
    "CPU backend) or decreasing `max_model_len` when initializing the engine. See "
    "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.",
    "ValueError: Free memory on device cuda:0 (20.5/79.19 GiB) on startup is less than desired GPU memory utilization"
    " (0.3, 23.76 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
]
CUDA_NOT_STARTING = [
    "RuntimeError: The NVIDIA driver on your system is too old (found version 12080). Please update your GPU driver "
    "by downloading and installing a new version from the URL: http://www.nvidia.com/Download/index.aspx "
    "Alternatively, go to: https://pytorch.org to install a PyTorch version that has been compiled with your version "
    "of the CUDA driver.",
    "RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and installed a "
    "driver from http://www.nvidia.com/Download/index.aspx",
    "RuntimeError: No CUDA GPUs are available",
]


@pytest.mark.parametrize("message", VLLM_OUT_OF_MEMORY + CUDA_NOT_STARTING)
def test_vllms_out_of_memory_and_cuda_that_does_not_start_are_deterministic(message):
    """The same job fails so on the next node: not retried on GPUs (the engine's share or the build must change)."""
    output = f"INFO 12-07 05:00:00 [core.py:100] starting\nTraceback (most recent call last):\n{message}\n"
    kind, what, _ = failures.classify(output + "[rank1]: Watchdog caught collective operation timeout\n")
    assert kind == "deterministic" and what in ("out of vLLM's GPU memory", "CUDA that does not start"), what


def test_an_oom_beside_other_ranks_collective_errors_is_deterministic():
    """One rank runs out of memory; the others' NCCL watchdogs report after it: not a bad node."""
    oom = printed_by("import torch; raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')")
    output = oom + "\n[rank3]: Watchdog caught collective operation timeout: WorkNCCL(SeqNum=812) ran for 600000 ms\n"
    assert failures.classify(output)[:2] == ("deterministic", "out of GPU memory")
    assert failures.classify("UserWarning: Can't initialize NVML\nValueError: x")[0] == "other"  # a warning only


def test_the_last_attempt_decides_and_every_failed_node_is_excluded(tmp_path):
    path = tmp_path / "cell.log"
    assert failures.previous_failure(path) is None and failures.failed_nodes(path, hours=24) == []
    path.write_text(history(("gpu07", "RuntimeError: CUDA error: uncorrectable ECC error encountered"),
                            ("gpu09", "NCCL error (warning only)\nslice: requeueing job 40"),
                            ("gpu11", "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4)"),
                            ("gpu12", printed_by("import klstudy_no_such_module"))))  # fmt: skip
    last = failures.previous_failure(path)
    assert (last.kind, last.attempt, last.host) == ("deterministic", 4, "gpu12")
    recently = datetime.fromisoformat("2026-11-27T10:05:00+00:00").timestamp()  # just after the attempts
    assert failures.failed_nodes(path, hours=24, now=recently) == ["gpu07", "gpu11"]  # gpu09's ended a slice
    assert failures.report(path).startswith("attempt 4 on gpu12 ended with an import error: ModuleNotFoundError")
    assert "not retried" in failures.report(path)
    with open(path, "a") as history_file:  # a further attempt: the history is read again, not served from before
        history_file.write("=== attempt 5: job 85 on gpu13, GPUs 0,1, 2026-11-27T10:05:00+00:00\nValueError: x\n")
    assert (failures.previous_failure(path).attempt, failures.previous_failure(path).kind) == (5, "other")


def test_node_exclusions_expire(tmp_path):
    """A node is avoided for exclude_node_hours after the attempt that failed on it ended (the next one's start)."""
    path = tmp_path / "cell.log"
    path.write_text(history(("gpu07", "RuntimeError: CUDA error: uncorrectable ECC error encountered"),
                            ("gpu08", "ValueError: x")))  # fmt: skip
    ended = datetime.fromisoformat("2026-11-27T10:02:00+00:00").timestamp()  # attempt 2's start
    assert failures.failed_nodes(path, hours=24, now=ended + 23 * 3600) == ["gpu07"]
    assert failures.failed_nodes(path, hours=24, now=ended + 25 * 3600) == []


def test_a_cells_jobs_are_counted_across_drivers_and_slices(tmp_path, capsys):
    """Each SLURM job id once: a requeued slice (the same id again) is no new job; a new driver's retry is. Local
    attempts are not counted. `klstudy last-failure --max-attempts` says the cap was reached, and how to go on."""
    path = tmp_path / "cell.log"
    headers = [("81", "gpu01", "slice: requeueing job 81"), ("81", "gpu02", ""), ("92", "gpu03", "ValueError: x"),
               ("local", "laptop", "ValueError: y"), ("103", "gpu04", "ValueError: z")]  # fmt: skip
    path.write_text("".join(f"=== attempt {n}: job {job} on {host}, GPUs 0, 2026-11-27T10:0{n}:00+00:00\n{out}\n"
                            for n, (job, host, out) in enumerate(headers, 1)))  # fmt: skip
    assert failures.jobs(path) == 3
    assert failures.jobs(tmp_path / "none.log") == 0
    from klstudy.run import cli

    args = cli.build_parser().parse_args(["last-failure", "--history", str(path), "--max-attempts", "3"])
    args.run(args)
    said = capsys.readouterr().out
    assert "3 jobs, the most cluster.max_attempts (3) allows" in said and "move the history away" in said, said
    assert "attempt 5 on gpu04 ended with an error not classified" in said, said


PAPER_CELL = "onpolicy/qwen2.5-7b/k1-reward/beta~0.1/seed~0"


def paper_dry_run(tmp_path, *attempts: tuple[str, str], args=()) -> str:
    """A dry run of one paper training cell whose history holds ``attempts`` (job id, output) at the cluster's names."""
    config = yaml.safe_load((ROOT / "config/paper.yaml").read_text())
    config["cluster"].update(account="lab", cpu_partition="cpu", gpu_partition="gpu")
    (tmp_path / "paper.yaml").write_text(yaml.safe_dump(config))
    path = tmp_path / f"logs/attempts/train/{PAPER_CELL}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"=== attempt {n}: job {job} on gpu0{n}, GPUs 0, 2026-11-27T10:0{n}:00+00:00\n{out}\n"
                            for n, (job, out) in enumerate(attempts, 1)))  # fmt: skip
    return snakemake(f"results/runs/{PAPER_CELL}/summary.json", "-n", "-p", "--cores", "1", "--configfile",
                     str(tmp_path / "paper.yaml"), *args, cwd=tmp_path)  # fmt: skip


def planned(out: str, rule: str) -> str:
    """The resources line of ``rule``'s job in a dry run, or "" where it plans none."""
    found = re.search(rf"rule {rule}:.*?\n\s+resources: (.*?)\n", out, re.S)
    return found.group(1) if found else ""


@pytest.mark.parametrize(
    "attempts, refused",
    [
        ([(str(n), "ValueError") for n in range(1, 5)], True),  # cluster.max_attempts (4) jobs
        ([("81", "ValueError"), ("92", "torch.OutOfMemoryError: CUDA out of memory.")], True),
        ([("81", "slice: requeueing job 81")] * 4 + [("92", "ValueError")], False),  # 2 jobs: slices are one job
        ([("local", "torch.OutOfMemoryError: CUDA out of memory.")], False),  # one machine's run starts again
    ],
)
def test_a_refused_cell_is_failed_on_the_submit_host_and_never_submitted(tmp_path, attempts, refused):
    """A cell capped across drivers, or whose last SLURM attempt failed deterministically, is made by the local rule
    refused_train_rl, which fails naming why (last-failure); the others are submitted as train_rl."""
    out = paper_dry_run(tmp_path, *attempts)
    assert bool(planned(out, "refused_train_rl")) is refused and bool(planned(out, "train_rl")) is not refused, out
    if refused:
        assert "last-failure --history" in out and "--max-attempts 4" in out


def test_a_retry_after_a_deterministic_failure_in_the_run_is_the_smallest_job(tmp_path):
    """Snakemake retries by count alone: the retry is submitted, but with one CPU, 1 GB, five minutes and no GPU, in
    the CPU partition, where its shell names the failure and exits (REFUSED_RETRY). --attempt 2: its resources."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string
    from test_workflow import _Resources

    first = planned(paper_dry_run(tmp_path, ("local", "ValueError")), "train_rl")
    retry = planned(paper_dry_run(tmp_path, ("local", "OutOfMemoryError: x"), args=["--attempt", "2"]), "train_rl")
    assert "retry_refused=0" in first and "gres=gpu:8" in first and "cpus_per_task=64" in first, first
    assert "--open-mode=append" in first, "a requeued slice's SLURM log is appended to"
    resources = _Resources((key, int(value) if value.isdigit() else value)
                           for key, value in (item.split("=", 1) for item in retry.split(", ")))  # fmt: skip
    assert resources["retry_refused"] == 1, resources
    assert not {"gres", "slurm_extra", "constraint", "local_gpus"} & resources.keys(), "no GPU asked"
    assert (resources["slurm_partition"], resources["slurm_account"]) == ("cpu", "lab"), resources
    job = type("Job", (), {"resources": resources, "threads": 64})()
    params = dict(run_uuid="u", slurm_logfile="log", comment_str="c", account="", partition="", workdir=None)
    words = (get_submit_command(job, params) + set_gres_string(job)).split()
    assert {"--cpus-per-task=1", "--mem", "1000", "-t", "5"} <= set(words), words
    assert not any("gpu" in word for word in words), words


@pytest.mark.workflow  # stages the tiny inputs, then a local job that fails at once (about 30 s)
def test_the_refusal_names_the_failure_and_leaves_what_the_cell_wrote(tmp_path):
    config = reduced_config()
    study = config["studies"]["onpolicy"]
    study.update(kl=["k1-reward"], betas=[0.1], seeds=[0])
    config.update(studies={"onpolicy": study}, figures={})
    config["evaluation"]["studies"] = {}
    config["divergence"].update(study="onpolicy", kl=["k1-reward"], steps=[0])
    config["claims"] = claims_it_can_test(config)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    cell = "onpolicy/tiny/k1-reward/beta~0.1/seed~0"
    (tmp_path / f"logs/attempts/train/{cell}.log").parent.mkdir(parents=True)
    (tmp_path / f"logs/attempts/train/{cell}.log").write_text(history(("gpu07", "ImportError: no vllm")))
    (tmp_path / f"results/runs/{cell}").mkdir(parents=True)
    (tmp_path / f"results/runs/{cell}/metrics.jsonl").write_text('{"step": 1}\n')
    run = subprocess.run([SNAKEMAKE, "--snakefile", str(ROOT / "Snakefile"), "--directory", str(tmp_path), "--cores",
                          "2", f"results/runs/{cell}/summary.json", "--configfile", str(tmp_path / "config.yaml")],
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    out = run.stdout + run.stderr
    assert run.returncode != 0 and "rule refused_train_rl:" in out and "rule train_rl:" not in out, out[-3000:]
    assert "attempt 1 on gpu07 ended with an import error: ImportError: no vllm (deterministic: not retried" in out
    assert (tmp_path / f"results/runs/{cell}/metrics.jsonl").read_text() == '{"step": 1}\n'


@pytest.mark.slow  # a whole Snakemake run with retries, 60-120 s: `make test-all`; the classification: tests above
def test_a_deterministic_failure_is_not_retried_on_gpus(tmp_path):
    """K1 in the reward generating with vLLM from an interpreter without vLLM: TRL's ImportError, the same on any
    node. Two retries are allowed: each says why and fails before it trains; the cell's history keeps the one attempt
    that trained."""
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
    assert len(jobs) == 3 and "retry_refused=0" in jobs[0] and "retry_refused=1" in jobs[2], jobs
