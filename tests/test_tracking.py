"""Experiment tracking of a cell (tracking.py): TensorBoard and W&B (offline) receive every step once, a resumed job
continues the same run, tracking changes nothing that is trained, and a tracker that cannot start fails the job."""

import glob
import json
import os
import shutil
import signal
import subprocess

import pytest
from test_trainer import _cell, _command, _env
from workflow_helpers import validated_cell

from klstudy.data import staging
from klstudy.progress import Progress
from klstudy.train.cell import MEASURED_COLUMNS

pytestmark = pytest.mark.workflow  # the end-to-end workflow tier: `make test-workflow` (docs/testing.md)

STEPS, KILL_AT = 6, 5  # checkpoints every 2 steps: the resumed job starts at step 4 and redoes step 5


def _run(model_dir, data_dir, tmp_path, name, report_to, kill_at=None, extra_env=None):
    """The cell of study ``name`` (its run: name/tiny/k1-loss/beta~0.1/seed~0); the same training whatever the name."""
    cell = validated_cell(dict(_cell(steps=STEPS)["train"], report_to=report_to, delete_checkpoints=False), study=name)
    env = {**_env(), "WANDB_MODE": "offline", **(extra_env or {})}
    if kill_at:
        env["KLSTUDY_KILL_AT_STEP"] = str(kill_at)
    command = _command(model_dir, data_dir, tmp_path / name, tmp_path / f"{name}-ckpt", cell)
    return subprocess.run(command, env=env, capture_output=True, text=True, cwd=tmp_path)


def _rows(path):
    return [{k: v for k, v in row.items() if k not in MEASURED_COLUMNS} for row in staging.read_jsonl(path)]


def _scalars(event_dir):
    """{tag: [(step, value)]} as TensorBoard shows them (its own reader, which applies purges)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(event_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_tensorboard_holds_every_step_and_tracking_changes_nothing_trained(model_dir, data_dir, tmp_path):
    assert _run(model_dir, data_dir, tmp_path, "untracked", "none").returncode == 0
    assert _run(model_dir, data_dir, tmp_path, "tracked", ["tensorboard"]).returncode == 0
    assert _rows(tmp_path / "tracked" / "metrics.jsonl") == _rows(tmp_path / "untracked" / "metrics.jsonl")
    scalars = _scalars(tmp_path / "tracking" / "tensorboard" / "tracked/tiny/k1-loss/beta~0.1/seed~0")
    metrics = staging.read_jsonl(tmp_path / "tracked" / "metrics.jsonl")
    for column in ("task_reward", "kl_k1", "kl_k3", "loss", "entropy"):
        assert [step for step, _ in scalars[f"train/{column}"]] == list(range(1, STEPS + 1))
        assert [value for _, value in scalars[f"train/{column}"]] == pytest.approx([row[column] for row in metrics])
    heldout = staging.read_jsonl(tmp_path / "tracked" / "heldout.jsonl")
    assert scalars["heldout/pass_at_1"] == [(row["step"], pytest.approx(row["pass_at_1"])) for row in heldout]
    assert not (tmp_path / "tracking" / "tensorboard" / "untracked/tiny/k1-loss/beta~0.1/seed~0").exists()


def _wandb_history(wandb_dir, pattern="offline-run-*"):
    """{run id: [step of every history record]} over offline run directories, read from W&B's own files."""
    from wandb.proto import wandb_internal_pb2

    history = {}
    for path in sorted(glob.glob(f"{wandb_dir}/{os.path.basename(pattern)}/run-*.wandb")):
        for payload in _wandb_records(path):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(payload)
            if record.WhichOneof("record_type") == "history":
                history.setdefault(os.path.basename(path)[4:-6], []).append(record.history.step.num)
    return history


def _wandb_records(path, block=32768):
    """The records of a .wandb file: a 7-byte header, then LevelDB's log format (blocks of 32 KiB; each record a
    7-byte header of checksum, length and kind: 1 full, 2 first, 3 middle, 4 last)."""
    raw, position, pending = open(path, "rb").read(), 7, b""
    while position + 7 <= len(raw):
        if block - position % block < 7:  # the block's tail is padding
            position += block - position % block
            continue
        length, kind = int.from_bytes(raw[position + 4 : position + 6], "little"), raw[position + 6]
        if kind == 0:
            break
        pending += raw[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            yield pending
            pending = b""


def test_a_killed_and_resumed_job_continues_its_wandb_and_tensorboard_runs(model_dir, data_dir, tmp_path):
    killed = _run(model_dir, data_dir, tmp_path, "cell", ["wandb", "tensorboard"], kill_at=KILL_AT)
    assert killed.returncode == -signal.SIGKILL
    first = _wandb_history(tmp_path / "tracking" / "wandb")
    # Written at the checkpoints of steps 2 and 4 (step 0: held-out pass@1 before training); step 5 died in memory.
    assert list(first.values()) == [[0, 1, 2, 3, 4]]
    assert _run(model_dir, data_dir, tmp_path, "cell", ["wandb", "tensorboard"]).returncode == 0
    history = _wandb_history(tmp_path / "tracking" / "wandb")
    assert list(history) == list(first)  # one run id: the resumed job continued the killed job's run
    assert sorted(history[next(iter(history))]) == list(range(STEPS + 1))  # each step exactly once
    assert json.loads((tmp_path / "cell-ckpt" / "tracking.json").read_text())["wandb"]["id"] == next(iter(history))
    # TensorBoard's run goes on too: its reader applies the purge of the steps the killed job wrote after step 4
    scalars = _scalars(tmp_path / "tracking" / "tensorboard" / "cell/tiny/k1-loss/beta~0.1/seed~0")
    metrics = staging.read_jsonl(tmp_path / "cell" / "metrics.jsonl")
    assert [step for step, _ in scalars["train/kl_k3"]] == list(range(1, STEPS + 1))
    assert [value for _, value in scalars["train/kl_k3"]] == pytest.approx([row["kl_k3"] for row in metrics])


@pytest.mark.slow  # 50 s: `make test-all` (CI's time); a killed and resumed W&B run is tested above
def test_steps_lost_between_a_checkpoint_and_its_wandb_flush_are_sent_again_from_the_metrics(
    model_dir, data_dir, tmp_path
):
    """A kill after checkpoint 4 was marked complete but before W&B wrote steps 3-4: the resumed job sends them."""
    assert _run(model_dir, data_dir, tmp_path, "cell", ["wandb"], kill_at=KILL_AT).returncode == -signal.SIGKILL
    for run_dir in glob.glob(str(tmp_path / "tracking" / "wandb" / "offline-run-*")):
        if 3 in next(iter(_wandb_history(os.path.dirname(run_dir), run_dir).values()), []):
            shutil.rmtree(run_dir)  # W&B never wrote steps 3 and 4 ...
    state = json.loads((tmp_path / "cell-ckpt" / "tracking.json").read_text())
    state["wandb"]["last_step"] = 2  # ... and the state file still says 2
    (tmp_path / "cell-ckpt" / "tracking.json").write_text(json.dumps(state))
    assert sorted(next(iter(_wandb_history(tmp_path / "tracking" / "wandb").values()))) == [0, 1, 2]
    assert _run(model_dir, data_dir, tmp_path, "cell", ["wandb"]).returncode == 0
    history = _wandb_history(tmp_path / "tracking" / "wandb")
    assert len(history) == 1 and sorted(next(iter(history.values()))) == list(range(STEPS + 1))


def test_a_tracker_that_cannot_start_fails_the_job_at_start_saying_how_to_fix_it(model_dir, data_dir, tmp_path):
    env = {"WANDB_MODE": "online", "WANDB_API_KEY": "", "WANDB_BASE_URL": "http://127.0.0.1:9",
           "HOME": str(tmp_path), "WANDB_CONFIG_DIR": str(tmp_path)}  # fmt: skip
    failed = _run(model_dir, data_dir, tmp_path, "cell", ["wandb"], extra_env=env)
    assert failed.returncode == 1
    assert "TrackingError" in failed.stderr and "WANDB_MODE=offline" in failed.stderr
    assert "studies.cell.train.report_to" in failed.stderr
    assert not (tmp_path / "cell" / "metrics.jsonl").exists()  # before the first step


def test_progress_lines_give_the_rate_and_the_time_left(capsys, monkeypatch):
    clock = iter([100.0, 110.0, 115.0, 125.0])
    monkeypatch.setattr("klstudy.progress.time.monotonic", lambda: next(clock))
    progress = Progress("cell", total=10, start=2, every=8.0)
    assert progress.update(4, task_reward=0.25) == "cell: step 4/10 | task_reward 0.25 | 5 s/step | eta 0:00:30"
    assert progress.update(5) is None  # 5 s after the last line: too soon
    assert progress.update(10) == "cell: step 10/10 | 3.12 s/step | eta 0:00:00"  # the last line always
    assert capsys.readouterr().out.count("\n") == 2
