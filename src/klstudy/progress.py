"""Progress lines in a job's log: how far it is, how fast it goes, and when it will end.

    onpolicy/tiny/k1-reward/beta~0.1/seed~0: step 6/15 | task_reward 0.375 | kl_k3 0.0123 | 1.92 s/step | eta 0:00:17

A line at most every ``every`` seconds (and always the last), flushed at once so that `tail -f` on the log, or
SLURM's output file, follows the job. The rate counts only the work of this attempt (a resumed job starts at its
checkpoint's step), so the estimate is not flattered by steps done before a kill.
"""

from __future__ import annotations

import datetime
import sys
import time


class Progress:
    def __init__(self, label: str, total: int, unit: str = "step", start: int = 0, every: float = 0.0, stream=None):
        self.label, self.total, self.unit, self.every = label, total, unit, every
        self.start_done, self.start_time, self.last_line = start, time.monotonic(), -float("inf")
        self.done, self.stream = start, stream or sys.stdout

    def advance(self, **fields) -> str | None:
        """One more unit done."""
        return self.update(self.done + 1, **fields)

    def update(self, done: int, **fields) -> str | None:
        """Report ``done`` of ``total``; returns the line written, or None when it is too soon for another."""
        now, self.done = time.monotonic(), done
        if now - self.last_line < self.every and done < self.total:
            return None
        self.last_line = now
        rate = (now - self.start_time) / max(done - self.start_done, 1)  # seconds per unit, this attempt
        remaining = datetime.timedelta(seconds=round(rate * (self.total - done)))
        values = [f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}"
                  for key, value in fields.items()]  # fmt: skip
        line = " | ".join([f"{self.label}: {self.unit} {done}/{self.total}", *values, f"{rate:.3g} s/{self.unit}",
                           f"eta {remaining}"])  # fmt: skip
        print(line, file=self.stream, flush=True)
        return line
