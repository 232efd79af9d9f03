"""Slices: a training cell longer than its job's time limit, run as one job that SLURM requeues (docs/running.md,
**Cells longer than a time limit**). The trainer catches SLURM's SIGUSR1 (install), saves at the end of the step it
is in and leaves SLICE_ENDED; the rule's shell (common.smk's REQUEUE_SLICE) then runs `scontrol requeue`.
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
