"""Fault injection for the resume tests: a training process that kills, stops or warns itself at a step."""

from __future__ import annotations

import os
import signal

from transformers import TrainerCallback


class FaultAtStep(TrainerCallback):
    """From the environment: ``KLSTUDY_KILL_AT_STEP=N`` SIGKILLs the process once step N is logged (nothing flushed,
    as SLURM or the OOM killer ends it); ``KLSTUDY_STOP_AT_STEP=N`` SIGSTOPs it once a checkpoint at or after step N
    is complete (a hang until the time limit); ``KLSTUDY_WARN_AT_STEP=N`` sends SIGUSR1 as step N begins (SLURM's
    warning, slices.py). The last two only in a run that did not resume."""

    VARIABLES = {"KLSTUDY_KILL_AT_STEP": signal.SIGKILL, "KLSTUDY_STOP_AT_STEP": signal.SIGSTOP,
                 "KLSTUDY_WARN_AT_STEP": signal.SIGUSR1}  # fmt: skip
    ONCE = (signal.SIGSTOP, signal.SIGUSR1)  # not again in the run that resumes

    def __init__(self, step: int, updates_per_batch: int, signum: int):
        self.step, self.updates, self.signum = step, updates_per_batch, signum

    @classmethod
    def from_environment(cls, updates_per_batch: int, resumed: bool) -> list[FaultAtStep]:
        return [
            cls(int(os.environ[name]), updates_per_batch, signum)
            for name, signum in cls.VARIABLES.items()
            if os.environ.get(name) and not (resumed and signum in cls.ONCE)
        ]

    def _signal_from(self, state) -> None:
        if state.global_step >= self.step * self.updates:
            os.kill(os.getpid(), self.signum)

    def on_log(self, args, state, control, logs=None, **kwargs):  # after RunRecorder has written the step's line
        if self.signum == signal.SIGKILL:
            self._signal_from(state)

    def on_step_begin(self, args, state, control, **kwargs):
        if self.signum == signal.SIGUSR1 and state.global_step >= (self.step - 1) * self.updates:
            os.kill(os.getpid(), self.signum)

    def on_save(self, args, state, control, **kwargs):  # after RunRecorder has marked the checkpoint complete
        if self.signum == signal.SIGSTOP:
            self._signal_from(state)
