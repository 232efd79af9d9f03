"""Training jobs that an earlier Snakemake of this directory left in the SLURM queue, for this one to adopt.

A driver at its time limit (slurm/driver.sbatch), or one killed, leaves its jobs in the queue: running, or pending
(a training slice that requeued itself, a preempted job). Its successor must neither run those cells a second time
nor cancel them, and must not wait for them before it submits anything else. So, when the Snakefile is read,
``left_training_jobs`` asks squeue for them, and each such cell is made by the local rule ``adopted_train_rl``
(workflow/rules/train.smk), which waits for that job to leave the queue (``python -m klstudy.run.adopt JOB``); Snakemake
submits every other cell at once. An squeue that fails is never read as an empty queue: the Snakefile stops a cluster
run, and the wait asks again, taking a job as gone only when squeue does not know it or SLURM shows a final state.

A job is this directory's Snakemake's when squeue's working directory (%Z) is this one, compared as real paths, and
the SLURM plugin named it by its run's UUID and commented it ``rule_<rule>_wildcards_<values joined by _>``; a job
submitted by hand, a ``salloc`` or the driver itself is neither.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
CELL_WILDCARDS = ("study", "model", "kl", "beta", "seed")  # in the order of RUN_DIR, as the plugin joins them
# A job's states once it has ended (squeue shows them for MinJobAge; sacct for ever). PREEMPTED is not one of them: a
# preempted job of a run with --requeue goes back to the queue.
FINAL = {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "TIMEOUT"}


@dataclass(frozen=True)
class Job:
    id: str
    state: str
    comment: str  # rule_<rule>[_wildcards_...]: which job of the workflow it is


def left_jobs(workdir: Path, run=subprocess.run) -> list[Job]:
    """Snakemake's jobs of this user submitted from ``workdir`` still in the queue, in any state, in any partition
    (--all: a hidden one's too)."""
    shown = run(["squeue", "--noheader", "--me", "--all", "--format=%i|%T|%j|%Z|%k"], capture_output=True, text=True,
                check=True).stdout  # fmt: skip
    here, found = os.path.realpath(workdir), []
    for line in shown.splitlines():
        job, state, name, directory, comment = (line.split("|", 4) + [""] * 5)[:5]
        if os.path.realpath(directory) == here and UUID.search(name) and comment.startswith("rule_"):
            found.append(Job(job, state, comment))
    return found


def training_comment(cell: dict) -> str:
    """The SLURM plugin's comment on a cell's train_rl job."""
    return "rule_train_rl_wildcards_" + "_".join(str(cell[key]) for key in CELL_WILDCARDS)


def left_training_jobs(workdir: Path, cells: list[dict], run=subprocess.run) -> dict[tuple, str]:
    """{a cell's wildcard values (CELL_WILDCARDS, as strings): the id of its train_rl job left in the queue}."""
    by_comment = {training_comment(cell): tuple(str(cell[key]) for key in CELL_WILDCARDS) for cell in cells}
    return {by_comment[job.comment]: job.id for job in left_jobs(workdir, run) if job.comment in by_comment}


def left_queue(job: str, run=subprocess.run) -> bool:
    """Whether ``job`` has left the queue: squeue answers without it, names it unknown ("Invalid job id", once it is
    older than MinJobAge) or shows a final state, or, where squeue fails, sacct shows a final state. Anything else,
    an squeue that fails and a sacct that cannot tell included, is a job still there: waiting longer costs a poll,
    taking a live job for gone fails its cell while it trains."""
    queue = run(["squeue", "--noheader", "--all", "--jobs", job, "--format=%T"], capture_output=True, text=True)
    if queue.returncode == 0:
        return not queue.stdout.split() or queue.stdout.split()[0] in FINAL
    if "Invalid job id" in queue.stderr:
        return True
    account = run(["sacct", "--noheader", "--allocations", "--parsable2", "--jobs", job, "--format=State"],
                  capture_output=True, text=True)  # fmt: skip
    states = account.stdout.split("\n")[0].split()  # "CANCELLED by 1234"
    if account.returncode == 0 and states and states[0] in FINAL:
        return True
    print(f"adopted: squeue did not answer ({queue.stderr.strip()[-200:]}), nor sacct with a final state: job {job} is"
          " taken to be in the queue", file=sys.stderr)  # fmt: skip
    return False


if __name__ == "__main__":  # adopted_train_rl's shell: python -m klstudy.run.adopt JOB
    job, poll = sys.argv[1], float(os.environ.get("KLSTUDY_ADOPT_POLL", 60))
    while not left_queue(job):
        time.sleep(poll)
    print(f"adopted: job {job} left the queue")
