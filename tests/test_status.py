"""`klstudy status` on fixture trees: every state a cell can be in, read from files alone."""

import csv
import io
import json
import os
import subprocess
import sys
import time

import yaml
from workflow_helpers import ROOT, reduced_config

from klstudy.config import validate_config
from klstudy.run import status

NOW = time.time()


def _config():
    config = reduced_config()
    config["studies"]["onpolicy"].update(kl=["none", "k1-reward", "k1-loss", "k3-reward", "k3-loss"], betas=[0.1])
    return validate_config(config)


def _write(path, text, age=0.0):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (NOW - age, NOW - age))


def _tree(root):
    """onpolicy none: ok; k1-reward: collapsed; k1-loss: diverged; k3-reward: running (metrics line 1 of 2, 90 s
    ago); k3-loss: failed (its log ends in a traceback; a complete checkpoint at step 2 remains); offpolicy: missing."""
    runs, logs = root / "results" / "runs" / "onpolicy" / "tiny", root / "logs" / "train" / "onpolicy" / "tiny"
    for kl, beta, recorded, reason in (("none", 0, "ok", ""), ("k1-reward", 0.1, "collapsed", "task reward fell"),
                                       ("k1-loss", 0.1, "diverged", "KL 2e3 > max_kl 1000 at step 1")):  # fmt: skip
        summary = {"status": recorded, "reason": reason, "steps_done": 2 if recorded == "ok" else 1}
        _write(runs / kl / f"beta~{beta}/seed~0/summary.json", json.dumps(summary))
    _write(runs / "k3-reward/beta~0.1/seed~0/metrics.jsonl", '{"step": 1, "task_reward": 0.5}\n{"step": 2, "tas', 90)
    _write(logs / "k3-reward/beta~0.1/seed~0.log", "onpolicy/tiny/k3-reward: step 1/2 | 1.2 s/step | eta 0:00:01\n", 95)
    traceback = 'Traceback (most recent call last):\n  File "x.py", line 1\nRuntimeError: CUDA out of memory\n'
    _write(logs / "k3-loss/beta~0.1/seed~0.log", "step 3/2\n" + traceback, 30)
    _write(root / "results/checkpoints/onpolicy/tiny/k3-loss/beta~0.1/seed~0/checkpoint-2/klstudy_complete", "")
    _write(root / "results/checkpoints/onpolicy/tiny/k3-loss/beta~0.1/seed~0/checkpoint-3/trainer_state.json", "{}")
    config = _config()
    for path in status.evaluation_targets(config)[:3] + status.figure_targets(config):
        _write(root / path, "")


def test_every_state_of_a_cell_is_told_from_its_files(tmp_path):
    _tree(tmp_path)
    rows = {row["name"]: row for row in status.grid_status(_config(), tmp_path, now=NOW)}
    assert rows["onpolicy/tiny/none/beta~0/seed~0"] | {"age_s": 0} == dict(
        kind="cell", name="onpolicy/tiny/none/beta~0/seed~0", state="ok", step=2, steps=2, age_s=0, detail=""
    )
    assert rows["onpolicy/tiny/k1-reward/beta~0.1/seed~0"]["state"] == "collapsed"
    assert rows["onpolicy/tiny/k1-loss/beta~0.1/seed~0"]["detail"].startswith("KL 2e3")
    running = rows["onpolicy/tiny/k3-reward/beta~0.1/seed~0"]
    assert (running["state"], running["step"], running["age_s"]) == ("running", 1, 90)  # the cut line is skipped
    failed = rows["onpolicy/tiny/k3-loss/beta~0.1/seed~0"]
    assert (failed["state"], failed["step"]) == ("failed", 2)  # the partial checkpoint-3 does not count
    assert failed["detail"] == "RuntimeError: CUDA out of memory"
    assert rows["offpolicy_k1_loss/tiny/k1-loss/beta~0.1/seed~0"]["state"] == "missing"
    assert (rows["evaluations"]["step"], rows["evaluations"]["steps"]) == (3, len(status.evaluation_targets(_config())))
    assert rows["figures"]["state"] == "ok" and rows["divergence"]["state"] == "missing"


def test_a_retried_job_whose_new_log_has_no_error_is_running_again(tmp_path):
    _tree(tmp_path)
    log = tmp_path / "logs/train/onpolicy/tiny/k3-loss/beta~0.1/seed~0.log"
    _write(log, "onpolicy/tiny/k3-loss/beta~0.1/seed~0: step 3/2 | 1 s/step | eta 0:00:00\n")
    rows = {row["name"]: row for row in status.grid_status(_config(), tmp_path, now=NOW)}
    assert rows["onpolicy/tiny/k3-loss/beta~0.1/seed~0"]["state"] == "running"


def test_a_cell_whose_job_requeued_itself_is_between_slices(tmp_path):
    """The checkpoint directory holds slice-ended.json (slices.py): the job requeued itself."""
    _tree(tmp_path)
    cell = "onpolicy/tiny/k3-reward/beta~0.1/seed~0"
    mark = {"step": 1}
    _write(tmp_path / "results/checkpoints" / cell / status.SLICE_ENDED, json.dumps(mark))
    row = {row["name"]: row for row in status.grid_status(_config(), tmp_path, now=NOW)}[cell]
    assert (row["state"], row["detail"]) == ("running", "between slices (stopped after step 1, requeued)")


def test_the_command_prints_a_table_and_csv(tmp_path):
    _tree(tmp_path)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(_config()))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}

    def klstudy(*args):
        command = [sys.executable, "-m", "klstudy", "status", "--config", str(tmp_path / "config.yaml"), *args]
        return subprocess.run(command, env=env, cwd=tmp_path, check=True, capture_output=True, text=True).stdout

    table = klstudy()
    assert "cells: 6, 1 ok, 1 collapsed, 1 diverged, 1 running, 1 failed, 1 missing" in table
    assert "onpolicy/tiny/k3-reward/beta~0.1/seed~0" in table and "1/2" in table and "CUDA out of memory" in table
    assert f"figures: {len(status.figure_targets(_config()))}/{len(status.figure_targets(_config()))} done" in table
    rows = list(csv.DictReader(io.StringIO(klstudy("--format", "csv"))))
    assert [row["state"] for row in rows if row["kind"] == "cell"].count("missing") == 1
    assert {row["kind"] for row in rows} == {"cell", "evaluations", "divergence", "figures"}
