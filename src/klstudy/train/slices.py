"""Slices: a training cell longer than its job's time limit runs as the same job, requeued as often as it needs, by
SLURM's own mechanism.

A training job asks SLURM for SIGUSR1 before its time limit (sbatch --signal=USR1@<cluster.save_before_limit_minutes>,
workflow/rules/common.smk). Without B:, SLURM signals every process of the job's steps: the trainer, and Snakemake's
job process, its shell, tee and the launcher around it, which ignore the signal (the Snakefile sets it ignored in
Snakemake's process, and an ignored signal stays ignored in every child). The trainer (install()) finishes the
training step it is in, saves a checkpoint, leaves SLICE_ENDED in its checkpoint directory and exits; the rule's
shell (common.smk's REQUEUE_SLICE) sees the mark and runs `scontrol requeue $SLURM_JOB_ID`. The job starts again
under the same id with its full time limit and resumes from that checkpoint; Snakemake, which sees one job pending
again, counts no failure, so a slice is never one of the attempts a cell gets.

The reserve must hold the longest training step and a checkpoint. Outside SLURM nothing sends the signal: nothing is
sliced and no process is added.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

from accelerate.utils import broadcast_object_list
from transformers import TrainerCallback

from klstudy.config import SLICE_ENDED  # the mark's name, which `klstudy status` and the rule's shell read too

_received = {"signal": False}  # set by the handler; read at the next step's end


def install() -> None:
    """Catch SLURM's warning: the training stops at the end of the step it is in (StopOnSignal)."""
    signal.signal(signal.SIGUSR1, lambda signum, frame: _received.update(signal=True))


def signalled() -> bool:
    return _received["signal"]


class StopOnSignal(TrainerCallback):
    """Saves a checkpoint and stops the training at the end of the first whole step after the signal. The main
    process decides, so that every process stops at the same step. The last step is never cut: finishing the cell
    takes no longer than a checkpoint, which the reserve covers."""

    def __init__(self, updates_per_batch: int, steps: int, is_signalled=signalled):
        self.updates, self.steps, self.is_signalled = updates_per_batch, steps, is_signalled
        self.stopped_at: int | None = None  # the training step after which it stopped, if it did

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.updates:
            return  # only after a whole generation batch: checkpoints fall there
        step = state.global_step // self.updates
        if broadcast_object_list([step < self.steps and self.is_signalled()])[0]:
            control.should_save = control.should_training_stop = True
            self.stopped_at = step


def mark_slice_end(checkpoint_dir: Path, step: int) -> None:
    (Path(checkpoint_dir) / SLICE_ENDED).write_text(json.dumps({"step": step}) + "\n")


def clear_slice_end(checkpoint_dir: Path) -> None:
    (Path(checkpoint_dir) / SLICE_ENDED).unlink(missing_ok=True)
