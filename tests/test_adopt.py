"""A Snakemake that finds jobs of an earlier one in the queue adopts them (klstudy.run.adopt, adopt.smk).

Here against a scripted `squeue` on PATH: which jobs are this directory's, a dry run that plans a training and an
evaluation job left in the queue as waits, and a real Snakemake run in which the adopted cell waits for its job and
keeps what that job wrote while the other cell is trained. The same under a real
SLURM, across two drivers, is test_slurm.py's succession test.
"""

import json
import os
import stat
import subprocess
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from workflow_helpers import ROOT, SNAKEMAKE, claims_it_can_test, reduced_config

from klstudy.run import adopt

RUN = "klstudy_0b6f4a8e-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
SEED0 = "rule_train_rl_wildcards_onpolicy_tiny_k1-reward_0.1_0"


def queue_line(job, workdir, name=RUN, comment=SEED0):
    return f"{job}|{name}|{workdir}|{comment}"


def test_only_snakemakes_jobs_from_this_directory_are_adopted_in_any_state(tmp_path):
    """squeue's %Z is the physical directory: a Snakemake started through a symbolic link finds its jobs there."""
    other = tmp_path / "other"
    other.mkdir()
    (tmp_path / "link").symlink_to(tmp_path)
    evaluation = "rule_evaluate_cell_wildcards_onpolicy_tiny_k1-reward_0.1_0"
    lines = [
        queue_line("1", tmp_path),
        queue_line("2", tmp_path, comment=SEED0.replace("_0.1_0", "_0.1_1")),  # a requeued slice
        queue_line("3", other),  # another clone's
        queue_line("4", tmp_path, name="interactive"),  # a job submitted by hand
        queue_line("6", tmp_path, name="klstudy-driver", comment=""),  # the driver
        queue_line("7", tmp_path, comment=evaluation),
    ]
    asked = []
    squeue = lambda command, **_: asked.append(command) or SimpleNamespace(stdout="\n".join(lines) + "\n")  # noqa: E731
    adopted = adopt.left_jobs(tmp_path / "link", run=squeue)
    assert "--all" in asked[0], "a hidden partition's jobs are listed too"
    assert adopted == {SEED0: "1", SEED0.replace("_0.1_0", "_0.1_1"): "2", evaluation: "7"}


def answers(squeue, sacct=(1, "")):
    """A scripted squeue --jobs and sacct: (exit status, stdout or stderr) each."""

    def run(command, **_):
        code, text = squeue if command[0] == "squeue" else sacct
        return SimpleNamespace(returncode=code, stdout=text if code == 0 else "", stderr="" if code == 0 else text)

    return run


@pytest.mark.parametrize(
    "squeue, sacct, gone",
    [
        ((0, "RUNNING\n"), None, False),
        ((0, "REQUEUE_HOLD\n"), None, False),
        ((0, "PREEMPTED\n"), None, False),  # with --requeue it goes back to the queue
        ((0, "COMPLETED\n"), None, True),  # ended, within MinJobAge
        ((0, ""), None, True),  # squeue answers without it
        ((1, "slurm_load_jobs error: Invalid job id specified"), None, True),
        ((1, "slurm_load_jobs error: Socket timed out on send/recv operation"), (0, "RUNNING\n"), False),
        ((1, "slurm_load_jobs error: Socket timed out on send/recv operation"), (0, "CANCELLED by 1000\n"), True),
        ((1, "slurm_load_jobs error: Unable to contact slurm controller"), (1, "sacct: error: no accounting"), False),
    ],
)
def test_an_adopted_job_is_gone_only_when_squeue_does_not_know_it_or_slurm_shows_it_ended(squeue, sacct, gone):
    """An squeue that fails is never read as a job that left: the cell would fail, its backup put back over the
    metrics the live job writes."""
    assert adopt.left_queue("41", run=answers(squeue, sacct or (1, "sacct not asked"))) is gone


FAKE_SQUEUE = """#!/bin/sh
# squeue --me --format=...: the queue this test scripts; squeue --jobs ID --format=%T: ID's state, from a file.
case "$*" in
  *--me*) cat "{queue}" ;;
  *--jobs*) cat "{state}" ;;
esac
"""


def two_cells(tmp_path: Path) -> Path:
    config = reduced_config()
    study = config["studies"]["onpolicy"]
    study.update(kl=["k1-reward"], betas=[0.1], seeds=[0, 1])
    study["train"].update(steps=2, eval_every=2, checkpoint_every=2)
    config["studies"] = {"onpolicy": study}
    config["evaluation"]["studies"] = {}
    config["divergence"].update(study="onpolicy", kl=["k1-reward"], steps=[0])
    config["figures"] = {}
    config["claims"] = claims_it_can_test(config)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def with_queue(tmp_path: Path, state: str) -> dict:
    """An environment whose squeue shows seed 0's training job 41 from ``tmp_path``, in ``state``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "queue").write_text(queue_line("41", tmp_path) + "\n")
    (tmp_path / "state").write_text(state + "\n")
    squeue = bin_dir / "squeue"
    squeue.write_text(FAKE_SQUEUE.format(queue=tmp_path / "queue", state=tmp_path / "state"))
    squeue.chmod(squeue.stat().st_mode | stat.S_IEXEC)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "KLSTUDY_ADOPT_POLL": "0.5"}


CELL = "results/runs/onpolicy/tiny/k1-reward/beta~0.1/seed~{}"


def test_a_dry_run_plans_each_job_left_in_the_queue_as_a_wait_and_every_other_as_its_rule(tmp_path):
    """Seed 0's training job and the base model's evaluation with its chat template are in the queue: each is made by
    its rule's adopted twin; seed 1 is trained and the evaluation without the template is submitted."""
    config = two_cells(tmp_path)
    env = with_queue(tmp_path, "PENDING")  # a requeued slice: adopted as a running job is
    with (tmp_path / "queue").open("a") as queue:
        queue.write(queue_line("42", tmp_path, comment="rule_evaluate_base_wildcards_tiny_on") + "\n")
    task = yaml.safe_load(config.read_text())["evaluation"]["tasks"][0]
    evaluations = [f"results/evals/base/tiny/template~{template}/{task}.json" for template in ("on", "off")]
    command = [SNAKEMAKE, "--snakefile", str(ROOT / "Snakefile"), "--directory", str(tmp_path), "--cores", "2", "-n",
               *(f"{CELL.format(seed)}/summary.json" for seed in (0, 1)), *evaluations,
               "--configfile", str(config)]  # fmt: skip
    plan = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert plan.returncode == 0, plan.stderr[-3000:]
    out = plan.stdout + plan.stderr
    for rule, made in (("adopted_train_rl", "seed~0/summary.json"), ("train_rl", "seed~1/summary.json"),
                       ("adopted_evaluate_base", "template~on/"), ("evaluate_base", "template~off/")):  # fmt: skip
        assert out.count(f"rule {rule}:") == 1 and made in out.split(f"rule {rule}:")[1][:600], out[-3000:]


@pytest.mark.workflow  # a Snakemake run that trains one cell (about 50 s)
def test_the_adopted_cell_keeps_what_its_job_writes_and_waits_while_the_other_cell_trains(tmp_path):
    """Seed 0's job is 'running' (the scripted queue) and has written two metrics lines; the run must leave them,
    train seed 1 meanwhile, and take seed 0's outputs once the job leaves the queue, training nothing for it."""
    config = two_cells(tmp_path)
    env = with_queue(tmp_path, "RUNNING")
    cell0, cell1 = (tmp_path / CELL.format(seed) for seed in (0, 1))
    cell0.mkdir(parents=True)
    (cell0 / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    command = [SNAKEMAKE, "--snakefile", str(ROOT / "Snakefile"), "--directory", str(tmp_path), "--cores", "2",
               *(f"{CELL.format(seed)}/summary.json" for seed in (0, 1)), "--configfile", str(config)]  # fmt: skip
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as run:
        output = []
        reader = threading.Thread(target=lambda: output.extend(run.stdout), daemon=True)
        reader.start()
        deadline = time.monotonic() + 600
        while not (cell1 / "summary.json").exists():  # the other cell trains while seed 0 waits
            assert run.poll() is None, "".join(output)[-3000:]
            assert time.monotonic() < deadline, "seed 1 never trained"
            time.sleep(0.5)
        assert run.poll() is None and not (cell0 / "summary.json").exists(), "seed 0 must still wait for its job"
        assert (cell0 / "metrics.jsonl").read_text() == '{"step": 1}\n{"step": 2}\n', "what the job wrote is kept"
        # The adopted job ends: its outputs, then it leaves the queue.
        for name in ("final", "snapshots"):
            (cell0 / name).mkdir()
        (cell0 / "heldout.jsonl").write_text("")
        (cell0 / "summary.json").write_text(json.dumps({"status": "ok"}))
        (tmp_path / "state").write_text("")
        assert run.wait(timeout=300) == 0, "".join(output)[-3000:]
        reader.join(timeout=10)
    log = "".join(output)
    waited = (tmp_path / "logs/train/onpolicy/tiny/k1-reward/beta~0.1/seed~0.adopted.log").read_text()
    assert log.count("rule train_rl:") == 1 and "adopted: job 41 left the queue" in waited, log[-3000:]
    assert json.loads((cell0 / "summary.json").read_text()) == {"status": "ok"}
    assert (cell0 / "metrics.jsonl").read_text() == '{"step": 1}\n{"step": 2}\n'
    assert not (tmp_path / "logs/attempts/train/onpolicy/tiny/k1-reward/beta~0.1/seed~0.log").exists()
    # What Snakemake recorded for the adopted cell is what it records for a trained one: nothing reruns.
    again = subprocess.run([*command, "-n"], env={**env, "PATH": os.environ["PATH"]}, capture_output=True, text=True)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr, again.stdout[-2000:]


def test_a_driver_does_not_start_while_squeue_does_not_answer(tmp_path):
    """Without the queue, Snakemake could not adopt what is in it and would train those cells a second time."""
    from test_preflight import fake_slurm

    env, log = fake_slurm(tmp_path, "")
    (tmp_path / "bin" / "squeue").write_text(
        "#!/usr/bin/env bash\necho 'squeue: error: cannot reach slurmctld' >&2\nexit 1\n"
    )
    done = subprocess.run(["bash", str(ROOT / "slurm/driver.sbatch")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1 and "squeue does not answer" in done.stderr, done.stderr
    assert not log.exists(), "Snakemake not started"


def test_a_cluster_run_submits_nothing_while_squeue_does_not_answer(tmp_path):
    """The Snakefile itself stops (onstart, before the first submission), whoever starts it: a run that could not
    list the jobs in the queue would submit a second job for each cell still training."""
    config = two_cells(tmp_path)
    env = with_queue(tmp_path, "RUNNING")
    bin_dir = tmp_path / "bin"
    (bin_dir / "squeue").write_text("#!/bin/sh\necho 'squeue: error: Unable to contact slurm controller' >&2\nexit 1\n")
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "submitted"}\necho 1\n')
    (bin_dir / "sbatch").chmod(0o755)
    command = [SNAKEMAKE, "--snakefile", str(ROOT / "Snakefile"), "--directory", str(tmp_path), "--executor", "slurm",
               "--jobs", "2", f"{CELL.format(1)}/summary.json", "--configfile", str(config), "--config",
               "preflight=False"]  # fmt: skip
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode != 0 and "squeue did not answer (squeue: error: Unable to contact" in run.stderr, run.stderr
    assert "not submitting" in run.stderr and not (tmp_path / "submitted").exists()
