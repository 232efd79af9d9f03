"""Training jobs that an earlier Snakemake of this directory left in the SLURM queue, for this one to adopt.

A driver at its time limit (slurm/driver.sbatch), or one killed, leaves its jobs in the queue, running or pending (a
slice that requeued itself, a preempted job). Its successor must neither run those cells a second time nor cancel
them, nor wait for them before it submits anything else. So ``left_training_jobs`` asks squeue for them when the
Snakefile is read, and each such cell is made by the local rule ``adopted_train_rl`` (workflow/rules/train.smk), which
waits for that job to leave the queue (``python -m klstudy.run.adopt JOB``); every other cell is submitted at once.
A failed squeue is never read as an empty queue: a cluster run stops (the Snakefile), a wait asks again (left_queue).

A job is this directory's Snakemake's when squeue's working directory (%Z) is this one, compared as real paths, and
the SLURM plugin named it by its run's UUID and commented it ``rule_<rule>_wildcards_<values joined by _>``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
CELL_WILDCARDS = ("study", "model", "kl", "beta", "seed")  # in the order of RUN_DIR, as the plugin joins them
# A job's states once it has ended (squeue shows them for MinJobAge). Not PREEMPTED: with --requeue it pends again.
FINAL = {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "TIMEOUT"}


def left_training_jobs(workdir: Path, cells: list[dict], run=subprocess.run) -> dict[tuple, str]:
    """{a cell's wildcard values (CELL_WILDCARDS, as strings): the id of its train_rl job that a Snakemake of this user
    submitted from ``workdir`` and is still in the queue}, in any state and partition (--all: a hidden one's too)."""
    wildcards = [tuple(str(cell[key]) for key in CELL_WILDCARDS) for cell in cells]
    by_comment = {"rule_train_rl_wildcards_" + "_".join(values): values for values in wildcards}  # the plugin's
    shown = run(["squeue", "--noheader", "--me", "--all", "--format=%i|%j|%Z|%k"], capture_output=True, text=True,
                check=True).stdout  # fmt: skip
    here, found = os.path.realpath(workdir), {}
    for line in shown.splitlines():
        job, name, directory, comment = (line.split("|", 3) + [""] * 4)[:4]
        if os.path.realpath(directory) == here and UUID.search(name) and comment in by_comment:
            found[by_comment[comment]] = job
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


if __name__ == "__main__":  # adopted_train_rl's shell: python -m klstudy.run.adopt JOB
    job, poll = sys.argv[1], float(os.environ.get("KLSTUDY_ADOPT_POLL", 60))
    while not left_queue(job):
        time.sleep(poll)
    print(f"adopted: job {job} left the queue")
