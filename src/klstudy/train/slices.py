"""Slices: a training cell longer than its job's time limit runs as the same job, requeued as often as it needs.

At the end of each training step the main process compares the time left before the job's end with what the next
step and a checkpoint need: the reserve (`klstudy train --save-before-limit`, from cluster.save_before_limit_minutes)
plus twice the longest step so far. When less is left, every process saves a checkpoint and stops; the cell leaves
SLICE_ENDED in its checkpoint directory and `klstudy next-slice` puts the job back in SLURM's queue (scontrol
requeue). It starts again under the same job id with its full time limit and resumes from that checkpoint; Snakemake,
which sees one job pending again, counts no failure, so a slice is never one of the retries a failure gets.

The job's end: KLSTUDY_JOB_END (seconds since the epoch: another scheduler's, or a test's), else SLURM's time left
for SLURM_JOB_ID (squeue %L), read once when the training starts. Without either (a local run) nothing is sliced.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from accelerate.utils import broadcast_object_list
from transformers import TrainerCallback

from klstudy.config import SLICE_ENDED  # the mark's name, which `klstudy status` reads too

REQUEUE_WAIT = 300  # seconds `next-slice` waits for SLURM to end the job it requeued before it calls that a failure


def job_end(env=os.environ, run=subprocess.run, tries: int = 3, pause: float = 10) -> float | None:
    """When the scheduler ends this job (seconds since the epoch), or None (no job, or one without a limit). squeue is
    asked ``tries`` times (a busy controller may not answer); failing that, the job is not sliced, saying so."""
    if env.get("KLSTUDY_JOB_END"):
        return float(env["KLSTUDY_JOB_END"])
    job = env.get("SLURM_JOB_ID")
    if not job:
        return None
    for attempt in range(tries):
        try:
            shown = run(["squeue", "-h", "-j", job, "-o", "%L"], capture_output=True, text=True, timeout=60)
            if shown.returncode == 0 and shown.stdout.strip():
                left = time_left(shown.stdout.strip())
                return None if left is None else time.time() + left
        except (OSError, subprocess.TimeoutExpired):
            pass
        if attempt + 1 < tries:
            time.sleep(pause)
    print(f"slices: squeue did not say job {job}'s time left; it is not sliced (a time limit ends it, and the "
          "retry resumes from its last checkpoint)", file=sys.stderr)  # fmt: skip
    return None


def time_left(text: str) -> float | None:
    """squeue's %L ("[days-][hours:]minutes:seconds", or UNLIMITED / NOT_SET / INVALID) in seconds."""
    found = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", text)
    if not found:
        return None
    days, hours, minutes, seconds = (int(part or 0) for part in found.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


class StopBeforeTimeLimit(TrainerCallback):
    """Saves a checkpoint and stops the training when the job's end is nearer than ``reserve`` seconds plus twice
    the longest training step so far (generation, update and held-out evaluation: the time between two steps' ends).
    The main process decides, so that every process stops at the same step. The last step is never cut: finishing
    the cell takes no longer than a checkpoint, which the reserve covers."""

    def __init__(self, end: float, reserve: float, updates_per_batch: int, steps: int, clock=time.time):
        self.end, self.reserve, self.updates, self.steps, self.clock = end, reserve, updates_per_batch, steps, clock
        self.previous = None
        self.longest = 0.0
        self.stopped_at: int | None = None  # the training step after which it stopped, if it did
        self.save_started: float | None = None
        self.save_seconds: float | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.previous = self.clock()

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.updates:
            return  # only after a whole generation batch: checkpoints fall there
        now = self.clock()
        self.longest, self.previous = max(self.longest, now - self.previous), now
        step = state.global_step // self.updates
        short = step < self.steps and self.end - now < self.reserve + 2 * self.longest
        if broadcast_object_list([short])[0]:
            control.should_save = control.should_training_stop = True
            self.stopped_at, self.save_started = step, now

    def on_save(self, args, state, control, **kwargs):
        if self.save_started is not None and self.save_seconds is None:
            self.save_seconds = round(self.clock() - self.save_started, 1)

    def record(self) -> dict:
        """What SLICE_ENDED says: where and why this job stopped, and what the checkpoint took."""
        return {
            "step": self.stopped_at,
            "seconds_left": round(self.end - self.clock(), 1),
            "reserve_seconds": self.reserve,
            "longest_step_seconds": round(self.longest, 1),
            "checkpoint_seconds": self.save_seconds,
        }


def mark_slice_end(checkpoint_dir: Path, record: dict) -> None:
    (Path(checkpoint_dir) / SLICE_ENDED).write_text(json.dumps(record, indent=2) + "\n")


def clear_slice_end(checkpoint_dir: Path) -> None:
    (Path(checkpoint_dir) / SLICE_ENDED).unlink(missing_ok=True)


def next_slice(checkpoint_dir: Path, env=os.environ, run=subprocess.run, wait=REQUEUE_WAIT) -> int:
    """After `klstudy train`: nothing if the cell ended; if its job stopped before its time limit, requeue the job
    and wait for SLURM to end it (0 is never returned then: the job may not end as a success with its outputs
    missing). One task requeues: the first (SLURM_PROCID 0) of a job whose nodes each ran this."""
    mark = Path(checkpoint_dir) / SLICE_ENDED
    if not mark.exists():
        return 0
    record = json.loads(mark.read_text())
    job = env.get("SLURM_JOB_ID")
    if not job:
        print(f"next-slice: the cell stopped after step {record['step']} before its job's end (KLSTUDY_JOB_END) "
              "and no SLURM job can be requeued: run the workflow again to go on from its checkpoint",
              file=sys.stderr)  # fmt: skip
        return 3
    if env.get("SLURM_PROCID", "0") == "0":
        print(f"next-slice: stopped after step {record['step']} with {record['seconds_left']} s left; requeueing "
              f"job {job} for the next slice", flush=True)  # fmt: skip
        requeued = run(["scontrol", "requeue", job], capture_output=True, text=True)
        if requeued.returncode:
            print(f"next-slice: `scontrol requeue {job}` failed ({requeued.stderr.strip()}): the job must be "
                  "submitted with --requeue (the profile's slurm-requeue: true); the cell resumes from its "
                  "checkpoint when the workflow retries it", file=sys.stderr)  # fmt: skip
            return 4
    time.sleep(wait)
    print(f"next-slice: job {job} was not ended within {wait} s of its requeue", file=sys.stderr)
    return 5
