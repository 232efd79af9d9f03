"""An interrupted study resumes with the same command (drive.py): `klstudy drive -- snakemake ...`, as `make study`
runs it, is stopped at a moment of the reduced study (Ctrl-C, SIGTERM or SIGKILL of the driver, or SIGKILL of its
Snakemake), warm and cold; the same command run again must finish with the results of an uninterrupted run, with no
hand step and nothing of the first run left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from workflow_helpers import ROOT, SNAKEMAKE, assert_same_results

pytestmark = pytest.mark.workflow  # the end-to-end workflow tier: `make test-workflow` (docs/testing.md)

# When to interrupt: once the first file matching the pattern exists under the run's directory. A job's log is
# opened when the job starts, so "training" is while a cell trains (its start-up included) and "evaluation" while a
# model is scored; the reduced study's cells are seconds long, so a checkpoint would be too brief an event to catch.
MOMENTS = {
    "staging": "results/data/*.jsonl",  # the first jobs
    "training": "logs/train/**/*.log",
    "evaluation": "logs/evaluate/**/*.log",
}


def drive_command(workdir: Path, warm: bool) -> list[str]:
    study = [SNAKEMAKE, "--snakefile", str(ROOT / "Snakefile"), "--configfile", "config.yaml", "--cores", "2",
             "--keep-going", "--rerun-incomplete"]  # fmt: skip
    return [sys.executable, "-m", "klstudy", "drive", *(["--warm"] if warm else []), "--", *study]


def wait_for(workdir: Path, pattern: str, process: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not list(workdir.glob(pattern)):
        assert process.poll() is None, f"the study ended before {pattern} appeared"
        assert time.monotonic() < deadline, f"no {pattern}"
        time.sleep(0.2)


def interrupt(process: subprocess.Popen, how: str) -> None:
    if how == "ctrl-c":  # a terminal sends SIGINT to its foreground group: the driver's (make's, in `make study`)
        os.killpg(process.pid, signal.SIGINT)
    elif how == "sigterm":
        process.send_signal(signal.SIGTERM)
    elif how == "kill-driver":
        process.kill()
    elif how == "kill-snakemake":
        snakemake = [p for p in psutil.Process(process.pid).children() if "snakemake" in " ".join(p.cmdline())]
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


def run_interrupted_then_again(reduced_run, tmp_path, moment: str, how: str, warm: bool) -> str:
    reference, config = reduced_run
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    command = drive_command(tmp_path, warm)
    log = open(tmp_path / "first.log", "w")
    first = subprocess.Popen(command, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    wait_for(tmp_path, MOMENTS[moment], first)
    interrupt(first, how)
    first.wait(timeout=600)
    log.close()
    assert "(100%) done" not in (tmp_path / "first.log").read_text(), "the interruption came after the study ended"

    again = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=1200)
    assert again.returncode == 0, (
        (tmp_path / "first.log").read_text()[-3000:] + again.stdout[-3000:] + again.stderr[-5000:]
    )
    deadline = time.monotonic() + 60  # a job killed with its caller may take a moment to be reaped
    while leftovers(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not leftovers(tmp_path)
    assert_same_results(reference, tmp_path, config)
    return again.stdout + again.stderr


@pytest.mark.slow  # 100-160 s: `make test-all` (CI's time; the other interruptions below are slow too)
def test_ctrl_c_during_training_then_the_same_command_finishes_the_study(reduced_run, tmp_path):
    """What a user met: Ctrl-C during `make study` (warm), then `make study` again."""
    output = run_interrupted_then_again(reduced_run, tmp_path, "training", "ctrl-c", warm=True)
    assert "IncompleteFilesException" not in output and "LockException" not in output


@pytest.mark.slow
@pytest.mark.parametrize(
    "moment, how, warm",
    [
        ("staging", "ctrl-c", False),
        ("training", "kill-driver", True),
        ("training", "kill-snakemake", False),
        ("evaluation", "sigterm", True),
        ("evaluation", "kill-snakemake", True),
    ],
)
def test_an_interrupted_study_resumes(reduced_run, tmp_path, moment, how, warm):
    output = run_interrupted_then_again(reduced_run, tmp_path, moment, how, warm)
    if how == "kill-snakemake":  # it could not release its lock: the driver found it stale
        assert "releasing the lock of an interrupted Snakemake" in output
