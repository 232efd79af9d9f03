"""Slices (klstudy.train.slices): SLURM's warning before a training job's time limit, and what the job does next.

The whole path, a cell that needs several slices of a short time limit under a real SLURM, is in test_slurm.py; the
stop and resume of a real training run on the CPU in test_trainer.py.
"""

import os
import re
import signal
import subprocess
from types import SimpleNamespace

import pytest
import yaml
from test_workflow import training_sbatch
from workflow_helpers import ROOT

from klstudy.train import slices


def _step(callback, global_step):
    state, control = SimpleNamespace(global_step=global_step), SimpleNamespace(should_save=False,
                                                                               should_training_stop=False)  # fmt: skip
    callback.on_step_end(None, state, control)
    return control


def test_it_stops_at_the_end_of_the_first_whole_step_after_the_signal():
    warned = []
    callback = slices.StopOnSignal(updates_per_batch=2, steps=10, is_signalled=lambda: bool(warned))
    assert not _step(callback, 2).should_save  # step 1, no warning yet
    warned.append(True)
    assert not _step(callback, 3).should_save  # mid-batch: never (checkpoints fall after whole batches)
    control = _step(callback, 4)
    assert control.should_save and control.should_training_stop and callback.stopped_at == 2


def test_the_last_step_is_never_cut():
    callback = slices.StopOnSignal(updates_per_batch=1, steps=1, is_signalled=lambda: True)
    assert not _step(callback, 1).should_training_stop


def test_the_handler_records_slurms_signal(monkeypatch):
    monkeypatch.setattr(slices, "_received", {"signal": False})
    previous = signal.getsignal(signal.SIGUSR1)
    try:
        slices.install()
        assert not slices.signalled()
        os.kill(os.getpid(), signal.SIGUSR1)
        assert slices.signalled()
    finally:
        signal.signal(signal.SIGUSR1, previous)


@pytest.fixture(scope="module")
def paper_training_job(tmp_path_factory):
    return training_sbatch(tmp_path_factory.mktemp("paper"))


def test_a_training_job_asks_slurm_for_the_warning_its_reserve_before_the_limit(paper_training_job):
    """--signal=USR1@N without B: (every job step, not the plugin's batch shell, which cannot trap it)."""
    words, _, _ = paper_training_job
    minutes = yaml.safe_load((ROOT / "config/paper.yaml").read_text())["cluster"]["save_before_limit_minutes"]
    assert f"--signal=USR1@{60 * minutes}" in words, words


def _requeue_shell(dry_run: str) -> str:
    """The part of the training job's shell after the trainer: from the slice mark's test to its `fi`."""
    return re.search(r"(if \[ -e \S+/" + re.escape(slices.SLICE_ENDED) + r" \]; then .*; fi); \}", dry_run).group(1)


@pytest.mark.parametrize("sliced", [True, False])
def test_the_job_requeues_itself_when_the_trainer_left_the_slice_mark(paper_training_job, tmp_path, sliced):
    """With the mark, `scontrol requeue $SLURM_JOB_ID` and a wait that never ends as a success (SLURM ends the run);
    without it, nothing; outside SLURM, a failure saying to run the workflow again."""
    _, _, dry_run = paper_training_job
    checkpoints = re.search(r"if \[ -e (\S+)/", _requeue_shell(dry_run)).group(1).strip("'")
    shell = _requeue_shell(dry_run).replace(checkpoints, str(tmp_path))
    if sliced:
        slices.mark_slice_end(tmp_path, 3)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("scontrol", "sleep"):  # record the call, wait for nothing
        (bin_dir / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {tmp_path}/calls\n')
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "42"}
    run = subprocess.run(["bash", "-euo", "pipefail", "-c", shell], env=env, capture_output=True, text=True)
    calls = (tmp_path / "calls").read_text().splitlines() if (tmp_path / "calls").exists() else []
    if not sliced:
        assert (run.returncode, calls) == (0, [])
        return
    assert run.returncode == 75 and calls == ["scontrol requeue 42", "sleep 300"], (run, calls)
    assert "slice: requeueing job 42" in run.stdout
    env.pop("SLURM_JOB_ID")
    run = subprocess.run(["bash", "-euo", "pipefail", "-c", shell], env=env, capture_output=True, text=True)
    assert run.returncode == 75 and "run the workflow again" in run.stderr


def test_the_profile_submits_requeueable_jobs():
    profile = yaml.safe_load((ROOT / "slurm" / "profile.yaml").read_text())
    assert profile["slurm-requeue"] is True


def test_a_cell_resumes_only_with_the_settings_its_checkpoints_were_trained_with(tmp_path):
    """Each slice reads the config again: one edited while the grid runs must not change a cell halfway. A change of
    an operational key (checkpoint_every) resumes; of a training key, the job fails naming it (a config refused)."""
    from klstudy.config import cell_settings, load_schema, validate_config
    from klstudy.run import failures
    from klstudy.train.cell import check_trained_with

    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    validate_config(config, load_schema(ROOT / "workflow/schemas/config.schema.yaml"))
    cell = cell_settings(config, "onpolicy", "tiny", "k1-reward", 0.1, 0)
    check_trained_with(cell, tmp_path, resuming=False, write=True)  # a fresh run records them
    cell["train"]["checkpoint_every"] += 1
    check_trained_with(cell, tmp_path, resuming=True, write=True)
    cell["train"]["learning_rate"] *= 2
    cell["health"]["max_kl"] += 1
    with pytest.raises(SystemExit) as refused:
        check_trained_with(cell, tmp_path, resuming=True, write=True)
    said = str(refused.value)
    assert "config key health.max_kl, train.learning_rate changed since" in said and f"delete {tmp_path}" in said
    assert failures.classify(said)[:2] == ("deterministic", "a config refused"), said
    check_trained_with(cell, tmp_path, resuming=False, write=True)  # a fresh run (checkpoints deleted) starts over
    check_trained_with(cell, tmp_path, resuming=True, write=False)
