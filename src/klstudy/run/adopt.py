"""Jobs that an earlier Snakemake of this directory left in the SLURM queue, for this one to adopt.

A driver at its time limit (slurm/driver.sbatch), or one killed, leaves its jobs in the queue, running or pending (a
slice that requeued itself, a preempted job). Its successor must neither run them a second time nor cancel them, nor
wait for them before it submits anything else. So ``left_jobs`` asks squeue for them when the Snakefile is read, and
each is made by its rule's local twin (workflow/rules/adopt.smk), which waits for it to leave the queue (``python -m
klstudy.run.adopt JOB``); every other job is submitted at once. A failed squeue is never read as an empty queue: a
cluster run stops (the Snakefile), a wait asks again (left_queue)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
# A job's states once it has ended (squeue shows them for MinJobAge). Not PREEMPTED: with --requeue it pends again.
FINAL = {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "TIMEOUT"}


def comment(rule: str, wildcards) -> str:
    """The SLURM plugin's comment of a job of ``rule`` with these wildcard values, in its order (get_job_wildcards)."""
    values = "_".join(wildcards).replace("/", "_")
    return f"rule_{rule}_wildcards_{values}" if values else f"rule_{rule}"


def left_jobs(workdir: Path, run=subprocess.run) -> dict[str, str]:
    """{comment: id} of every job still in the queue, in any state and partition (--all: a hidden one's too), that a
    Snakemake of this user submitted from ``workdir`` (squeue's %Z, as real paths) and named by its run's UUID."""
    shown = run(["squeue", "--noheader", "--me", "--all", "--format=%i|%j|%Z|%k"], capture_output=True, text=True,
                check=True).stdout  # fmt: skip
    here, found = os.path.realpath(workdir), {}
    for line in shown.splitlines():
        job, name, directory, note = (line.split("|", 3) + [""] * 4)[:4]
        if os.path.realpath(directory) == here and UUID.search(name):
            found[note] = job
    return found


def left_queue(job: str, run=subprocess.run) -> bool:
    """Whether ``job`` has left the queue: squeue answers without it, calls it unknown ("Invalid job id": older than
    MinJobAge) or shows a final state, or, where squeue fails, sacct shows a final state. Else it is still there: a
    wait too long costs a poll, a live job taken for gone fails its cell while it trains."""
    queue = run(["squeue", "--noheader", "--all", "--jobs", job, "--format=%T"], capture_output=True, text=True)
    if queue.returncode == 0:
        return not queue.stdout.split() or queue.stdout.split()[0] in FINAL
    if "Invalid job id" in queue.stderr:
        return True
    account = run(["sacct", "--noheader", "--allocations", "--parsable2", "--jobs", job, "--format=State"],
                  capture_output=True, text=True)  # fmt: skip
    if account.returncode == 0 and (account.stdout.split() or [""])[0] in FINAL:  # "CANCELLED by 1234"
        return True
    print(f"adopted: neither squeue ({queue.stderr.strip()[-200:]}) nor sacct says job {job} ended", file=sys.stderr)
    return False


if __name__ == "__main__":  # an adopted rule's shell: python -m klstudy.run.adopt JOB
    job, poll = sys.argv[1], float(os.environ.get("KLSTUDY_ADOPT_POLL", 60))
    while not left_queue(job):
        time.sleep(poll)
    print(f"adopted: job {job} left the queue")
