"""Slices (klstudy.train.slices): when a training job stops before its time limit, and what happens next.

The whole path, a cell that needs three slices of a short partition under a real SLURM, is in test_slurm.py; the
stop and resume of a real training run on the CPU in test_trainer.py.
"""

import json
import time
from types import SimpleNamespace

import pytest
import yaml
from workflow_helpers import ROOT

from klstudy.train import slices


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1-02:03:04", 93784), ("02:03:04", 7384), ("3:04", 184), ("0:00", 0), ("UNLIMITED", None), ("NOT_SET", None),
     ("INVALID", None), ("", None)],
)  # fmt: skip
def test_squeue_time_left_in_seconds(text, seconds):
    assert slices.time_left(text) == seconds


def test_the_job_end_comes_from_the_variable_else_from_squeue_else_nothing():
    assert slices.job_end({"KLSTUDY_JOB_END": "1234.5", "SLURM_JOB_ID": "7"}) == 1234.5
    assert slices.job_end({}) is None
    asked = []

    def squeue(command, **_):
        asked.append(command)
        return SimpleNamespace(stdout="1:00:00\n", returncode=0)

    end = slices.job_end({"SLURM_JOB_ID": "42"}, run=squeue)
    assert asked == [["squeue", "-h", "-j", "42", "-o", "%L"]]
    assert 3590 < end - time.time() <= 3600
    unlimited = SimpleNamespace(stdout="UNLIMITED", returncode=0)
    assert slices.job_end({"SLURM_JOB_ID": "42"}, run=lambda *a, **k: unlimited) is None
    answers = [SimpleNamespace(stdout="", returncode=1), SimpleNamespace(stdout="10:00", returncode=0)]
    end = slices.job_end({"SLURM_JOB_ID": "42"}, run=lambda *a, **k: answers.pop(0), pause=0)  # asked again
    assert 590 < end - time.time() <= 600
    refused = SimpleNamespace(stdout="", returncode=1)
    assert slices.job_end({"SLURM_JOB_ID": "42"}, run=lambda *a, **k: refused, pause=0) is None


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _step(callback, clock, seconds, global_step):
    clock.now += seconds
    state, control = SimpleNamespace(global_step=global_step), SimpleNamespace(should_save=False,
                                                                               should_training_stop=False)  # fmt: skip
    callback.on_step_end(None, state, control)
    return control


def test_it_stops_when_the_reserve_and_twice_the_longest_step_no_longer_fit():
    clock = Clock()
    # The job ends at 1000 s; 100 s reserved; steps of 2 optimiser updates, 10 steps planned.
    callback = slices.StopBeforeTimeLimit(end=1000, reserve=100, updates_per_batch=2, steps=10, clock=clock)
    callback.on_train_begin(None, None, None)
    assert not _step(callback, clock, 50, 1).should_save  # mid-batch: never
    control = _step(callback, clock, 50, 2)  # step 1 took 100 s: 900 s left > 100 + 200
    assert not control.should_training_stop and callback.stopped_at is None
    control = _step(callback, clock, 300, 4)  # step 2 took 300 s: 600 s left, not > 100 + 600
    assert control.should_save and control.should_training_stop and callback.stopped_at == 2
    clock.now += 40
    callback.on_save(None, None, None)
    record = callback.record()
    assert record == {"step": 2, "seconds_left": 560, "reserve_seconds": 100, "longest_step_seconds": 300,
                      "checkpoint_seconds": 40}  # fmt: skip


def test_the_last_step_is_never_cut():
    clock = Clock()
    callback = slices.StopBeforeTimeLimit(end=10, reserve=100, updates_per_batch=1, steps=1, clock=clock)
    callback.on_train_begin(None, None, None)
    assert not _step(callback, clock, 5, 1).should_training_stop


def _mark(tmp_path):
    slices.mark_slice_end(tmp_path, {"step": 3, "seconds_left": 61.0})


def test_next_slice_does_nothing_for_a_finished_cell(tmp_path):
    assert slices.next_slice(tmp_path, env={"SLURM_JOB_ID": "5"}, run=None, wait=0) == 0


def test_next_slice_requeues_the_job_and_waits_to_be_ended(tmp_path, capsys):
    _mark(tmp_path)
    calls = []
    requeue = lambda command, **_: calls.append(command) or SimpleNamespace(returncode=0, stderr="")  # noqa: E731
    # Never 0: had SLURM not ended the job, it must not end as a success without its outputs.
    assert slices.next_slice(tmp_path, env={"SLURM_JOB_ID": "5"}, run=requeue, wait=0) == 5
    assert calls == [["scontrol", "requeue", "5"]]
    assert "stopped after step 3 with 61.0 s left; requeueing job 5" in capsys.readouterr().out
    calls.clear()  # on the other nodes of a job, the first task alone requeues
    assert slices.next_slice(tmp_path, env={"SLURM_JOB_ID": "5", "SLURM_PROCID": "1"}, run=requeue, wait=0) == 5
    assert calls == []


def test_next_slice_fails_naming_the_flag_when_the_job_cannot_be_requeued(tmp_path, capsys):
    _mark(tmp_path)
    refused = lambda command, **_: SimpleNamespace(returncode=1, stderr="Requested operation is disabled")  # noqa: E731
    assert slices.next_slice(tmp_path, env={"SLURM_JOB_ID": "5"}, run=refused, wait=0) == 4
    assert "slurm-requeue: true" in capsys.readouterr().err


def test_next_slice_outside_slurm_says_to_run_again(tmp_path, capsys):
    _mark(tmp_path)
    assert slices.next_slice(tmp_path, env={}, run=None, wait=0) == 3
    assert "run the workflow again" in capsys.readouterr().err
    assert json.loads((tmp_path / slices.SLICE_ENDED).read_text())["step"] == 3  # kept for the next run to clear


def test_the_profile_submits_requeueable_jobs():
    profile = yaml.safe_load((ROOT / "slurm" / "profile.yaml").read_text())
    assert profile["slurm-requeue"] is True
