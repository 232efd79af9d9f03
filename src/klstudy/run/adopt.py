"""A driver that starts where an earlier one stopped adopts the jobs it left (slurm/driver.sbatch, `klstudy adopt`).

A driver at its time limit leaves its running jobs running and exits (a training cell may hold 8 GPUs for hours; its
work would be lost, and its place in the queue); one killed outright leaves them too. The next driver, before
Snakemake starts:

1. lists Snakemake's jobs from this directory still in the queue (squeue: the SLURM plugin names each by its run's
   UUID and comments it rule_<rule>...; a job submitted by hand from here is neither, and is left alone);
2. cancels the pending ones: they never started, or a training job requeued itself for its next slice after a
   complete checkpoint, and Snakemake submits them again;
3. waits for the running ones, each until it leaves the running state (one that goes back to pending meanwhile, a
   slice's end or a preemption, is cancelled as in 2);
4. then Snakemake keeps the outputs of the adopted jobs that completed: the job's own Snakemake (in the SLURM job)
   removed the incomplete markers of its outputs when it finished. Where one is left (.snakemake/incomplete/, each
   naming the SLURM id of the job that was to write the file) and that job ended COMPLETED, it is removed here. A job
   that failed keeps them, and --rerun-incomplete runs it again (a training cell from its checkpoint).

So no job runs twice and no cell ever has two jobs at once. While it waits, nothing new is submitted: at most one
slice of training (resources.train.runtime) after a driver's time limit.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
RUNNING = {"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STAGE_OUT", "RESIZING", "SIGNALING"}


@dataclass(frozen=True)
class Job:
    id: str
    state: str
    comment: str  # rule_<rule>[_wildcards_...]: which job of the workflow it is


def left_jobs(workdir: Path, me: str | None, run=subprocess.run) -> list[Job]:
    """Snakemake's jobs of this user submitted from ``workdir`` (compared as real paths) still in the queue, other
    than the job ``me`` (the driver)."""
    shown = run(["squeue", "--noheader", "--me", "--format=%i|%T|%j|%Z|%k"], capture_output=True, text=True,
                check=True).stdout  # fmt: skip
    here, found = os.path.realpath(workdir), []
    for line in shown.splitlines():
        job, state, name, directory, comment = (line.split("|", 4) + [""] * 5)[:5]
        if job != me and os.path.realpath(directory) == here and UUID.search(name) and comment.startswith("rule_"):
            found.append(Job(job, state, comment))
    return found


def final_state(job: str, run=subprocess.run) -> str:
    shown = run(["sacct", "-n", "-X", "-P", "-j", job, "--format=State"], capture_output=True, text=True).stdout
    return (shown.split() or ["UNKNOWN"])[0]


def markers(workdir: Path) -> dict[Path, str]:
    """Snakemake's incomplete markers (.snakemake/incomplete/) and the SLURM job id each records."""
    found = {}
    for path in (Path(workdir) / ".snakemake" / "incomplete").rglob("*"):
        if path.is_file() and not path.name.startswith("@") and path.name != "migration_underway":
            try:
                found[path] = str(json.loads(path.read_text()).get("external_jobid") or "")
            except (OSError, ValueError):
                continue
    return found


def output_of(marker: Path, workdir: Path) -> str:
    """The output file a marker stands for (its path, base64 in the marker's name, split over folders when long)."""
    parts = marker.relative_to(Path(workdir) / ".snakemake" / "incomplete").parts
    return base64.urlsafe_b64decode("".join(part.removeprefix("@") for part in parts)).decode()


def adopt(workdir: Path, me: str | None, poll: float = 30, run=subprocess.run, sleep=time.sleep, say=print) -> None:
    """Steps 1-4 of the module docstring."""
    adopted: dict[str, str] = {}
    while True:
        jobs = left_jobs(workdir, me, run)
        pending = [job for job in jobs if job.state not in RUNNING]
        if pending:
            say("klstudy adopt: cancelling pending job(s) " + ", ".join(f"{j.id} ({j.comment})" for j in pending))
            run(["scancel", *(job.id for job in pending)], check=False)
        running = [job for job in jobs if job.state in RUNNING]
        for job in running:
            if job.id not in adopted:
                adopted[job.id] = job.comment
                say(f"klstudy adopt: job {job.id} ({job.comment}) still runs: waiting for it, untouched")
        if not running:
            break
        sleep(poll)
    done = {job for job in adopted if final_state(job, run) == "COMPLETED"}
    for job in sorted(set(adopted) - done):
        say(f"klstudy adopt: job {job} ({adopted[job]}) did not complete: Snakemake runs it again")
    for marker, job in markers(workdir).items():
        if job in done:
            say(f"klstudy adopt: job {job} completed {output_of(marker, workdir)}: kept")
            marker.unlink()
