"""A killed workflow resumes with the same command (drive.py): `klstudy drive -- snakemake ...`, as `make study` runs
it, has its Snakemake killed (SIGKILL) while a cell of the reduced study trains; the same command run again must
finish the cell as an uninterrupted run did, with no hand step and nothing of the first run left behind.

The suite's one killed-workflow resume test. Snakemake killed is the hardest of the interruptions the driver handles
(drive.py's docstring): it leaves its lock, its incomplete outputs and the job it started, where Ctrl-C and SIGTERM
let it clean up. The cell-level resume (a killed `klstudy train` restarts from its checkpoint) is
tests/test_trainer.py's."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from workflow_helpers import ROOT, SNAKEMAKE

from klstudy.data import staging
from klstudy.train.cell import MEASURED_COLUMNS

pytestmark = pytest.mark.workflow  # the end-to-end workflow tier: `make test-workflow` (docs/testing.md)

CELL = "results/runs/onpolicy/tiny/k1-reward/beta~0.1/seed~0"
# A job's log is opened when the job starts: once the cell's exists, the cell is training (its start-up included).
TRAINING = "logs/train/onpolicy/**/*.log"


def drive_command() -> list[str]:
    """The driver, and the one cell as Snakemake's target (its staging and base model first): the reduced study's
    every other job would add minutes and nothing the interruption tests."""
    study = [SNAKEMAKE, f"{CELL}/summary.json", "--snakefile", str(ROOT / "Snakefile"), "--configfile", "config.yaml",
             "--cores", "2", "--keep-going", "--rerun-incomplete"]  # fmt: skip
    return [sys.executable, "-m", "klstudy", "drive", "--", *study]


def wait_for(workdir: Path, pattern: str, process: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not list(workdir.glob(pattern)):
        assert process.poll() is None, f"the study ended before {pattern} appeared"
        assert time.monotonic() < deadline, f"no {pattern}"
        time.sleep(0.2)


def kill_snakemake(driver: subprocess.Popen) -> None:
    snakemake = [p for p in psutil.Process(driver.pid).children() if "snakemake" in " ".join(p.cmdline())]
    assert len(snakemake) == 1
    snakemake[0].kill()


def leftovers(workdir: Path) -> list[str]:
    """Processes still working in ``workdir`` (jobs, servers, Snakemakes of the first run)."""
    found = []
    for process in psutil.process_iter(["pid", "cwd", "cmdline"]):
        try:
            if process.info["cwd"] and Path(process.info["cwd"]).is_relative_to(workdir) and process.pid != os.getpid():
                found.append(" ".join(process.info["cmdline"] or []))
        except (psutil.Error, ValueError):
            continue
    return found


def rows(path: Path) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in MEASURED_COLUMNS} for row in staging.read_jsonl(path)]


def test_a_study_whose_snakemake_was_killed_during_training_finishes_with_the_same_command(reduced_run, tmp_path):
    reference, config = reduced_run
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    log = open(tmp_path / "first.log", "w")
    first = subprocess.Popen(drive_command(), cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)  # fmt: skip
    wait_for(tmp_path, TRAINING, first)
    kill_snakemake(first)
    first.wait(timeout=600)
    log.close()
    assert "(100%) done" not in (tmp_path / "first.log").read_text(), "the kill came after the cell had finished"

    again = subprocess.run(drive_command(), cwd=tmp_path, capture_output=True, text=True, timeout=1200)
    output = again.stdout + again.stderr
    assert again.returncode == 0, (tmp_path / "first.log").read_text()[-3000:] + output[-5000:]
    assert "releasing the lock of an interrupted Snakemake" in output  # it could not release its own: found stale
    deadline = time.monotonic() + 60  # a job killed with its caller may take a moment to be reaped
    while leftovers(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not leftovers(tmp_path)
    for name in ("metrics.jsonl", "heldout.jsonl"):  # what the uninterrupted study's run of the cell wrote
        assert rows(tmp_path / CELL / name) == rows(reference / CELL / name), name
