"""`snakemake --profile slurm` against a real single-node SLURM brought up by tests/slurm/local-slurm.sh.

docs/running.md's commands for the paper (dry run, run, status, report) run as written, in a directory laid out as a
clone whose config/paper.yaml is the reduced embedded study, with the local cluster's account and partition; every
job must show in `sacct` and every output must equal a local run's. Then a training job is killed by SLURM at its time
limit once it has saved a checkpoint, resubmitted by the profile's `retries` within its partition's MaxTime, and
resumes from its checkpoint to the metrics of an uninterrupted run. A training job asking for GPUs gets them on one
node and starts a process per GPU; the preflight's SLURM rows pass and fail against the local cluster; and a driver
run as a SLURM job (slurm/driver.sbatch) brought to its time limit leaves its jobs to its successor, which adopts
them, training and evaluation, and submits a new cell at once. Needs root (the script
installs slurm-wlm, slurmdbd, munge and MariaDB if missing); `make test-slurm` runs it (marker `slurm`).
"""

import json
import os
import re
import shlex
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from test_docs import slurm_commands
from workflow_helpers import (
    ROOT,
    SNAKEMAKE,
    assert_same_results,
    claims_it_can_test,
    reduced_config,
    snakemake,
    without_times,
)

from klstudy.config import CHECKPOINT_COMPLETE, SLICE_ENDED

pytestmark = pytest.mark.slurm

SCRIPT = ROOT / "tests" / "slurm" / "local-slurm.sh"
# Run times of whole Snakemake invocations are bounded, so that a hung scheduler fails the test.
HARD_LIMIT = 900


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if os.geteuid() != 0 and not os.environ.get("CI"):
        pytest.skip("a local SLURM needs root (apt-get, daemons); CI runs this as root")
    # .ci/run names the directory, so that its EXIT trap can stop the daemons even if pytest itself is killed.
    base = Path(os.environ.get("KLSTUDY_SLURM_DIR") or tmp_path_factory.mktemp("slurm"))
    try:
        up = subprocess.run(
            ["timeout", "-s", "KILL", "600", str(SCRIPT), "up", str(base)], capture_output=True, text=True
        )
        assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-4000:]
        # The node's GPUs are empty files (local-slurm.sh): jobs given them train on the CPU (devices.require_cuda).
        yield {**os.environ, "SLURM_CONF": str(base / "slurm.conf"), "KLSTUDY_SIMULATED_GPUS": "1"}
    finally:
        subprocess.run(["timeout", "-s", "KILL", "120", str(SCRIPT), "down", str(base)], check=False)


# Snakemake polls this small cluster more often. (The documented commands name no account or partition: the config's
# `cluster` keys do, and unset, as here, SLURM's defaults for the user are used.)
QUICK_POLLS = ["--slurm-init-seconds-before-status-checks", "2", "--seconds-between-status-checks", "2",
               "--latency-wait", "5"]  # fmt: skip


def documented(kind: str) -> list[str]:
    """docs/running.md's line of this kind (dryrun, run, status, report) for the paper, split into words."""
    lines = slurm_commands()
    setup, pilots, (stage, dry_run, run, status, report) = lines[:2], lines[2:8], lines[8:]
    assert setup == ["make venv", "make vllm-env VLLM_FLAVOUR=gpu"], setup  # what make test and make test-vllm build
    assert all("config/pilot" in line for line in pilots[:-1]), pilots  # the GPU pilots: not on this CPU
    assert pilots[-1].endswith("klstudy calibrate"), pilots  # prices the grid from pilot-7b's results
    assert stage == "make stage", stage  # the hub's inputs, on the login node: the local run stages its own
    assert all("config/paper.yaml config/cluster.yaml" in line for line in (dry_run, run, report)), lines
    line = {"dryrun": dry_run, "run": run, "status": status, "report": report}[kind]
    return shlex.split(line)


def profile_command(workdir: Path, config_path: Path, *targets: str) -> list[str]:
    """docs/running.md's run command for the workflow of this repository, run in ``workdir`` on ``config_path``."""
    words = documented("run")
    assert words[0] == ".venv/bin/snakemake", words  # Snakemake from the main environment, as the docs say
    return [
        "timeout", "-s", "KILL", str(HARD_LIMIT), SNAKEMAKE, *targets, *words[1:], *QUICK_POLLS,
        "--snakefile", str(ROOT / "Snakefile"), "--directory", str(workdir), "--configfile", str(config_path),
    ]  # fmt: skip


def like_a_clone(workdir: Path, config: dict) -> None:
    """``workdir`` laid out as a clone of this repository (its files linked) whose config/paper.yaml is ``config``:
    the documented commands then run there as they are written."""
    generated = {"results", "figures", "logs", "report.html", ".snakemake", ".git"}
    for entry in ROOT.iterdir():
        if entry.name not in generated and entry.name != "config" and not entry.name.startswith(".venv-"):
            (workdir / entry.name).symlink_to(entry)
    (workdir / "config").mkdir()
    for entry in (ROOT / "config").iterdir():
        if entry.name != "paper.yaml":
            (workdir / "config" / entry.name).symlink_to(entry)
    (workdir / "config" / "paper.yaml").write_text(yaml.safe_dump(config))


def documented_run(env, workdir: Path, kind: str, *extra: str) -> str:
    words = documented(kind)
    command = ["timeout", "-s", "KILL", str(HARD_LIMIT), *words, *extra]
    run = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True)
    assert run.returncode == 0, f"{' '.join(words)}:\n" + run.stdout[-3000:] + run.stderr[-5000:]
    return run.stdout + run.stderr


def sacct(env) -> pd.DataFrame:
    out = subprocess.run(
        ["sacct", "-n", "-X", "-P", "--format=JobID,JobName,State,Elapsed,Comment", "--starttime=now-1days"],
        env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    rows = [line.split("|") for line in out.splitlines() if line.strip()]
    return pd.DataFrame(rows, columns=["job_id", "name", "state", "elapsed", "comment"])


SUBMITTED_RULES = (
    "toy_bias_variance", "toy_fixed_points", "toy_monte_carlo", "toy_atlas",
    "train_rl", "evaluate_cell", "evaluate_base", "divergence",
)  # fmt: skip


def test_the_documented_commands_run_the_study_through_sbatch_and_equal_a_local_run(cluster, reduced_run, tmp_path):
    """docs/running.md's dry run, run, status and report, as written, on the reduced study."""
    local, config = reduced_run
    like_a_clone(tmp_path, config)
    before = set(sacct(cluster).job_id)
    planned = documented_run(cluster, tmp_path, "dryrun")
    assert "train_rl" in planned and set(sacct(cluster).job_id) == before, "a dry run submits nothing"
    output = documented_run(cluster, tmp_path, "run", *QUICK_POLLS)

    jobs = sacct(cluster)
    jobs = jobs[~jobs.job_id.isin(before)]
    submitted = sum(output.count(f"rule {rule}:") for rule in SUBMITTED_RULES)
    assert submitted > 0 and len(jobs) == submitted, output[-3000:]
    assert set(jobs.state) == {"COMPLETED"}
    # the profile's names, and comments that say the rule and the cell (docs/running.md's squeue line shows both)
    assert all(name.startswith("klstudy_") for name in jobs.name), set(jobs.name)
    runs = (tmp_path / "results/runs").glob("*/*/*/beta~*/seed~*/summary.json")  # study/model/kl/beta~β/seed~s
    parts = [summary.parent.relative_to(tmp_path / "results/runs").parts for summary in runs]
    cells = {"rule_train_rl_wildcards_" + "_".join(part.split("~")[-1] for part in cell) for cell in parts}
    assert set(jobs.comment[jobs.comment.str.startswith("rule_train_rl_")]) == cells
    logs = sorted((tmp_path / "logs" / "slurm").rglob("*.log"))
    assert sorted(p.stem for p in logs) == sorted(jobs.job_id)  # one SLURM log per job, named by its job id

    assert_same_results(local, tmp_path, config)
    cells = len(pd.read_csv(tmp_path / "results" / "tables" / "cells.csv"))
    assert f"cells: {cells}, {cells} ok" in documented_run(cluster, tmp_path, "status")
    documented_run(cluster, tmp_path, "report")
    assert (tmp_path / "report.html").stat().st_size > 0


def time_limit_config() -> dict:
    """One cell, trained twice: through SLURM (study `slurm`) and locally (`local`)."""
    config = reduced_config()
    study = config["studies"]["onpolicy"]
    study.update(kl=["k1-reward"], betas=[0.1], seeds=[0])
    study["train"].update(steps=STEPS, checkpoint_every=CHECKPOINT_EVERY, eval_every=STEPS // 2)
    config["studies"] = {"slurm": study, "local": json.loads(json.dumps(study))}
    config["evaluation"]["studies"] = {}
    config["divergence"].update(study="slurm", kl=["k1-reward"], steps=[0])
    config["figures"] = {}
    config["claims"] = claims_it_can_test(config)
    # In the `short` partition (MaxTime 20 minutes, local-slurm.sh): a retry at twice the runtime would ask 24, which
    # SLURM refuses (EnforcePartLimits=ALL); capped at the partition's MaxTime, it asks 20. The test cuts the first
    # attempt's limit.
    for spec in config["resources"].values():
        spec["runtime"] = 12  # every kind of job must fit the partition (the preflight checks it)
    config["cluster"] = {"cpu_partition": "short"}
    # 30 steps an epoch (120 prompts, 4 a step), so that the resumed run crosses epoch boundaries.
    config["data"]["math_train"].update(levels=["add2", "sub2"], size=120)
    return config


# The test waits for events, not for a speed. The first attempt stops itself (SIGSTOP, faults.FaultAtStep) once its
# checkpoint at STOP_AT is complete: a job that hangs. The test then cuts its time limit to one minute (`scontrol
# update`, as an administrator would); SLURM checks limits every 30 s (slurmctld's PERIODIC_TIMEOUT) and kills the job
# KillWait (5 s here) later: state TIMEOUT. The profile's retry resumes from that checkpoint (a resumed run does not
# stop) and finishes. However slowly or quickly the machine trains, the kill comes after the checkpoint and before the
# end. (The test used to give the job a 1-minute limit from the start, sized from a probe's speed, and failed under
# load when the job was killed before its first checkpoint.)
STEPS, CHECKPOINT_EVERY, STOP_AT = 100, 25, 50
CELL = "results/runs/{study}/tiny/k1-reward/beta~0.1/seed~0"
CHECKPOINTS = "results/checkpoints/slurm/tiny/k1-reward/beta~0.1/seed~0"  # train.smk: params.checkpoints


def cut_time_limit_once_stopped(env, workdir: Path, known_jobs: set, driver: subprocess.Popen) -> str:
    """Wait until the new training job has completed its checkpoint at STOP_AT (and so stopped), then set its time
    limit to one minute; its job id."""
    deadline = time.monotonic() + HARD_LIMIT
    while not (workdir / CHECKPOINTS / f"checkpoint-{STOP_AT}" / CHECKPOINT_COMPLETE).exists():
        assert driver.poll() is None, "snakemake ended before the checkpoint"
        assert time.monotonic() < deadline, "no checkpoint"
        time.sleep(0.5)
    squeue = ["squeue", "--noheader", "--states=RUNNING", "--format=%i"]
    running = subprocess.run(squeue, env=env, capture_output=True, text=True, check=True).stdout.split()
    job = [j for j in running if j not in known_jobs]
    assert len(job) == 1, running
    subprocess.run(["scontrol", "update", f"JobId={job[0]}", "TimeLimit=1"], env=env, check=True)
    return job[0]


SHORT_MAX_TIME = "00:20:00"  # the `short` partition's (local-slurm.sh)


def time_limit(env, job: str) -> str:
    return subprocess.run(
        ["sacct", "-n", "-X", "-P", "-j", job, "--format=Timelimit"], env=env, capture_output=True, text=True,
        check=True,
    ).stdout.strip()  # fmt: skip


@pytest.mark.slow  # 200 s; slices now keep a training job from its time limit: this is the path when they fail
def test_a_job_killed_at_its_time_limit_resumes_from_its_checkpoint(cluster, tmp_path):
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(time_limit_config()))
    local_cell, slurm_cell = (tmp_path / CELL.format(study=s) for s in ("local", "slurm"))
    # The uninterrupted run; it also stages the data and builds the model both runs share.
    snakemake(f"{CELL.format(study='local')}/summary.json", "--cores", "2", "--configfile", str(config_path),
              cwd=tmp_path, timeout=HARD_LIMIT)  # fmt: skip

    before = set(sacct(cluster).job_id)
    command = profile_command(tmp_path, config_path, f"{CELL.format(study='slurm')}/summary.json")
    env = {**cluster, "KLSTUDY_STOP_AT_STEP": str(STOP_AT)}  # sbatch hands the environment on to the job
    with subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as driver:
        cut = cut_time_limit_once_stopped(cluster, tmp_path, before, driver)
        output = driver.communicate()[0].decode(errors="replace")
    assert driver.returncode == 0, output[-6000:]
    jobs = sacct(cluster)
    jobs = jobs[~jobs.job_id.isin(before)]
    assert list(jobs.state) == ["TIMEOUT", "COMPLETED"] and jobs.job_id.iloc[0] == cut, jobs  # killed, retried
    assert time_limit(cluster, jobs.job_id.iloc[1]) == "00:12:00", "a training retry asks its runtime: it slices"

    summary = json.loads((slurm_cell / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["steps_done"] == STEPS, summary
    assert summary["resumed_from"].endswith(f"checkpoint-{STOP_AT}"), summary  # where the first attempt stopped
    for name in ("metrics.jsonl", "heldout.jsonl"):
        runs = [without_times(pd.read_json(cell / name, lines=True)) for cell in (local_cell, slurm_cell)]
        pd.testing.assert_frame_equal(*runs, obj=name, check_like=True)  # resumed files are rewritten


SLICES = 3


def warn_each_slice(env, workdir: Path, cell: str, known_jobs: set, driver: subprocess.Popen) -> str:
    """SLURM's warning before the time limit, sent when the test chooses: `scancel --signal=USR1` reaches every
    process of the job's steps and not the batch shell, as sbatch --signal=USR1@N does at N seconds before the limit
    (the job asks for that: test_slices.py). Sent once the training job runs, and again once each requeued run has
    cleared the slice mark (it is training again), SLICES - 1 times in all; the job's id."""
    run = cell.format(study="slurm")
    checkpoints, metrics = workdir / run.replace("results/runs", "results/checkpoints"), workdir / run / "metrics.jsonl"
    deadline = time.monotonic() + HARD_LIMIT

    def wait(condition, what):
        while not condition():
            assert driver.poll() is None, f"snakemake ended before {what}"
            assert time.monotonic() < deadline, f"never {what}"
            time.sleep(0.5)

    wait(lambda: metrics.exists() and metrics.read_text().strip(), "a step was trained")
    running = subprocess.run(["squeue", "--noheader", "--states=RUNNING", "--format=%i"], env=env,
                             capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    (job,) = [j for j in running if j not in known_jobs]
    for _ in range(SLICES - 1):
        subprocess.run(["scancel", "--signal=USR1", job], env=env, check=True)
        wait(lambda: (checkpoints / SLICE_ENDED).exists(), "the slice ended")
        wait(lambda: not (checkpoints / SLICE_ENDED).exists(), "the requeued job trained again")
    return job


@pytest.mark.slow  # `make test-all` (CI runs the documented commands and the preflight of this file)
def test_a_cell_warned_of_its_time_limit_runs_in_slices_of_one_job_to_an_uninterrupted_runs_end(cluster, tmp_path):
    """Each warning stops the training after the step it came in, saves, and the job requeues itself: SLURM shows one
    job, requeued twice with the same time limit; Snakemake counts no failure; the metrics equal an uninterrupted
    run's (K1 in the loss moves the policy from the first step, so an equal trajectory is not a constant one)."""
    config = time_limit_config()
    for study in config["studies"].values():
        study["kl"] = ["k1-loss"]
    config["divergence"]["kl"] = ["k1-loss"]
    config["claims"] = claims_it_can_test(config)
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    cell = CELL.replace("k1-reward", "k1-loss")
    snakemake(f"{cell.format(study='local')}/summary.json", "--cores", "2", "--configfile", str(config_path),
              cwd=tmp_path, timeout=HARD_LIMIT)  # fmt: skip

    before = set(sacct(cluster).job_id)
    command = profile_command(tmp_path, config_path, f"{cell.format(study='slurm')}/summary.json")
    with subprocess.Popen(command, cwd=ROOT, env=cluster, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as driver:
        job = warn_each_slice(cluster, tmp_path, cell, before, driver)
        output = driver.communicate()[0].decode(errors="replace")
    assert driver.returncode == 0, output[-6000:]
    assert "Error in rule" not in output and "attempt 2" not in output, output[-3000:]
    assert set(sacct(cluster).job_id) - before == {job}
    runs = subprocess.run(["sacct", "-n", "-X", "-P", "-D", "-j", job, "--format=State,Timelimit"], env=cluster,
                          capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    assert runs == ["REQUEUED|00:12:00", "REQUEUED|00:12:00", "COMPLETED|00:12:00"], runs
    history = tmp_path / "logs" / "attempts" / "train" / cell.format(study="slurm").removeprefix("results/runs/")
    lines = Path(f"{history}.log").read_text().splitlines()
    headers = [line for line in lines if line.startswith("=== attempt")]
    assert [f"job {job} on" in header for header in headers] == [True] * SLICES, headers  # each slice's output kept
    assert sum(line == f"slice: requeueing job {job}" for line in lines) == SLICES - 1, lines[-20:]

    sliced, local = (tmp_path / cell.format(study=study) for study in ("slurm", "local"))
    summary = json.loads((sliced / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["steps_done"] == STEPS, summary
    for name in ("metrics.jsonl", "heldout.jsonl"):
        frames = [without_times(pd.read_json(c / name, lines=True)) for c in (local, sliced)]
        pd.testing.assert_frame_equal(*frames, obj=name, check_like=True)
    assert pd.read_json(local / "metrics.jsonl", lines=True)["kl_k1"].abs().max() > 0  # the policy moved


# ------------------------------------------------------------------------------------------- GPUs, preflight, driver


def small_grid(cells: int = 1, steps: int = 3) -> dict:
    """Training cells of `cells` seeds of K1 in the reward, `steps` steps each; no evaluation or figures."""
    config = reduced_config()
    study = config["studies"]["onpolicy"]
    study.update(kl=["k1-reward"], betas=[0.1], seeds=list(range(cells)))
    study["train"].update(steps=steps, eval_every=steps, checkpoint_every=steps)
    config["studies"] = {"onpolicy": study}
    config["evaluation"]["studies"] = {}
    config["divergence"].update(study="onpolicy", kl=["k1-reward"], steps=[0])
    config["figures"] = {}
    config["claims"] = claims_it_can_test(config)
    return config


def rule_jobs(env, workdir: Path, rule: str) -> pd.DataFrame:
    """sacct's rows of the jobs of ``rule`` that ran in ``workdir``, with each job's wildcards (its SLURM log's folder:
    logs/slurm/rule_<rule>/<wildcards>/<jobid>.log)."""
    logs = {log.stem: log.parent.name for log in (workdir / "logs" / "slurm" / f"rule_{rule}").rglob("*.log")}
    jobs = sacct(env)
    jobs = jobs[jobs.job_id.isin(logs)].copy()
    jobs["wildcards"] = jobs.job_id.map(logs)
    return jobs


@pytest.mark.slow  # 90 s: `make test-all`
def test_a_gpu_training_job_gets_its_gpus_on_one_node_and_starts_a_process_per_gpu(cluster, tmp_path):
    """A study's own gpus = 2 (resources.train.gpus = 1 for the others) on one node: the job asks --gres=gpu:2
    --nodes=1 in the gpu partition, SLURM's allocation (scontrol show job -d) is one node with two GPUs, and
    accelerate starts two processes (gloo on the CPU: the GPUs are simulated, local-slurm.sh)."""
    config = small_grid()
    config["studies"]["onpolicy"]["train"]["accelerate_config"] = "config/accelerate/cpu-2proc.yaml"
    config["studies"]["onpolicy"]["gpus"] = 2
    config["resources"]["train"].update(gpus=1, cpus=1)
    config["cluster"] = {"gpu_partition": "gpu", "account": "klstudy"}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    cell = "results/runs/onpolicy/tiny/k1-reward/beta~0.1/seed~0"
    run = subprocess.run(profile_command(tmp_path, tmp_path / "config.yaml", f"{cell}/summary.json"),
                         cwd=ROOT, env=cluster, capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    (job,) = rule_jobs(cluster, tmp_path, "train_rl").job_id
    shown = subprocess.run(["scontrol", "show", "job", "-d", job], env=cluster, capture_output=True, text=True).stdout
    assert "NumNodes=1 " in shown and "Partition=gpu " in shown, shown
    assert "TresPerNode=gres:gpu:2" in shown and "JOB_GRES=gpu:2" in shown, shown
    launch = json.loads((tmp_path / cell / "summary.json").read_text())["launch"]
    assert launch["processes"] == 2, launch  # the config's GPUs per node × nodes, which gres gave the job


@pytest.mark.slow  # 90 s: `make test-all`
def test_a_training_job_that_sees_no_cuda_device_is_not_retried_on_gpus(cluster, tmp_path):
    """Without KLSTUDY_SIMULATED_GPUS a job given the local SLURM's GPUs (empty files) sees no CUDA device and fails
    at once (devices.require_cuda): CUDA that does not start, the same on the next node (failures.py). Its retries
    say why and fail before they train; the cell's history keeps the one attempt that trained."""
    config = small_grid()
    config["resources"]["train"].update(gpus=1, cpus=1)
    config["cluster"] = {"gpu_partition": "gpu"}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    cell = "results/runs/onpolicy/tiny/k1-reward/beta~0.1/seed~0"
    env = {key: value for key, value in cluster.items() if key != "KLSTUDY_SIMULATED_GPUS"}
    before = set(sacct(cluster).job_id)
    # Run to its end: Snakemake with the SLURM plugin takes minutes to stop after a SIGTERM, longer than to finish.
    run = subprocess.run(profile_command(tmp_path, tmp_path / "config.yaml", f"{cell}/summary.json"), cwd=ROOT,
                         env=env, capture_output=True, text=True)  # fmt: skip
    assert run.returncode != 0
    history = (tmp_path / "logs/attempts/train/onpolicy/tiny/k1-reward/beta~0.1/seed~0.log").read_text()
    assert history.count("=== attempt ") == 1 and "sees no CUDA device" in history, history[-2000:]
    jobs = sorted(set(sacct(cluster).job_id) - before, key=int)
    assert len(jobs) == 4, jobs  # the attempt and its 3 retries (the Snakefile's, on a cluster)
    refusal = tmp_path / "logs/slurm/rule_train_rl/onpolicy_tiny_k1-reward_0.1_0" / f"{jobs[1]}.log"
    assert "CUDA that does not start" in refusal.read_text() and "(deterministic: not retried" in refusal.read_text()


def preflight_rows(env, config: dict, tmp_path: Path) -> dict[str, str]:
    path = tmp_path / "preflight.yaml"
    path.write_text(yaml.safe_dump(config))
    run = subprocess.run(
        [str(ROOT / ".venv/bin/python"), "-m", "klstudy", "preflight", "--config", str(path), "--root", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode in (0, 1), run.stderr
    rows = [line for line in run.stdout.splitlines() if re.search(r"\s(ok|FAIL|skip)\s", line)]
    return {re.split(r"\s{2,}", row)[0]: row for row in rows}


def test_the_preflight_checks_the_local_cluster(cluster, tmp_path):
    """SLURM's own verdict on each kind of job (sbatch --test-only): what the cluster takes passes; a partition it
    lacks, GPUs of a kind its node lacks and a runtime above the short partition's MaxTime fail in SLURM's words (the
    local cluster sets EnforcePartLimits=ALL); a runtime above a QOS's MaxWall, which sbatch takes here, fails too."""
    config = small_grid()
    for spec in config["resources"].values():
        spec["runtime"] = 20  # the short partition's MaxTime
    config["resources"]["train"].update(gpus=2, runtime=30)  # in the gpu partition: no limit
    config["cluster"] = {"account": "klstudy", "cpu_partition": "short", "gpu_partition": "gpu"}
    rows = preflight_rows(cluster, config, tmp_path)
    assert all(" FAIL " not in row for row in rows.values()), rows
    assert "in partition gpu" in rows["train: sbatch --test-only"], rows
    subprocess.run(["sacctmgr", "-i", "add", "qos", "tenminutes", "MaxWall=10"], env=cluster, check=True)
    config["resources"]["toy"]["runtime"] = 30
    config["cluster"].update(gpu_model="a100", qos="tenminutes")
    rows = {what: row for what, row in preflight_rows(cluster, config, tmp_path).items() if " FAIL " in row}
    assert "Requested time limit is invalid" in rows["toy: sbatch --test-only"], rows
    assert "--gres=gpu:a100:2" in rows["train: sbatch --test-only"], rows
    assert "Requested node configuration is not available" in rows["train: sbatch --test-only"], rows
    assert "20 min > 10 min" in rows["evaluate: sbatch --test-only"], rows
    config["cluster"].update(gpu_partition="nope", gpu_model=None, qos=None)
    row = preflight_rows(cluster, config, tmp_path)["train: sbatch --test-only"]
    assert " FAIL " in row and "Invalid partition name specified" in row, row


DRIVER_FLAGS = "--partition=shared --time=30 --mem=1000"


def submit_driver(env, workdir: Path, targets: list[Path]) -> str:
    """slurm/driver.sbatch submitted as `make driver` does (its flags also in KLSTUDY_DRIVER_FLAGS, for a successor),
    polling the queue every 2 s when it adopts jobs."""
    command = ["sbatch", "--parsable", *DRIVER_FLAGS.split(), "slurm/driver.sbatch",
               *(str(t.relative_to(workdir)) for t in targets), *QUICK_POLLS]  # fmt: skip
    env = {**env, "KLSTUDY_DRIVER_FLAGS": DRIVER_FLAGS, "KLSTUDY_ADOPT_POLL": "2"}
    out = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, check=True).stdout
    return out.strip()


def wait_for(what: str, condition, deadline: float) -> None:
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(1)


def job_state(env, job: str) -> str:
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job, "--format=State"], env=env, capture_output=True,
                         text=True).stdout  # fmt: skip
    return out.strip().split(" ")[0]


def running_jobs(env, workdir: Path, rule: str) -> list[str]:
    jobs = rule_jobs(env, workdir, rule)
    return sorted(jobs[jobs.state == "RUNNING"].job_id)


def squeue_state(env, job: str) -> str:
    return subprocess.run(
        ["squeue", "-h", "-j", job, "-o", "%T"], env=env, capture_output=True, text=True
    ).stdout.strip()


def queued(env, workdir: Path, comment: str) -> tuple[str, str]:
    """(id, state) of ``workdir``'s job in the queue that the SLURM plugin commented ``comment``, else ("", "")."""
    out = subprocess.run(["squeue", "-h", "-o", "%i|%T|%k|%Z"], env=env, capture_output=True, text=True).stdout
    rows = [line.split("|", 3) for line in out.splitlines()]
    return next(((job, state) for job, state, note, directory in rows
                 if note == comment and Path(directory).resolve() == workdir.resolve()), ("", ""))  # fmt: skip


def slice_and_hold(env, workdir: Path, job: str, seed: int, deadline: float) -> None:
    """SLURM's warning to ``job`` (as in the slice test): it saves and requeues itself; held once pending, so that it
    is still a pending requeued job when the next driver starts."""
    checkpoints = workdir / f"results/checkpoints/onpolicy/tiny/k1-reward/beta~0.1/seed~{seed}"
    metrics = workdir / f"results/runs/onpolicy/tiny/k1-reward/beta~0.1/seed~{seed}/metrics.jsonl"
    wait_for("a step trained", lambda: metrics.exists() and metrics.read_text().strip(), deadline)  # it listens
    subprocess.run(["scancel", "--signal=USR1", job], env=env, check=True)
    wait_for("the slice's end", lambda: (checkpoints / SLICE_ENDED).exists(), deadline)
    wait_for("the requeued job pending", lambda: squeue_state(env, job) == "PENDING", deadline)
    subprocess.run(["scontrol", "hold", job], env=env, check=True)


@pytest.mark.slow  # minutes: `make test-all`
def test_a_drivers_successor_adopts_its_jobs_and_submits_new_cells_at_once(cluster, tmp_path):
    """slurm/driver.sbatch runs Snakemake as a SLURM job, at most two of three cells training (cluster.training_slots),
    and the base model's evaluation. While it evaluates and one cell trains (both suspended, so that they outlast what
    follows on any machine) and the other's job has requeued itself for its next slice (held pending), the driver's
    time limit comes: it submits its successor and ends, leaving all three in the queue. With three slots now, the
    successor adopts them and submits the third cell while they are still there. Each cell is trained by one job, the
    sliced one's under its first id, requeued, and the evaluation made by one job; nothing is cancelled."""
    config = small_grid(cells=3, steps=400)  # the test suspends and holds jobs: their length needs no margin
    for spec in config["resources"].values():
        spec["cpus"] = 1
    like_a_clone(tmp_path, config)
    cluster_yaml = tmp_path / "config" / "cluster.yaml"  # the cluster's names, set once (docs/running.md)
    cluster_yaml.unlink()
    cluster_yaml.write_text(yaml.safe_dump({"cluster": {"cpu_partition": "shared", "training_slots": 2}}))
    (tmp_path / "logs").mkdir()
    cells = [tmp_path / f"results/runs/onpolicy/tiny/k1-reward/beta~0.1/seed~{seed}/summary.json" for seed in range(3)]
    evaluated = tmp_path / f"results/evals/base/tiny/template~on/{config['evaluation']['tasks'][0]}.json"
    deadline = time.monotonic() + HARD_LIMIT
    first = submit_driver(cluster, tmp_path, [*cells, evaluated])
    evaluating = "rule_evaluate_base_wildcards_tiny_on"  # the plugin's comment: the rule and its wildcards
    wait_for("the evaluation running", lambda: queued(cluster, tmp_path, evaluating)[1] == "RUNNING", deadline)
    evaluation = queued(cluster, tmp_path, evaluating)[0]
    subprocess.run(["scontrol", "suspend", evaluation], env=cluster, check=True)
    wait_for("two cells training", lambda: len(running_jobs(cluster, tmp_path, "train_rl")) == 2, deadline)
    jobs = rule_jobs(cluster, tmp_path, "train_rl")
    seed_of = dict(zip(jobs.job_id, jobs.wildcards.str.rsplit("_", n=1).str[-1].astype(int), strict=True))
    running, sliced = sorted(seed_of, key=int)
    running_seed, sliced_seed = seed_of[running], seed_of[sliced]
    subprocess.run(["scontrol", "suspend", running], env=cluster, check=True)
    slice_and_hold(cluster, tmp_path, sliced, sliced_seed, deadline)

    elapsed = subprocess.run(["squeue", "-h", "-j", first, "-o", "%M"], env=cluster, capture_output=True,
                             text=True).stdout.strip()  # fmt: skip
    minutes = sum(int(part) * 60**i for i, part in enumerate(reversed(elapsed.split(":")))) // 60 + 4
    subprocess.run(["scontrol", "update", f"JobId={first}", f"TimeLimit={minutes}"], env=cluster, check=True)
    cluster_yaml.write_text(yaml.safe_dump({"cluster": {"cpu_partition": "shared", "training_slots": 3}}))
    wait_for("the first driver's end", lambda: job_state(cluster, first) == "COMPLETED", deadline)
    successor = re.search(r"successor job (\d+) submitted", (tmp_path / "logs" / f"driver-{first}.log").read_text())
    assert successor, (tmp_path / "logs" / f"driver-{first}.log").read_text()[-3000:]
    wait_for("the third cell submitted", lambda: len(rule_jobs(cluster, tmp_path, "train_rl")) == 3, deadline)
    still = (squeue_state(cluster, running), squeue_state(cluster, sliced), squeue_state(cluster, evaluation))
    assert still == ("SUSPENDED", "PENDING", "SUSPENDED"), still
    subprocess.run(["scontrol", "resume", running], env=cluster, check=True)
    subprocess.run(["scontrol", "resume", evaluation], env=cluster, check=True)
    subprocess.run(["scontrol", "release", sliced], env=cluster, check=True)

    wait_for("the successor's end", lambda: job_state(cluster, successor[1]) not in ("RUNNING", "PENDING", ""),
             deadline)  # fmt: skip
    log = (tmp_path / "logs" / f"driver-{successor[1]}.log").read_text()
    assert job_state(cluster, successor[1]) == "COMPLETED", log[-5000:]
    for job in (running, sliced):  # each waited for by the successor
        adopted = tmp_path / f"logs/train/onpolicy/tiny/k1-reward/beta~0.1/seed~{seed_of[job]}.adopted.log"
        assert f"adopted: job {job} left the queue" in adopted.read_text(), log[-3000:]
    assert all(json.loads(cell.read_text())["status"] == "ok" for cell in cells) and evaluated.exists()
    evaluations = rule_jobs(cluster, tmp_path, "evaluate_base")
    assert list(evaluations.job_id) == [evaluation] and set(evaluations.state) == {"COMPLETED"}, evaluations  # once
    waited = (tmp_path / "logs/evaluate/base/tiny/template~on.adopted.log").read_text()
    assert f"adopted: job {evaluation} left the queue" in waited, waited
    jobs = rule_jobs(cluster, tmp_path, "train_rl")
    assert len(jobs) == 3 and set(jobs.state) == {"COMPLETED"}, jobs  # one job per cell, none cancelled
    runs = subprocess.run(["sacct", "-n", "-X", "-P", "-D", "-j", sliced, "--format=State"], env=cluster,
                          capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    assert runs == ["REQUEUED", "COMPLETED"], runs
    for seed, job, starts in ((running_seed, running, 1), (sliced_seed, sliced, 2)):  # each start of its one job
        history = tmp_path / f"logs/attempts/train/onpolicy/tiny/k1-reward/beta~0.1/seed~{seed}.log"
        headers = [line for line in history.read_text().splitlines() if line.startswith("=== attempt")]
        assert len(headers) == starts and all(f"job {job} on" in header for header in headers), headers
