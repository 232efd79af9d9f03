"""Experiment tracking of a training cell: TensorBoard, Weights & Biases or trackio (config ``train.report_to``).

Every tracker receives what metrics.jsonl and heldout.jsonl receive (the same columns, ``train/<column>`` and
``heldout/<column>``) under a run named after the cell (``{study}/{model}/{kl}/beta~{β}/seed~{seed}``), with the
cell's config attached. The x-axis is the optimiser step (with several updates per generation batch the paper's
training step is ``train/step``); held-out pass@1 of training step s goes with optimiser step s × updates.

A job resumed from its checkpoint after a kill or a SLURM time limit continues the same run, each step once:
- TensorBoard: its files are flushed at every step; the resumed writer starts with ``purge_step`` = the first step
  after the checkpoint, so TensorBoard drops what the killed attempt logged after it and shows the resumed values.
- W&B and trackio: the run id is saved beside the checkpoints (``tracking.json``), and the resumed job continues
  that run. W&B writes its files in blocks and loses what a SIGKILL catches in memory (an offline run killed after
  3 steps had an empty file), so at every checkpoint the run is closed and reopened, which writes everything, and
  ``tracking.json`` records the last step known written. A resumed job first sends again, from the restored
  metrics.jsonl, the steps between that one and its checkpoint, then goes on. (Online, steps that the server
  already received from the killed attempt are kept: W&B refuses a step lower than its last.)

Tracking never changes training: it only reads the rows the recorder writes. A tracker that cannot start fails
the job at start (TrackingError, saying how to fix it or turn it off), not hours later. Only the main process
tracks.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import yaml

STATE_FILE = "tracking.json"  # beside the checkpoints: run ids and the last step each tracker has on disk
HELDOUT_COLUMNS = ("pass_at_1", "stderr")


class TrackingError(RuntimeError):
    """A tracker could not start; the message says how to fix it or turn it off."""


def _fix(name: str, study: str) -> str:
    return f"or remove {name!r} from studies.{study}.train.report_to (e.g. report_to: [tensorboard], or none)"


def step_values(row: dict | None, heldout: dict | None = None) -> dict:
    """What the trackers get for one optimiser step: its metrics.jsonl row and the held-out score of that step."""
    values = {f"train/{key}": value for key, value in (row or {}).items() if key != "optimizer_step"}
    return values | {f"heldout/{key}": heldout[key] for key in HELDOUT_COLUMNS} if heldout else values


class Tracking:
    """The cell's trackers: ``log`` a step, ``checkpoint`` when a checkpoint is complete, ``finish`` at the end."""

    def __init__(self, names, run_name: str, cell: dict, out_dir: Path, state_dir: Path, resume_step: int = 0):
        """``names``: config train.report_to (a name or a list); ``run_name``: the cell's path (RUN_PATH); ``out_dir``:
        results/ (tensorboard/, wandb/ inside); ``state_dir``: the cell's checkpoints; ``resume_step``: the optimiser
        step of the checkpoint resumed from (0: a fresh run)."""
        self.run_name, self.cell, self.out_dir = run_name, cell, Path(out_dir)
        self.state_path = Path(state_dir) / STATE_FILE
        self.state = json.loads(self.state_path.read_text()) if resume_step and self.state_path.is_file() else {}
        self.backends = {}
        for name in [name for name in ([names] if isinstance(names, str) else names) if name != "none"]:
            try:
                self.backends[name] = getattr(self, f"_start_{name}")(resume_step)
            except TrackingError:
                raise
            except Exception as error:  # noqa: BLE001 (each library fails in its own way; all mean "cannot track")
                raise TrackingError(
                    f"train.report_to {name}: the tracker did not start ({error!r}); {_fix(name, cell['study'])}"
                ) from error
        self._save_state()

    # ------------------------------------------------------------------------------------------------ the trackers

    def _start_tensorboard(self, resume_step):
        from torch.utils.tensorboard import SummaryWriter

        purge = resume_step + 1 if resume_step else None  # drop what a killed attempt logged after the checkpoint
        writer = SummaryWriter(str(self.out_dir / "tensorboard" / self.run_name), purge_step=purge)
        config = "```\n" + yaml.safe_dump(self.cell, sort_keys=False) + "```"
        writer.add_text("config", config, global_step=resume_step)
        return writer

    def _start_wandb(self, resume_step):
        import wandb

        settings = self.cell["train"].get("wandb") or {}  # optional: W&B's own environment variables otherwise
        run_id = self.state.get("wandb", {}).get("id") or secrets.token_hex(4)  # W&B's form: 8 lowercase alphanumerics
        try:
            run = wandb.init(
                project=settings.get("project") or os.environ.get("WANDB_PROJECT") or "klstudy",
                entity=settings.get("entity") or os.environ.get("WANDB_ENTITY"),
                name=self.run_name, group=self.cell["study"], tags=[self.cell["model"], self.cell["kl"]],
                config=self.cell, id=run_id, resume="allow", dir=str(self.out_dir), reinit="create_new",
            )  # fmt: skip
        except Exception as error:
            raise TrackingError(
                f"train.report_to wandb: W&B did not start ({error!r}). Log in (`wandb login`, or WANDB_API_KEY); "
                "on compute nodes without network set WANDB_MODE=offline, and later "
                f"`wandb sync {self.out_dir}/wandb/offline-run-*`; " + _fix("wandb", self.cell["study"])
            ) from error
        self.state.setdefault("wandb", {"last_step": -1})["id"] = run.id
        return run

    def _start_trackio(self, resume_step):
        try:
            import trackio
        except ImportError as error:
            raise TrackingError(
                "train.report_to trackio: the trackio package is not installed (pip install trackio); "
                + _fix("trackio", self.cell["study"])
            ) from error
        project = (self.cell["train"].get("trackio") or {}).get("project") or "klstudy"
        run = trackio.init(project=project, name=self.run_name, config=self.cell, resume="allow")
        self.state.setdefault("trackio", {"last_step": -1})["id"] = self.run_name
        return run

    # ------------------------------------------------------------------------------------------------ logging

    def log(self, values: dict, step: int) -> None:
        for name, backend in self.backends.items():
            if name == "tensorboard":
                for key, value in values.items():
                    backend.add_scalar(key, value, global_step=step)
                backend.flush()
            elif step > self.state[name]["last_step"]:  # never a step the run already has on disk
                backend.log(values, step=step)

    def replay(self, history: list[dict], heldout: list[dict], updates_per_batch: int, upto: int) -> None:
        """After a resume: send the W&B / trackio runs the steps up to ``upto`` (the checkpoint's optimiser step) that
        they may have lost in the kill, from the restored metrics.jsonl and heldout.jsonl rows."""
        heldout_at = {row["step"] * updates_per_batch: row for row in heldout}
        rows = {0: None} | {row["optimizer_step"]: row for row in history}
        for name, backend in self.backends.items():
            if name == "tensorboard":
                continue  # flushed at every step: it has them all
            for step in sorted(rows):
                if self.state[name]["last_step"] < step <= upto and (rows[step] or step in heldout_at):
                    backend.log(step_values(rows[step], heldout_at.get(step)), step=step)

    def checkpoint(self, step: int) -> None:
        """A checkpoint at optimiser ``step`` is complete: make every step so far durable, and record it."""
        for name in [name for name in self.backends if name != "tensorboard"]:
            self.backends[name].finish()  # writes what W&B holds in memory; reopening continues the same run
            self.backends[name] = getattr(self, f"_start_{name}")(step)
            self.state[name]["last_step"] = step
        self._save_state()

    def finish(self, step: int | None = None) -> None:
        for name, backend in self.backends.items():
            if name == "tensorboard":
                backend.close()
            else:
                backend.finish()
                if step is not None:
                    self.state[name]["last_step"] = step
        self._save_state()

    def _save_state(self) -> None:
        if self.state:
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
            self.state_path.write_text(json.dumps(self.state) + "\n")
