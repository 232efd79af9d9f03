"""`klstudy status`: where the grid stands, from its files alone (no Snakemake, no scheduler, no torch), so safe on a
login node while SLURM runs the grid. The states: docs/running.md, **Where it stands**.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

from klstudy.config import (
    CHECKPOINT_COMPLETE,
    RUN_DIR,
    RUN_PATH,
    SLICE_ENDED,
    all_cells,
    checkpoints,
    divergence_targets,
    evaluation_targets,
    figure_targets,
)

STATES = ("ok", "collapsed", "diverged", "running", "failed", "missing")
# Lines of a job log that say it failed: Python's traceback, torchrun's report of a killed process, bash's.
ERROR_MARKERS = ("Traceback (most recent call last)", "ChildFailedError", "Signal 9 (SIGKILL)", "Killed")
LOG_TAIL_BYTES = 64 * 1024
COLUMNS = ("kind", "name", "state", "step", "steps", "age_s", "detail")


def _tail(path: Path, size: int = LOG_TAIL_BYTES) -> list[str]:
    """The last lines of a file (at most ``size`` bytes of it: logs and metrics can be long)."""
    with open(path, "rb") as handle:
        handle.seek(max(0, path.stat().st_size - size))
        return handle.read().decode("utf-8", errors="replace").splitlines()


def _last_metrics_step(path: Path) -> int | None:
    for line in reversed(_tail(path, 8192) if path.is_file() else []):
        try:
            return json.loads(line)["step"]
        except (ValueError, KeyError):
            continue  # a line cut while it was being written
    return None


def _last_checkpoint_step(checkpoint_dir: Path, updates_per_batch: int) -> int | None:
    """The training step of the newest complete checkpoint (CHECKPOINT_COMPLETE marks it)."""
    steps = [step for step, path in checkpoints(checkpoint_dir) if (path / CHECKPOINT_COMPLETE).exists()]
    return max(steps) // updates_per_batch if steps else None


def _error(log: Path) -> str | None:
    """The last line of the log that says the job failed (its exception, or a kill), if any."""
    lines = _tail(log) if log.is_file() else []
    if not any(marker in line for line in lines for marker in ERROR_MARKERS):
        return None
    reasons = [line.strip() for line in lines if line.strip() and not line.startswith((" ", "\t"))]
    return next((line for line in reversed(reasons) if "Error" in line or "Signal" in line or "Killed" in line),
                reasons[-1] if reasons else "error")  # fmt: skip


def cell_row(config: dict, cell: dict, root: Path, now: float) -> dict:
    """The state of one cell from its files under ``root`` (the workflow's working directory)."""
    train = config["studies"][cell["study"]]["train"]
    name = RUN_PATH.format(**cell)
    run_dir, log = root / RUN_DIR.format(**cell), root / "logs" / "train" / f"{name}.log"
    row = dict(kind="cell", name=name, state="missing", step="", steps=train["steps"], age_s="", detail="")
    summary = run_dir / "summary.json"
    if summary.is_file():
        recorded = json.loads(summary.read_text())
        return row | dict(state=recorded["status"], step=recorded["steps_done"], detail=recorded.get("reason", ""),
                          age_s=round(now - summary.stat().st_mtime))  # fmt: skip
    metrics = run_dir / "metrics.jsonl"
    updates_per_batch = train["batch_prompts"] // train["minibatch_prompts"]
    last_checkpoint = _last_checkpoint_step(root / "results" / "checkpoints" / name, updates_per_batch)
    done = [step for step in (_last_metrics_step(metrics), last_checkpoint) if step is not None]
    written = [path.stat().st_mtime for path in (metrics, log) if path.is_file()]
    if not written and not done:
        return row
    row.update(step=max(done, default=0), age_s=round(now - max(written, default=now)))
    error = _error(log)
    if error:
        return row | dict(state="failed", detail=error)
    sliced = root / "results" / "checkpoints" / name / SLICE_ENDED
    if sliced.is_file():  # its job requeued itself: the next slice starts when SLURM runs it again
        step = json.loads(sliced.read_text()).get("step")
        return row | dict(state="running", detail=f"between slices (stopped after step {step}, requeued)")
    return row | dict(state="running")


def outputs_row(kind: str, paths: list[str], root: Path) -> dict:
    done = sum((root / path).exists() for path in paths)
    state = "ok" if done == len(paths) else "running" if done else "missing"
    return dict(kind=kind, name=kind, state=state, step=done, steps=len(paths), age_s="", detail="")


def grid_status(config: dict, root: Path = Path("."), now: float | None = None) -> list[dict]:
    """Every cell's row, then one row each for the evaluations, the Fig. 12 tables and the figures and tables."""
    now = time.time() if now is None else now
    cells = [cell_row(config, cell, Path(root), now) for cell in all_cells(config)]
    outputs = [
        outputs_row("evaluations", evaluation_targets(config), Path(root)),
        outputs_row("divergence", divergence_targets(config), Path(root)),
        outputs_row("figures", figure_targets(config), Path(root)),
    ]
    return cells + outputs


def _age(seconds) -> str:
    if seconds == "":
        return ""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds}s"


def report(config: dict, root: Path, form: str = "table") -> str:
    """`klstudy status`: every row as CSV, or the cells as a table followed by the counts and the other rows."""
    rows = grid_status(config, root)
    if form == "csv":
        import pandas as pd

        return pd.DataFrame(rows, columns=COLUMNS).to_csv(index=False, lineterminator="\n").rstrip("\n")
    cells = [row for row in rows if row["kind"] == "cell"]
    lines = [("cell", "state", "step", "age", "detail")]
    lines += [(row["name"], row["state"], f"{row['step']}/{row['steps']}" if row["step"] != "" else "",
               _age(row["age_s"]), row["detail"]) for row in cells]  # fmt: skip
    widths = [max(len(line[i]) for line in lines) for i in range(4)]
    text = [" ".join(map(str.ljust, line[:4], widths)) + f" {line[4]}" for line in lines]
    counts = Counter(row["state"] for row in cells)
    text += ["", f"cells: {len(cells)}, " + ", ".join(f"{counts[state]} {state}" for state in STATES if counts[state])]
    text += [f"{row['kind']}: {row['step']}/{row['steps']} done" for row in rows if row["kind"] != "cell"]
    return "\n".join(line.rstrip() for line in text)
