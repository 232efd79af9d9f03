"""`snakemake --profile slurm` against a real single-node SLURM brought up by tests/slurm/local-slurm.sh.

The reduced embedded study runs through sbatch with the account and partition given on the command line, as
the README tells users to; every job must show in `sacct` and every output must equal a local run's. Then a
training job whose runtime is too short is killed by SLURM at its time limit, resubmitted by the profile's
`retries` with twice the runtime, and resumes from its checkpoint to the metrics of an uninterrupted run.
Needs root (the script installs slurm-wlm, slurmdbd, munge and MariaDB if missing); `make test` runs it.
"""

import json
import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml
from workflow_helpers import ROOT, SNAKEMAKE, reduced_config, snakemake

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
        yield {**os.environ, "SLURM_CONF": str(base / "slurm.conf")}
    finally:
        subprocess.run(["timeout", "-s", "KILL", "120", str(SCRIPT), "down", str(base)], check=False)


def profile_run(env, workdir: Path, config_path: Path, *targets: str) -> str:
    """The README's cluster command, with this cluster's account and partition on the command line."""
    command = [
        "timeout", "-s", "KILL", str(HARD_LIMIT), SNAKEMAKE, *targets, "--profile", "slurm",
        "--snakefile", str(ROOT / "Snakefile"), "--directory", str(workdir), "--configfile", str(config_path),
        "--default-resources", "slurm_account=klstudy", "slurm_partition=debug",
        "--slurm-init-seconds-before-status-checks", "2", "--seconds-between-status-checks", "2",
        "--latency-wait", "5",
    ]  # fmt: skip
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    return run.stdout + run.stderr


def sacct(env) -> pd.DataFrame:
    out = subprocess.run(
        ["sacct", "-n", "-X", "-P", "--format=JobID,JobName,State,Comment", "--starttime=now-1days"],
        env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    rows = [line.split("|") for line in out.splitlines() if line.strip()]
    return pd.DataFrame(rows, columns=["job_id", "name", "state", "comment"])


def without_times(table: pd.DataFrame) -> pd.DataFrame:
    return table.drop(columns=[c for c in ("time", "step_time") if c in table.columns])


SUBMITTED_RULES = ("toy_bias_variance", "train_rl", "evaluate_cell", "evaluate_base", "divergence")


def test_the_reduced_study_runs_through_sbatch_and_equals_a_local_run(cluster, reduced_run, tmp_path):
    local, config = reduced_run
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    before = set(sacct(cluster).job_id)
    output = profile_run(cluster, tmp_path, tmp_path / "config.yaml")

    jobs = sacct(cluster)
    jobs = jobs[~jobs.job_id.isin(before)]
    submitted = sum(output.count(f"rule {rule}:") for rule in SUBMITTED_RULES)
    assert submitted > 0 and len(jobs) == submitted, output[-3000:]
    assert set(jobs.state) == {"COMPLETED"}
    logs = sorted((tmp_path / "logs" / "slurm").rglob("*.log"))
    assert sorted(p.stem for p in logs) == sorted(jobs.job_id)  # one SLURM log per job, named by its job id

    tables = {}
    for name in ("cells", "heldout", "training", "evaluations", "divergence"):
        tables[name] = [without_times(pd.read_csv(d / "results" / "tables" / f"{name}.csv")) for d in (local, tmp_path)]
        pd.testing.assert_frame_equal(*tables[name], obj=name)
    assert len(tables["training"][0]) > 0 and tables["evaluations"][0].mean_at_k.notna().all()
    for setting in config["toy"]["settings"]:
        pd.testing.assert_frame_equal(
            *(pd.read_csv(d / "results" / "toy" / f"{setting}.csv") for d in (local, tmp_path))
        )


def time_limit_config() -> dict:
    """One long cell, trained twice: by SLURM with a 1-minute limit (study `slurm`) and locally (`local`)."""
    config = reduced_config()
    study = config["studies"]["onpolicy"]
    study.update(kl=["k1-reward"], betas=[0.1], seeds=[0])
    study["train"].update(steps=TIME_LIMIT_STEPS, checkpoint_every=25, eval_every=TIME_LIMIT_STEPS)
    config["studies"] = {"slurm": study, "local": json.loads(json.dumps(study))}
    config["evaluation"]["studies"] = {}
    config["divergence"].update(study="slurm", kl=["k1-reward"], steps=[0])
    config["figures"] = {}
    config["resources"]["train"]["runtime"] = 1  # minutes: SLURM kills the first attempt
    # One epoch of prompts: a resume is exact within an epoch, not yet across one (README, "Known problems").
    config["data"]["math_train"].update(levels=["add2", "sub2"], size=4 * TIME_LIMIT_STEPS)
    return config


# About 2 minutes of training here (≈ 7 steps/s): the first attempt is killed at its 1-minute limit (SLURM
# enforced it within 6 s here) around step 400, and the second (2 minutes) finishes the rest after resuming
# (≈ 80 s with start-up; 1000 steps left it only 7 s of margin).
TIME_LIMIT_STEPS = 800
CELL = "results/runs/{study}/tiny/k1-reward/beta~0.1/seed~0"


def test_a_job_killed_at_its_time_limit_resumes_from_its_checkpoint(cluster, tmp_path):
    config = time_limit_config()
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    local_cell, slurm_cell = (tmp_path / CELL.format(study=s) for s in ("local", "slurm"))
    # The uninterrupted run, locally (it also stages the data and builds the model both runs share).
    snakemake(f"{CELL.format(study='local')}/summary.json", "--cores", "2", "--configfile",
              str(tmp_path / "config.yaml"), cwd=tmp_path, timeout=HARD_LIMIT)  # fmt: skip

    before = set(sacct(cluster).job_id)
    profile_run(cluster, tmp_path, tmp_path / "config.yaml", f"{CELL.format(study='slurm')}/summary.json")
    jobs = sacct(cluster)
    jobs = jobs[~jobs.job_id.isin(before)]
    assert list(jobs.state) == ["TIMEOUT", "COMPLETED"], jobs  # killed at its limit, then retried

    summary = json.loads((slurm_cell / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["steps_done"] == TIME_LIMIT_STEPS
    resumed_at = int(summary["resumed_from"].rsplit("-", 1)[1])  # not from step 0
    assert 0 < resumed_at < TIME_LIMIT_STEPS
    for name in ("metrics.jsonl", "heldout.jsonl"):
        runs = [without_times(pd.read_json(cell / name, lines=True)) for cell in (local_cell, slurm_cell)]
        pd.testing.assert_frame_equal(*runs, obj=name, check_like=True)  # resumed files are rewritten
